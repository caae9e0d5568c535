"""Reasoning mode on the tiny model with a (random) adapter: one shared prefill, budget cut, think longer."""
import pytest

from core.config import SamplingConfig
from core.events import TokenEvent
from core.prompting.prompts import reasoning_system
from tests.tiny import make_reasoning_engine

GREEDY = SamplingConfig(temperature=0, repetition_penalty=1.0, max_tokens=20)


@pytest.fixture(scope="module")
def reasoning_engine():
    return make_reasoning_engine()


def count_forward_tokens(model):
    counter = {"tokens": 0}

    def hook(module, args, kwargs):
        ids = kwargs.get("input_ids")
        counter["tokens"] += ids.shape[1] if ids is not None else 0

    handle = model.get_base_model().model.register_forward_pre_hook(hook, with_kwargs=True)
    return counter, handle


def test_budget_cuts_the_trace_and_forces_the_answer(reasoning_engine):
    events = list(reasoning_engine.stream("What is 17*23?", GREEDY, mode="reason", budget=8, answer_max_tokens=5))
    answer = events[-1].answer
    thinking = [e for e in events if isinstance(e, TokenEvent) and e.kind == "thinking"]
    assert answer.route.reason and answer.route.source == "mode" and answer.adapter == "reason"
    assert answer.thinking_tokens <= 8 and answer.budget == 8
    if answer.budget_forced:  # the random adapter almost never writes </think> by itself
        assert answer.text.startswith("Final answer: ")
        assert answer.answer_tokens <= 5
    assert "".join(e.text for e in thinking) == answer.thinking


def test_one_prefill_serves_the_whole_request(reasoning_engine):
    counter, handle = count_forward_tokens(reasoning_engine.model)
    try:
        answer = reasoning_engine.generate("hello there", GREEDY, mode="reason", budget=6, answer_max_tokens=4)
    finally:
        handle.remove()
    prompt = answer.stats.prompt_tokens
    markers = reasoning_engine.markers
    forced = len(markers.think_open) + (len(markers.forced_close) if answer.text.startswith("Final answer: ") else 0)
    # prompt once + forced markers + every generated token except the last: nothing is re-encoded
    assert counter["tokens"] == prompt + forced + answer.stats.completion_tokens - 1


def test_reasoning_starts_from_the_prefill_logits(reasoning_engine):
    """`<think>\\n` is encoded in the base prefill: the first thinking token needs no adapter forward pass."""
    counter, handle = count_forward_tokens(reasoning_engine.model)
    calls = []
    hook = reasoning_engine.model.get_base_model().model.register_forward_pre_hook(
        lambda m, a, kw: calls.append(kw["input_ids"].shape[1]), with_kwargs=True)
    try:
        answer = reasoning_engine.generate("hello there", GREEDY, mode="reason", budget=3, answer_max_tokens=2)
    finally:
        handle.remove()
        hook.remove()
    assert calls[0] == answer.stats.prompt_tokens + len(reasoning_engine.markers.think_open)
    assert calls[1] == 1  # the second thinking token: already a plain decode step


def test_auto_routed_to_base_answers_exactly_like_base_mode(reasoning_engine):
    """Auto prefills `<think>\\n` too; when the switcher says no, the cache is cropped back and the logits
    before `<think>` are used, so the answer is the base mode's, token for token."""
    from core.reasoning.router import Router
    from models.heads import SwitcherHead

    hidden = reasoning_engine.model.config.hidden_size
    reasoning_engine.router = Router(SwitcherHead(hidden), {"threshold": 1.01})  # a probability never reaches it
    try:
        auto = reasoning_engine.generate("What is 3+4?", GREEDY, mode="auto", system="Be brief.")
    finally:
        reasoning_engine.router = None
    assert auto.route.source == "switcher" and not auto.route.reason and auto.route.probability is not None
    # auto states the budget in its system prompt; give base mode the same prompt
    base = reasoning_engine.generate("What is 3+4?", GREEDY, mode="base", system=reasoning_system(256, "Be brief."))
    assert auto.token_ids == base.token_ids and auto.text == base.text


def test_base_mode_never_thinks_and_auto_without_switcher_is_base(reasoning_engine):
    for mode in ("base", "auto"):
        answer = reasoning_engine.generate("hello", GREEDY, mode=mode)
        assert answer.thinking == "" and answer.thinking_tokens == 0 and not answer.route.reason


def test_reason_mode_without_adapter_is_a_clear_error(tiny_engine):
    with pytest.raises(ValueError, match="adapter"):
        tiny_engine.generate("hi", GREEDY, mode="reason")
