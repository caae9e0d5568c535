"""Requests decoding at the same time share each fused step (core.decode.joint: greenlets on one thread), and each
gets exactly the tokens it gets alone: the int4 kernel computes each row the same whatever rows run beside it."""
import threading

import pytest

from core.config import SamplingConfig
from core.decode import joint
from core.engine import collect
from tests.core.test_fused_decode import lora_engine, w4_engine

GREEDY = SamplingConfig(temperature=0, max_tokens=40, ignore_eos=True, repetition_penalty=1.0)
QUESTIONS = ["What is 17*23?", "Name a prime number.", "hello there", "Why is the sky blue?"]


def run_together(engine, calls):
    """Start every call as a member of the engine's joint steps and advance them to the end; their results."""
    return [f.result(0) for f in joint.run_together(engine.joint, calls)]


def test_concurrent_greedy_answers_equal_their_answers_alone_and_share_steps():
    engine = w4_engine()
    alone = [engine.generate(q, GREEDY).text for q in QUESTIONS]
    before = engine.joint.joined_steps
    together = run_together(engine, [lambda q=q: engine.generate(q, GREEDY).text for q in QUESTIONS])
    assert together == alone
    assert engine.joint.joined_steps - before >= 20, "the requests' steps ran as one"


def test_a_reasoning_request_and_a_base_request_join_with_their_own_adapters():
    engine = lora_engine()
    reason = dict(mode="reason", budget=12, answer_max_tokens=8)
    alone = [engine.generate(QUESTIONS[0], GREEDY, **reason), engine.generate(QUESTIONS[1], GREEDY),
             collect(engine.parallel(QUESTIONS[2], SamplingConfig(temperature=0.9, seed=5, max_tokens=10,
                                                                  ignore_eos=True), n=3, mode="base"))]
    before = engine.joint.joined_steps
    together = run_together(engine, [
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

    first, second = run_together(engine, [cancelled, lambda: engine.generate(QUESTIONS[1], long)])
    assert first.finish_reason == "cancelled" and first.stats.completion_tokens < 50
    assert second.text == alone and second.stats.completion_tokens == 200
    assert engine.joint.members == 0 and engine.joint.parked == 0


def test_members_need_inference_mode_and_one_thread():
    """Interleaved members would otherwise leave each other's torch inference-mode blocks out of order."""
    engine = w4_engine()
    with pytest.raises(RuntimeError, match="inference_mode"):
        engine.joint.start(lambda: None)
    out = {}

    def elsewhere():
        import torch

        with torch.inference_mode():
            out["f"] = engine.joint.start(lambda: engine.generate(QUESTIONS[0], GREEDY))  # parks at its first step

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join(60)
    assert engine.joint.parked == 1
    with pytest.raises(RuntimeError, match="one thread"):
        run_together(engine, [lambda: None])


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


def test_module_path_requests_take_turns_step_by_step():
    """Without packed int4 weights no step joins, but requests still alternate instead of running one by one."""
    from core.engine import Engine
    from tests.tiny import make_model, make_tokenizer

    engine = Engine(make_model(448, hidden_size=256), make_tokenizer(), model_id="tiny", context=512)
    assert engine.fused is None
    order = []

    def asked(tag, question):
        def call():
            for event in engine.stream(question, GREEDY):
                order.append(tag)
                if hasattr(event, "answer"):
                    return event.answer.text
        return call

    alone = [engine.generate(q, GREEDY).text for q in QUESTIONS[:2]]
    together = run_together(engine, [asked("a", QUESTIONS[0]), asked("b", QUESTIONS[1])])
    assert together == alone
    assert order.index("b") < len(order) // 2 and order[: order.index("b")].count("a") <= 2


def test_importing_the_engine_starts_no_openmp_team():
    """libgomp keeps a worker team per thread that ever ran parallel work; a second team on 2 cores makes every
    matmul of the engine thread pay a wake-up (13 ms steps instead of 9). Importing must not start one on the
    importing thread (the int4 kernel's probe runs on one thread)."""
    import subprocess
    import sys

    code = ("import os, torch; n = len(os.listdir('/proc/self/task')); "
            "import models.int4_kernel, core.engine, app.engine_worker, app.server; "
            "print(n, len(os.listdir('/proc/self/task')))")
    before, after = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                   check=True).stdout.split()
    assert after == before
