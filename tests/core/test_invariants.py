"""The paper's invariants, pinned on the tiny model with a random (non-zero) reasoning adapter.

Each test fails if the property breaks: the adapter never touches prompt tokens, a trace is cut at exactly
its budget and the answer follows the forced close, think longer re-encodes nothing, the verifier scores the
state after the verification prompt and the weighted vote follows it, tokens stream as they are made.
"""
import time

import pytest
import torch

from core.config import SamplingConfig
from core.decode.cache import new_cache
from core.decode.rows import new_row
from core.events import DoneEvent, RouteDecision, TokenEvent
from core.reasoning.verifier import Verifier
from models.heads import VerifierHead
from tests.tiny import make_reasoning_engine

GREEDY = SamplingConfig(temperature=0, repetition_penalty=1.0, max_tokens=20)


@pytest.fixture(scope="module")
def engine():
    return make_reasoning_engine()


class ForwardLog:
    """Records the input ids of every forward pass of the underlying Qwen2 model."""

    def __init__(self, engine):
        self.calls: list[torch.Tensor] = []
        self._handle = engine.model.get_base_model().model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        self.calls.append(kwargs["input_ids"].clone())

    def close(self):
        self._handle.remove()

    def tokens(self) -> int:
        return sum(c.shape[1] for c in self.calls)


def layer_kv(cache, layer: int, upto: int):
    lay = cache.layers[layer]
    return lay.keys[:, :, :upto], lay.values[:, :, :upto]


def test_adapter_is_off_on_every_prompt_token_of_the_real_prefill(engine):
    answer = engine.generate("What is 17*23?", GREEDY, mode="reason", budget=4, answer_max_tokens=2)
    ids = engine.prompt_ids("What is 17*23?", engine._prompt_system("reason", 4))
    n = len(ids) + len(engine.markers.think_open)
    assert answer.stats.prompt_tokens == len(ids)
    engine_cache = engine.last_cache
    x = torch.tensor([ids + list(engine.markers.think_open)])
    with torch.inference_mode():
        with engine.model.disable_adapter():
            base = engine.model(input_ids=x, use_cache=True).past_key_values
        adapted = engine.model(input_ids=x, use_cache=True).past_key_values
    for layer in range(engine.model.config.num_hidden_layers):
        k, v = layer_kv(engine_cache, layer, n)
        bk, bv = layer_kv(base, layer, n)
        assert torch.equal(k, bk) and torch.equal(v, bv)
    ak, _ = layer_kv(adapted, 1, n)
    assert not torch.equal(layer_kv(engine_cache, 1, n)[0], ak)  # the adapter does change them: the check bites


def test_budget_cut_is_exact_and_the_answer_follows_the_forced_close(engine):
    saved = engine.eos_ids
    engine.eos_ids = set()  # no end-of-turn: the trace can only end at its budget (or by </think>)
    log = ForwardLog(engine)
    try:
        answer = engine.generate("Count to ten.", GREEDY, mode="reason", budget=7, answer_max_tokens=3)
    finally:
        log.close()
        engine.eos_ids = saved
    assert answer.budget_forced and answer.thinking_tokens == 7 and answer.budget == 7
    assert answer.text.startswith("Final answer: ") and answer.answer_tokens == 3
    thinking = list(answer.token_ids[:7])
    # prefill, then thinking tokens 2..7 one at a time, then the 7th token with the forced close in one pass
    assert [c.shape[1] for c in log.calls[1:7]] == [1] * 6
    assert log.calls[7][0].tolist() == thinking[-1:] + list(engine.markers.forced_close)
    assert [c[0].tolist() for c in log.calls[1:7]] == [[t] for t in thinking[:6]]


def test_think_longer_continues_on_the_same_cache_without_re_prefill(engine):
    first = engine.generate("What is 2+2?", GREEDY, mode="reason", budget=5, answer_max_tokens=3, trace_key="m1")
    assert engine.has_trace("m1")
    log = ForwardLog(engine)
    try:
        events = list(engine.think_longer("What is 2+2?", first.thinking, trace_key="m1", new_trace_key="m2",
                                          extra_budget=6, budget=5, answer_max_tokens=3, sampling=GREEDY))
    finally:
        log.close()
    more = events[-1].answer
    assert isinstance(events[-1], DoneEvent) and more.resumed == "cache"
    assert more.thinking.startswith(first.thinking + engine.markers.think_longer_text)
    assert more.budget == first.thinking_tokens + len(engine.markers.think_longer) + 6
    assert more.thinking_tokens <= more.budget and more.stats.prompt_tokens == first.stats.prompt_tokens
    # the first pass feeds only the "think longer" opener; nothing of the prompt or the old trace is re-encoded
    assert log.calls[0][0].tolist() == list(engine.markers.think_longer)
    new_tokens = more.thinking_tokens - first.thinking_tokens - len(engine.markers.think_longer)
    forced = len(engine.markers.forced_close) if more.text.startswith("Final answer: ") else 0
    assert log.tokens() == len(engine.markers.think_longer) + new_tokens + forced + more.answer_tokens - 1
    streamed = "".join(e.text for e in events if isinstance(e, TokenEvent) and e.kind == "thinking")
    assert first.thinking + streamed == more.thinking
    assert engine.has_trace("m2") and not engine.has_trace("m1")


def test_think_longer_without_its_trace_rebuilds_from_the_stored_text(engine):
    chat_a = engine.generate("What is 2+2?", GREEDY, mode="reason", budget=5, answer_max_tokens=3, trace_key="a")
    question_b = [{"role": "user", "content": "Name a colour."}]
    thinking_b = "I should name one colour"
    log = ForwardLog(engine)
    try:  # another chat's reply (never decoded here, as after a restart): its own prompt, never chat A's cache
        more = list(engine.think_longer(question_b, thinking_b, trace_key="b", extra_budget=4, budget=5,
                                        answer_max_tokens=2, sampling=GREEDY))[-1].answer
    finally:
        log.close()
    ids_b = engine.prompt_ids(question_b, engine._prompt_system("reason", 5))
    assert more.resumed == "text" and more.stats.prompt_tokens == len(ids_b)
    assert log.calls[0][0].tolist() == ids_b + list(engine.markers.think_open)
    assert more.thinking.startswith(thinking_b + engine.markers.think_longer_text)
    assert engine.has_trace("a") and chat_a.thinking  # chat A's trace is untouched


def test_verifier_scores_the_state_after_the_verification_prompt(engine):
    torch.manual_seed(0)
    engine.verifier = Verifier(VerifierHead(engine.model.config.hidden_size), {"kind": "verifier"})
    log = ForwardLog(engine)
    try:
        answer = list(engine.parallel("What is 2+3?", SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, seed=2,
                                                                     repetition_penalty=1.0),
                                      n=1, budget=4, answer_max_tokens=3))[-1].answer
    finally:
        log.close()
        verifier, engine.verifier = engine.verifier, None
    fed = [t for c in log.calls for t in c[0].tolist()]
    prefill_len = log.calls[0].shape[1]
    assert fed[-len(engine.markers.verify):] == list(engine.markers.verify)
    with torch.inference_mode():  # recompute: base prefill, then everything after it with the adapter on
        with engine.model.disable_adapter():
            out = engine.model(input_ids=torch.tensor([fed[:prefill_len]]), use_cache=True)
        rest = engine.model(input_ids=torch.tensor([fed[prefill_len:]]), cache=out.past_key_values,
                            output_hidden_states=True)
    expected = verifier.scores(rest.hidden_states[-1][:, -1])[0]
    assert answer.candidates[0].score == pytest.approx(expected, abs=0.03)
    assert answer.vote_method == "weighted"


def finished_rows(engine, texts, scores):
    """Finished parallel rows answering `texts`, scored `scores` as a verifier would."""
    rows = []
    for i, (text, score) in enumerate(zip(texts, scores, strict=True)):
        row = new_row(i, engine.tokenizer, engine.markers, GREEDY, reasoning=False, think_limit=0, answer_limit=9)
        for t in engine.tokenizer(text, add_special_tokens=False)["input_ids"]:
            row.answer.push(t)
        row.score, row.phase, row.finish = score, "done", "stop"
        rows.append(row)
    return rows


def test_weighted_vote_follows_the_verifier_where_majority_would_not(engine):
    rows = finished_rows(engine, ["\\boxed{3}", "\\boxed{3}", "\\boxed{5}"], (0.1, 0.2, 0.9))
    answer = engine._combine(rows, [1, 2], RouteDecision(True, None, "mode"), 4, time.perf_counter(), 0)
    assert answer.vote_method == "weighted" and answer.chosen == 2 and answer.text == "\\boxed{5}"
    for row in rows:
        row.score = None
    plain = engine._combine(rows, [1, 2], RouteDecision(True, None, "mode"), 4, time.perf_counter(), 0)
    assert plain.vote_method == "majority" and plain.chosen == 0


def test_a_head_that_records_majority_votes_by_count_and_still_shows_its_scores(engine):
    rows = finished_rows(engine, ["\\boxed{3}", "\\boxed{3}", "\\boxed{5}"], (0.1, 0.2, 0.9))
    saved = engine.verifier
    try:
        engine.verifier = Verifier(VerifierHead(4), {"kind": "verifier", "vote": "majority"})
        answer = engine._combine(rows, [1, 2], RouteDecision(True, None, "mode"), 4, time.perf_counter(), 0)
    finally:
        engine.verifier = saved
    assert answer.vote_method == "majority" and answer.chosen == 0 and answer.text == "\\boxed{3}"
    assert [c.score for c in answer.candidates] == pytest.approx([0.1, 0.2, 0.9])
    assert [(votes, weight) for _, weight, votes in answer.vote_table] == [(2, 2.0), (1, 1.0)]  # the chart's bars count
    with pytest.raises(ValueError, match="vote must be"):
        Verifier(VerifierHead(4), {"kind": "verifier", "vote": "loudest"})


def test_one_parallel_row_is_the_chat_answer_repetition_penalty_included(engine):
    cfg = SamplingConfig(temperature=0, repetition_penalty=1.3, max_tokens=12)
    one = engine.generate("What is 6*7?", cfg, mode="reason", budget=6, answer_max_tokens=5)
    par = list(engine.parallel("What is 6*7?", cfg, n=1, budget=6, answer_max_tokens=5))[-1].answer
    plain = engine.generate("What is 6*7?", SamplingConfig(temperature=0, repetition_penalty=1.0), mode="reason",
                            budget=6, answer_max_tokens=5)
    assert par.candidates[0].thinking == one.thinking and par.text == one.text
    assert one.token_ids != plain.token_ids  # the penalty is applied, not silently dropped


def test_streaming_yields_tokens_as_they_are_made(tiny_engine):
    cfg = SamplingConfig(temperature=0, max_tokens=40, ignore_eos=True)
    list(tiny_engine.stream("hi", SamplingConfig(temperature=0, max_tokens=2)))  # one-time costs out of the timing
    start = time.perf_counter()
    stamps = [time.perf_counter() for e in tiny_engine.stream("hi", cfg) if isinstance(e, TokenEvent)]
    end = time.perf_counter()
    assert len(stamps) >= 10
    # events arrive spread over the generation, not in a burst at the end
    assert stamps[len(stamps) // 2] - start < 0.8 * (end - start)
    assert stamps[-1] - stamps[0] > 0.5 * (end - stamps[0])


@pytest.mark.parametrize("text,exact", [("so it is 7.</think>", True), ("so it is 7 </think>", False)])
def test_a_trace_closed_inside_a_token_is_not_kept(engine, text, exact):
    """When the model closes its trace with a token like " </" (the tiny tokenizer's merge; Qwen's has ".</") the
    cache ends before text the trace shows: that trace is not kept, so think longer rebuilds it from the text
    rather than continue from a different one."""
    from core.decode.rows import _Step

    tok = engine.tokenizer
    row = new_row(0, tok, engine.markers, GREEDY, reasoning=True, think_limit=50, answer_limit=5)
    step = _Step(tok, engine.markers, engine.eos_ids, GREEDY)
    for t in tok(text, add_special_tokens=False)["input_ids"]:
        list(step.take(row, t))
        if row.phase == "answer":
            break
        row.fed += len(row.pending)
        row.pending = []
    assert row.phase == "answer" and row.think.text == text[: text.index("</")]
    assert row.trace_exact is exact
    engine._keep_row(text, row, new_cache(engine.model.config, engine.kv), [1], 0, 8)
    assert engine.has_trace(text) is exact


def test_a_long_prompt_leaves_room_for_the_answer(engine):
    cfg = SamplingConfig(temperature=0, repetition_penalty=1.0)
    for start_len in (100, 400, 490):
        think, answer = engine._limits(start_len, True, 256, 64, cfg)
        assert start_len + think + answer + len(engine.markers.forced_close) <= engine.context
    with pytest.raises(ValueError):
        engine._limits(engine.context - 3, True, 256, 64, cfg)
