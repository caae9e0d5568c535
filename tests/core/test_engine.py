import threading
import time

import pytest

from core.config import SamplingConfig
from core.engine import PromptTooLong
from core.events import DoneEvent, TokenEvent

GREEDY = SamplingConfig(temperature=0, repetition_penalty=1.0, max_tokens=12, ignore_eos=True)


def test_stream_yields_tokens_then_done(tiny_engine):
    events = list(tiny_engine.stream("hello", GREEDY))
    assert isinstance(events[-1], DoneEvent)
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    answer = events[-1].answer
    assert "".join(t.text for t in tokens) == answer.text
    assert answer.stats.completion_tokens == 12 and answer.finish_reason == "length"
    s = answer.stats
    assert s.prompt_tokens > 5 and s.ttft_s > 0 and s.decode_tok_s > 0 and s.kv_cache_bytes > 0


def test_temperature_zero_is_deterministic(tiny_engine):
    a = tiny_engine.generate("What is 17*23?", GREEDY)
    b = tiny_engine.generate("What is 17*23?", GREEDY)
    assert a.token_ids == b.token_ids


def test_seed_makes_sampling_repeatable(tiny_engine):
    cfg = SamplingConfig(temperature=1.2, top_p=1.0, top_k=0, max_tokens=16, seed=3, ignore_eos=True)
    a = tiny_engine.generate("hello", cfg)
    b = tiny_engine.generate("hello", cfg)
    c = tiny_engine.generate("hello", SamplingConfig(**{**cfg.__dict__, "seed": 4}))
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_max_tokens_respected(tiny_engine):
    for n in (1, 5):
        ans = tiny_engine.generate("hi", SamplingConfig(temperature=0, max_tokens=n, ignore_eos=True))
        assert len(ans.token_ids) == n


def test_stop_string_ends_answer(tiny_engine):
    full = tiny_engine.generate("hi", SamplingConfig(temperature=0, max_tokens=30, ignore_eos=True))
    assert len(full.text) > 6
    stop = full.text[3:6]
    cut = tiny_engine.generate("hi", SamplingConfig(temperature=0, max_tokens=30, ignore_eos=True, stop=(stop,)))
    assert cut.finish_reason == "stop" and stop not in cut.text and full.text.startswith(cut.text)


def test_end_of_turn_token_stops_and_is_not_shown(tiny_engine):
    from core.engine import Engine

    free = tiny_engine.generate("hi", SamplingConfig(temperature=0, max_tokens=6, ignore_eos=True))
    engine = Engine(tiny_engine.model, tiny_engine.tokenizer, model_id="t", context=512)
    engine.eos_ids = {free.token_ids[2]}  # make the third greedy token the end-of-turn token
    ans = engine.generate("hi", SamplingConfig(temperature=0, max_tokens=6))
    assert ans.finish_reason == "stop" and ans.token_ids == free.token_ids[:3]
    assert ans.text == tiny_engine.tokenizer.decode(list(free.token_ids[:2]), skip_special_tokens=True)


def test_cancel_from_another_thread_within_a_step(tiny_engine):
    cancel = threading.Event()
    cfg = SamplingConfig(temperature=0, max_tokens=400, ignore_eos=True)
    seen_after_cancel = []
    stream = tiny_engine.stream("hello", cfg, cancel=cancel)
    timer = threading.Timer(0.05, cancel.set)
    timer.start()
    for event in stream:
        if cancel.is_set() and isinstance(event, TokenEvent):
            seen_after_cancel.append(event)
        if isinstance(event, DoneEvent):
            answer = event.answer
    timer.join()
    assert answer.finish_reason == "cancelled"
    assert len(answer.token_ids) < 400
    assert len(seen_after_cancel) <= 1  # at most the token of the step in flight


def test_prompt_too_long_is_a_clear_error(tiny_engine):
    with pytest.raises(PromptTooLong):
        tiny_engine.generate("hello " * 600, GREEDY)


def test_int8_kv_engine_matches_bf16_early_tokens(tiny_engine):
    from core.engine import Engine

    int8 = Engine(tiny_engine.model, tiny_engine.tokenizer, model_id="t", kv="int8", context=512)
    a = tiny_engine.generate("What is 17*23?", GREEDY)
    b = int8.generate("What is 17*23?", GREEDY)
    assert a.token_ids[:3] == b.token_ids[:3]
    assert b.stats.kv_cache_bytes < 0.6 * a.stats.kv_cache_bytes


def test_decode_is_streamed_not_batched(tiny_engine):
    stamps = []
    for _event in tiny_engine.stream("hi", SamplingConfig(temperature=0, max_tokens=20, ignore_eos=True)):
        stamps.append(time.perf_counter())
    assert len(stamps) >= 5
