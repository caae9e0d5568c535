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


def test_batched_auto_routes_each_prompt_and_answers_as_one_at_a_time(engine):
    """`auto` in a batch: every prompt keeps the route the switcher gives it alone, and its answer is that route's
    one-at-a-time answer (thinking ones through the adapter, the rest from auto's own prompt)."""
    import torch

    from core.reasoning.router import Router
    from models.heads import SwitcherHead

    engine.kv = "int8"
    torch.manual_seed(3)
    engine.router = Router(SwitcherHead(engine.model.config.hidden_size), {"threshold": 0.5})
    try:
        probs = [engine.route_prompt(p, budget=6).probability for p in PROMPTS]
        engine.router.threshold = sorted(probs)[1]  # the two highest think, the lowest does not
        batched = engine.generate_batch(PROMPTS, GREEDY, mode="auto", budget=6, answer_max_tokens=5)
        alone = [engine.generate(p, GREEDY, mode="auto", budget=6, answer_max_tokens=5) for p in PROMPTS]
    finally:
        engine.router = None
    assert [a.route.reason for a in batched] == [p >= sorted(probs)[1] for p in probs]
    assert sum(a.route.reason for a in batched) == 2
    for got, one in zip(batched, alone, strict=True):
        assert got.route.reason == one.route.reason and got.route.source == "switcher"
        assert got.text == one.text and got.token_ids == one.token_ids and got.thinking == one.thinking
        assert (got.budget is None) == (not got.route.reason)
