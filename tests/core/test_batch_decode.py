"""Batched greedy evaluation follows the engine's rules: the same answers as one prompt at a time."""
import pytest

from core.config import SamplingConfig
from tests.tiny import make_reasoning_engine

PROMPTS = ["What is 2+2?", "Name three colours of the rainbow, please, in order.", "hi"]
GREEDY = SamplingConfig(temperature=0, repetition_penalty=1.0, max_tokens=12)


@pytest.fixture(scope="module")
def engine():
    return make_reasoning_engine()


@pytest.mark.parametrize("mode,kv", [("base", "bf16"), ("reason", "bf16"), ("reason", "int8")])
def test_batched_greedy_matches_one_at_a_time(engine, mode, kv):
    engine.kv = kv
    batched = engine.generate_batch(PROMPTS, GREEDY, mode=mode, budget=6, answer_max_tokens=5)
    for prompt, got in zip(PROMPTS, batched, strict=True):
        one = engine.generate(prompt, GREEDY, mode=mode, budget=6, answer_max_tokens=5)
        assert got.text == one.text and got.token_ids == one.token_ids
        assert got.thinking == one.thinking and got.thinking_tokens == one.thinking_tokens
        assert got.budget_forced == one.budget_forced and got.answer_tokens == one.answer_tokens
