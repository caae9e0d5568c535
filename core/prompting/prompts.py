"""Prompt texts kept as data in resources/prompts/ (wording changes need no code change)."""
from __future__ import annotations

import json
from functools import lru_cache

from core.prompting.chat_format import DEFAULT_SYSTEM
from core.storage.paths import resource_dir


@lru_cache(maxsize=1)
def reasoning_prompts() -> dict:
    return json.loads((resource_dir() / "prompts" / "reasoning.json").read_text())


def reasoning_system(budget: int | None, base: str = DEFAULT_SYSTEM) -> str:
    """The system prompt of reason/auto requests: Ponder's own plus the budget statement (paper's budget prompts)."""
    if budget:
        return base + " " + reasoning_prompts()["budget_statement"].format(budget=budget)
    return base
