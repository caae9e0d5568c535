"""Concurrent requests to the local server decode as one batch (`EngineWorker(max_batch=4)`): a request that
arrives while others decode joins at the next step, greedy answers equal what each request gets alone, and a
client that leaves cancels only its own request. A real uvicorn server on 127.0.0.1, the `openai` client, the
tiny random Qwen2 packed to int4 (so its steps take the fused path that joins requests)."""
import threading

import openai
import pytest

from app.engine_worker import EngineWorker
from app.server import LocalServer
from tests.core.test_fused_decode import w4_engine

PROMPTS = ["What is 17*23?", "Name a prime number.", "hello there", "Why is the sky blue?"]
GREEDY = {"temperature": 0, "max_tokens": 24, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def served():
    engine = w4_engine()
    worker = EngineWorker(engine, max_batch=4)
    server = LocalServer(worker, port=0)
    server.start()
    yield engine, worker, openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=120)
    server.stop()
    worker.shutdown()


def ask(client, prompt: str, **kw) -> str:
    return client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": prompt}],
                                          **(GREEDY | kw)).choices[0].message.content


def test_concurrent_requests_join_one_batch_and_answer_as_alone(served):
    engine, worker, client = served
    alone = [ask(client, p) for p in PROMPTS]
    before = engine.joint.joined_steps
    replies = [None] * len(PROMPTS)

    def run(i):
        replies[i] = ask(client, PROMPTS[i])

    ran_on = set()
    hook = engine.model.register_forward_pre_hook(lambda *_: ran_on.add(threading.get_ident()))
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    hook.remove()
    assert replies == alone
    assert engine.joint.joined_steps - before >= 10, "the requests shared decode steps"
    assert ran_on == {worker._thread.ident}, "every prefill ran on the one engine thread"


def test_a_request_arriving_mid_answer_joins_and_a_leaving_client_stops_only_its_own(served):
    engine, worker, client = served
    long = {"max_tokens": 300}
    alone = ask(client, PROMPTS[1], **long)
    result = {}
    first = threading.Thread(target=lambda: result.update(long=ask(client, PROMPTS[1], **long)))
    first.start()
    stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPTS[0]}],
                                            stream=True, **(GREEDY | long))
    for i, _chunk in enumerate(stream):  # joined the running request; then this client leaves
        if i == 5:
            break
    stream.close()
    first.join(120)
    assert result["long"] == alone
    cancelled = [r for r in worker.recent if r.finish_reason == "cancelled"]
    assert cancelled and cancelled[-1].completion_tokens < 300
