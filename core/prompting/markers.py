"""Reasoning markers: the fixed texts around a thinking trace, and their token ids for one tokenizer.

The texts live in resources/prompts/reasoning.json; this module owns their encoded form, so the engine, the
decode loop, training and benchmarks all feed exactly the same ids.
"""
from __future__ import annotations

from dataclasses import dataclass

from core.prompting.prompts import reasoning_prompts


@dataclass(frozen=True)
class ReasoningMarkers:
    think_open: tuple[int, ...]
    """`<think>\\n`: ends the base-model prefill whenever reasoning may follow."""
    think_close: tuple[int, ...]
    """Fed by the engine when it closes a trace itself (budget reached or end-of-turn inside the trace)."""
    close_marker: str
    """`</think>`: when the model writes it, the trace ends and the answer follows."""
    forced_prefix: tuple[int, ...]
    forced_prefix_text: str
    """`Final answer: `: fed after a forced close, so a cut trace still yields an answer."""
    think_longer: tuple[int, ...]
    think_longer_text: str
    """Reopens a trace for "Think longer"."""
    verify: tuple[int, ...]
    """The verification prompt whose last hidden state the verifier scores."""

    @classmethod
    def for_tokenizer(cls, tokenizer) -> ReasoningMarkers:
        p = reasoning_prompts()

        def enc(text: str) -> tuple[int, ...]:
            return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])

        return cls(think_open=enc(p["think_open"]), think_close=enc(p["think_close"]),
                   close_marker=p["think_close_marker"], forced_prefix=enc(p["forced_answer_prefix"]),
                   forced_prefix_text=p["forced_answer_prefix"], think_longer=enc(p["think_longer"]),
                   think_longer_text=p["think_longer"], verify=enc(p["verify_prompt"]))

    @property
    def forced_close(self) -> tuple[int, ...]:
        """What the engine feeds when it closes a trace: the close, then the answer prefix."""
        return self.think_close + self.forced_prefix
