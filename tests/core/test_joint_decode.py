"""Requests decoding at the same time on their own threads share each fused step (core.decode.joint), and each
gets exactly the tokens it gets alone: the int4 kernel computes each row the same whatever rows run beside it."""
import threading

import pytest

from core.config import SamplingConfig
from core.engine import collect
from tests.core.test_fused_decode import lora_engine, w4_engine

GREEDY = SamplingConfig(temperature=0, max_tokens=40, ignore_eos=True, repetition_penalty=1.0)
QUESTIONS = ["What is 17*23?", "Name a prime number.", "hello there", "Why is the sky blue?"]


def run_together(calls):
    """Run each call on its own thread, all at once; returns their results in order."""
    results, errors = [None] * len(calls), []
    start = threading.Barrier(len(calls))

    def run(i, call):
        try:
            start.wait()
            results[i] = call()
        except Exception as err:  # surfaced below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    return results


def test_concurrent_greedy_answers_equal_their_answers_alone_and_share_steps():
    engine = w4_engine()
    alone = [engine.generate(q, GREEDY).text for q in QUESTIONS]
    before = engine.joint.joined_steps
    together = run_together([lambda q=q: engine.generate(q, GREEDY).text for q in QUESTIONS])
    assert together == alone
    assert engine.joint.joined_steps - before >= 20, "the requests' steps ran as one"


def test_a_reasoning_request_and_a_base_request_join_with_their_own_adapters():
    engine = lora_engine()
    reason = dict(mode="reason", budget=12, answer_max_tokens=8)
    alone = [engine.generate(QUESTIONS[0], GREEDY, **reason), engine.generate(QUESTIONS[1], GREEDY),
             collect(engine.parallel(QUESTIONS[2], SamplingConfig(temperature=0.9, seed=5, max_tokens=10,
                                                                  ignore_eos=True), n=3, mode="base"))]
    before = engine.joint.joined_steps
    together = run_together([
        lambda: engine.generate(QUESTIONS[0], GREEDY, **reason), lambda: engine.generate(QUESTIONS[1], GREEDY),
        lambda: collect(engine.parallel(QUESTIONS[2], SamplingConfig(temperature=0.9, seed=5, max_tokens=10,
                                                                     ignore_eos=True), n=3, mode="base"))])
    assert [a.thinking for a in together[:2]] == [a.thinking for a in alone[:2]] and alone[0].thinking
    assert [a.text for a in together[:2]] == [a.text for a in alone[:2]]
    assert [c.text for c in together[2].candidates] == [c.text for c in alone[2].candidates]
    assert engine.joint.joined_steps > before


def test_cancelling_one_request_leaves_the_others_running():
    engine = w4_engine()
    long = SamplingConfig(temperature=0, max_tokens=200, ignore_eos=True, repetition_penalty=1.0)
    alone = engine.generate(QUESTIONS[1], long).text
    cancel = threading.Event()

    def cancelled():
        count = 0
        for event in engine.stream(QUESTIONS[0], long, cancel=cancel):
            count += 1
            if count == 5:
                cancel.set()
            if hasattr(event, "answer"):
                return event.answer

    first, second = run_together([cancelled, lambda: engine.generate(QUESTIONS[1], long)])
    assert first.finish_reason == "cancelled" and first.stats.completion_tokens < 50
    assert second.text == alone and second.stats.completion_tokens == 200
    assert engine.joint.members == 0


@pytest.mark.parametrize("rows", [1, 3])
def test_step_many_equals_step_per_group(rows):
    import torch

    from tests.core.test_fused_decode import prefilled

    engine = w4_engine()
    a, _ = prefilled(engine.model, rows)
    b, _ = prefilled(engine.model, 2)
    solo_a, _ = prefilled(engine.model, rows)
    solo_b, _ = prefilled(engine.model, 2)
    for _ in range(3):  # b is one token ahead of a: different positions in one step
        engine.fused.step(torch.tensor([7, 8]), b)
        engine.fused.step(torch.tensor([7, 8]), solo_b)
    for t in range(4):
        ta, tb = torch.tensor([10 + t] * rows), torch.tensor([30 + t, 40 + t])
        joint = engine.fused.step_many([(ta, a, None), (tb, b, None)])
        assert torch.equal(joint[0], engine.fused.step(ta, solo_a))
        assert torch.equal(joint[1], engine.fused.step(tb, solo_b))
