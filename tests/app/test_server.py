"""The local OpenAI server, end to end: the official `openai` client against a real uvicorn server on
127.0.0.1 (a free port), backed by the tiny random Qwen2 with a reasoning adapter and a verifier head."""
import asyncio
import threading
import time

import httpx
import openai
import pytest
import torch

from app.engine_worker import EngineWorker
from app.openai_schema import Limits
from app.server import LocalServer
from core.reasoning.verifier import Verifier
from models.heads import VerifierHead
from tests.tiny import make_reasoning_engine

HI = [{"role": "user", "content": "What is 2+3?"}]
GREEDY = {"temperature": 0, "max_tokens": 8}
LONG = {"max_tokens": 400, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def worker():
    engine = make_reasoning_engine()
    torch.manual_seed(0)
    engine.verifier = Verifier(VerifierHead(128), {"kind": "verifier", "hidden_size": 128})
    worker = EngineWorker(engine)
    yield worker
    worker.shutdown()


@pytest.fixture(scope="module")
def server(worker):
    server = LocalServer(worker, port=0, limits=Limits(max_tokens=1024, max_body_bytes=64 * 1024))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


def wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_models_lists_the_loaded_model(client):
    models = client.models.list().data
    assert [m.id for m in models] == ["tiny"] and models[0].ponder["can_reason"] is True


def test_plain_chat_completion_is_greedy_and_bounded(client):
    first = client.chat.completions.create(model="tiny", messages=HI, **GREEDY)
    again = client.chat.completions.create(model="tiny", messages=HI, **GREEDY)
    choice = first.choices[0]
    assert first.object == "chat.completion" and choice.message.role == "assistant"
    assert choice.message.content == again.choices[0].message.content
    assert choice.finish_reason in ("stop", "length") and 1 <= first.usage.completion_tokens <= 8
    assert first.ponder["route"]["reason"] is False and first.usage.prompt_tokens > 0


def test_streamed_chat_matches_the_whole_answer(client):
    whole = client.chat.completions.create(model="tiny", messages=HI, **GREEDY).choices[0].message.content
    chunks = list(client.chat.completions.create(model="tiny", messages=HI, stream=True,
                                                 stream_options={"include_usage": True}, **GREEDY))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens <= 8 and "route" in chunks[-1].ponder


def test_reasoning_mode_returns_the_trace(client):
    extra = {"reasoning_mode": "reason", "thinking_budget": 6}
    reply = client.chat.completions.create(model="tiny", messages=HI, max_tokens=6, seed=1, extra_body=extra)
    message = reply.choices[0].message
    assert message.reasoning_content and reply.ponder["route"] == {"reason": True, "probability": None, "source": "mode"}
    assert reply.ponder["thinking_tokens"] <= 6 and reply.ponder["adapter"] == "reason"
    stream = client.chat.completions.create(model="tiny", messages=HI, max_tokens=6, seed=1, stream=True,
                                            extra_body=extra)
    deltas = [c.choices[0].delta for c in stream if c.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == message.reasoning_content
    assert "".join(d.content or "" for d in deltas) == message.content


def test_parallel_answers_come_with_scores_and_a_vote(client):
    extra = {"reasoning_mode": "reason", "thinking_budget": 6}
    reply = client.chat.completions.create(model="tiny", messages=HI, n=3, max_tokens=6, seed=2, temperature=1.0,
                                           extra_body=extra)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    candidates, vote = reply.ponder["candidates"], reply.ponder["vote"]
    assert len(candidates) == 3 and all(0 <= c["score"] <= 1 for c in candidates)
    assert vote["method"] == "weighted" and vote["chosen"] in (0, 1, 2) and isinstance(vote["tie"], bool)
    voted_first = [candidates[vote["chosen"]]] + [c for c in candidates if c["index"] != vote["chosen"]]
    assert [c["text"] for c in voted_first] == [c.message.content for c in reply.choices]  # the vote's pick first
    majority = client.chat.completions.create(model="tiny", messages=HI, n=3, max_tokens=6, seed=2, temperature=1.0,
                                              extra_body={**extra, "vote": "majority"})
    assert majority.ponder["vote"]["method"] == "majority"
    assert all(row["weight"] == row["votes"] for row in majority.ponder["vote"]["table"])
    streamed = client.chat.completions.create(model="tiny", messages=HI, n=2, max_tokens=4, stream=True)
    assert {c.choices[0].index for c in streamed if c.choices and c.choices[0].delta.content} <= {0, 1}


def test_completions_continue_the_raw_prompt_without_the_chat_template(client, worker):
    prompt = "def add(a, b):<|im_end|>"
    reply = client.completions.create(model="tiny", prompt=prompt, max_tokens=5, temperature=0)
    assert reply.object == "text_completion" and reply.choices[0].text and reply.usage.completion_tokens <= 5
    tokenizer = worker.engine.tokenizer
    raw = tokenizer(prompt, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    assert reply.usage.prompt_tokens == len(raw)  # no template around it, and its "<|im_end|>" is text
    pieces = client.completions.create(model="tiny", prompt=prompt, max_tokens=5, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in pieces if c.choices) == reply.choices[0].text
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt=prompt, max_tokens=5, extra_body={"reasoning_mode": "reason"})


def test_reasoning_effort_maps_to_thinking_budgets(client):
    budgets = {}
    for effort in ("low", "medium", "high"):
        reply = client.chat.completions.create(model="tiny", messages=HI, max_tokens=4, temperature=0,
                                               reasoning_effort=effort)
        budgets[effort] = reply.ponder["budget"]
        assert reply.ponder["route"]["reason"] is True
    assert budgets == {"low": 128, "medium": 256, "high": 1024}  # the default budget (256) x 0.5, 1, 4
    plain = client.chat.completions.create(model="tiny", messages=HI, max_tokens=4, reasoning_effort="none")
    assert plain.ponder["route"]["reason"] is False and plain.ponder["thinking_tokens"] == 0
    chosen = client.chat.completions.create(model="tiny", messages=HI, max_tokens=4, temperature=0,
                                            reasoning_effort="high", extra_body={"thinking_budget": 7})
    assert chosen.ponder["budget"] == 7  # an explicit budget wins


def test_stop_strings_and_usage_are_honoured(client):
    free = client.chat.completions.create(model="tiny", messages=HI, max_tokens=30, temperature=0,
                                          extra_body={"ignore_eos": True})
    text = free.choices[0].message.content
    assert len(text) > 6
    stop = text[3:6]
    cut = client.chat.completions.create(model="tiny", messages=HI, max_tokens=30, temperature=0, stop=[stop],
                                         extra_body={"ignore_eos": True})
    assert cut.choices[0].message.content == text[: text.index(stop)] and cut.choices[0].finish_reason == "stop"
    assert cut.usage.completion_tokens < free.usage.completion_tokens == 30
    assert cut.usage.total_tokens == cut.usage.prompt_tokens + cut.usage.completion_tokens


def test_api_key_is_required_when_set(worker):
    server = LocalServer(worker, port=0, api_key="s3cret")
    server.start()
    try:
        anonymous = openai.OpenAI(base_url=server.url, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as err:
            anonymous.models.list()
        assert err.value.status_code == 401 and err.value.code == "invalid_api_key"
        assert httpx.get(server.url + "/models").status_code == 401
        good = openai.OpenAI(base_url=server.url, api_key="s3cret", max_retries=0)
        assert good.chat.completions.create(model="tiny", messages=HI, **GREEDY).choices
    finally:
        server.stop()


@pytest.mark.parametrize(("body", "status", "param", "code"), [
    (b"{not json", 400, None, "invalid_json"),
    (b"[1, 2]", 400, None, "invalid_json"),
    (b'{"messages": [{"role": "user", "content": "hi"}]}', 400, "model", "missing_required_parameter"),
    (b'{"model": "tiny", "messages": []}', 400, "messages", "invalid_value"),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}', 400,
     "temperature", "invalid_value"),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "n": 9}', 400, "n", "invalid_value"),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}', 400,
     "tools", "unsupported_parameter"),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "reasoning_mode": "deep"}', 400,
     "reasoning_mode", "invalid_value"),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "' + b"x" * 70000 + b'"}]}', 413, None,
     "request_too_large"),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "top_p": 1e-50}', 400, "top_p",
     "invalid_value"),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "repetition_penalty": 1e-50}', 400,
     "repetition_penalty", "invalid_value"),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": 1}', 400, "stream",
     "invalid_value"),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stop": ["' + b"z" * 300 + b'"]}', 400,
     "stop", "invalid_value"),
    (b'{"model": "tiny", "prompt": ""}', 400, "prompt", "invalid_value"),
    (b'{"model": "tiny", "prompt": [""]}', 400, "prompt", "invalid_value"),
])
def test_bad_requests_get_openai_errors(server, body, status, param, code):
    path = "/completions" if b'"prompt"' in body else "/chat/completions"
    response = httpx.post(server.url + path, content=body, headers={"Content-Type": "application/json"})
    error = response.json()["error"]
    assert response.status_code == status and error["param"] == param and error["code"] == code
    assert error["type"] == "invalid_request_error" and error["message"]


def test_a_vanishing_temperature_answers_greedily_instead_of_failing(client):
    """1e-50 is 0 in float32: dividing the logits by it gave inf and a 500; it now samples as temperature 0."""
    tiny = client.chat.completions.create(model="tiny", messages=HI, temperature=1e-50, max_tokens=8)
    greedy = client.chat.completions.create(model="tiny", messages=HI, **GREEDY)
    assert tiny.choices[0].message.content == greedy.choices[0].message.content


def test_client_errors_through_the_openai_client(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-4o", messages=HI)
    assert err.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "two words " * 400}])
    assert err.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=HI, max_tokens=5000, stream=True)
    assert err.value.param == "max_tokens" and "1024" in err.value.message


def test_a_closed_stream_cancels_its_generation(client, worker):
    stream = client.chat.completions.create(model="tiny", messages=HI, stream=True, **LONG)
    for _, _chunk in zip(range(4), stream, strict=False):
        pass
    stream.close()
    assert wait_for(lambda: worker.recent and worker.recent[-1].finish_reason == "cancelled", 5)
    record = worker.recent[-1]
    assert record.cancel_seen and record.completion_tokens < 400 and not worker.busy
    start = time.perf_counter()
    client.chat.completions.create(model="tiny", messages=HI, **GREEDY)
    assert time.perf_counter() - start < 2.0


def test_a_client_that_gives_up_cancels_a_whole_answer(server, worker):
    body = {"model": "tiny", "messages": HI, "max_tokens": 400, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/chat/completions", json=body, timeout=httpx.Timeout(10, read=0.3))
    assert wait_for(lambda: worker.recent and worker.recent[-1].finish_reason == "cancelled", 5)
    assert worker.recent[-1].completion_tokens < 400


def test_concurrent_requests_queue_and_all_complete(server, worker):
    replies, errors = {}, []

    def ask(name: str, **kw):
        try:
            c = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=60)
            replies[name] = c.chat.completions.create(model="tiny", messages=HI, **kw)
        except Exception as err:  # surfaced by the assert below
            errors.append(err)

    threads = [threading.Thread(target=ask, args=("long",), kwargs=LONG | {"max_tokens": 150})]
    threads[0].start()
    assert wait_for(lambda: worker.busy, 5)
    threads += [threading.Thread(target=ask, args=(f"short{i}",), kwargs=GREEDY) for i in range(2)]
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and set(replies) == {"long", "short0", "short1"}
    assert replies["long"].usage.completion_tokens == 150
    assert max(r.waited_s for r in list(worker.recent)[-3:]) > 0.05  # the short ones waited their turn


def test_the_window_and_the_server_share_one_engine_thread(loop, server, worker):
    from app.engine_service import EngineService
    from core.config import SamplingConfig

    service = EngineService(worker=worker)
    assert service.ready and service._executor is worker.executor
    result = {}
    streamer = threading.Thread(target=lambda: result.update(reply=openai.OpenAI(
        base_url=server.url, api_key="x", max_retries=0).chat.completions.create(model="tiny", messages=HI, **LONG)))
    streamer.start()
    assert wait_for(lambda: worker.busy, 5)

    async def window_asks():
        return await service.ask("hello", SamplingConfig(temperature=0, max_tokens=5, ignore_eos=True))

    answer = loop.run_until_complete(asyncio.wait_for(window_asks(), 60))
    streamer.join(60)
    assert answer.stats.completion_tokens == 5 and result["reply"].usage.completion_tokens == 400
    assert [r.source for r in list(worker.recent)[-2:]] == ["server", "window"]  # the window waited its turn


def test_ponder_serve_serves_an_installed_model_until_interrupted(tiny_store, ponder_home):
    import os
    import re
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from app.server import bind

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PONDER_HOME": str(ponder_home), "HF_HUB_OFFLINE": "1", "PONDER_API_KEY": "k"}
    command = [sys.executable, "-m", "app", "serve", "--model", "tiny-qwen2", "--port"]
    taken = bind("127.0.0.1", 0)
    taken.listen()
    busy = subprocess.run(command + [str(taken.getsockname()[1])], capture_output=True, text=True, cwd=root, env=env,
                          timeout=120)
    taken.close()
    assert busy.returncode == 1 and "cannot listen" in busy.stderr
    assert subprocess.run(command + ["70000"], capture_output=True, cwd=root, env=env, timeout=120).returncode == 2
    keyless = {k: v for k, v in env.items() if k != "PONDER_API_KEY"}
    open_to_all = subprocess.run(command + ["0", "--host", "0.0.0.0"], capture_output=True, text=True, cwd=root,
                                 env=keyless, timeout=120)
    assert open_to_all.returncode == 2 and "needs an API key" in open_to_all.stderr
    proc = subprocess.Popen(command + ["0"], stderr=subprocess.PIPE, text=True, cwd=root, env=env)
    try:
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if line.startswith("Serving"):
                break
        url = re.search(r"http://\S+/v1", lines[-1]).group(0)
        client = openai.OpenAI(base_url=url, api_key="k", max_retries=0, timeout=60)
        assert client.chat.completions.create(model="tiny-qwen2", messages=HI, **GREEDY).choices[0].message.content
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url, api_key="nope", max_retries=0).models.list()
    finally:
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=30)[1]
    assert proc.returncode == 0 and "Stopped." in rest


def test_the_bound_socket_accepts_before_uvicorn_starts():
    """`ponder serve` says "Serving" before uvicorn has started; a client connecting at once was refused."""
    import socket

    from app.server import bind

    sock = bind("127.0.0.1", 0)
    try:
        socket.create_connection(sock.getsockname(), timeout=5).close()  # queued in the backlog, not refused
    finally:
        sock.close()


def test_silent_slow_and_excess_connections_are_closed_and_others_still_served(worker, monkeypatch):
    """A connection that sends nothing, or only part of its headers or body, is closed after its deadline; one
    client may not hold more than its share of connections; a normal request meanwhile is answered."""
    import socket

    from app.server_protocol import GuardedH11Protocol

    monkeypatch.setattr(GuardedH11Protocol, "head_timeout_s", 0.5)
    monkeypatch.setattr(GuardedH11Protocol, "max_per_client", 4)
    server = LocalServer(worker, port=0, limits=Limits(body_timeout_s=0.5))
    server.start()
    address = ("127.0.0.1", server.port)

    def closed_within(sock, seconds: float) -> bool:
        sock.settimeout(seconds)
        try:
            return sock.recv(4096) is not None  # b"" once closed (or the server's error response)
        except TimeoutError:
            return False

    try:
        silent = socket.create_connection(address)
        half_head = socket.create_connection(address)
        half_head.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        half_body = socket.create_connection(address)
        half_body.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                          b"\r\nContent-Length: 1000\r\n\r\n{\"model\"")
        excess = [socket.create_connection(address) for _ in range(2)]  # the 4th (allowed) and 5th (refused)
        assert all(closed_within(s, 0.3) for s in excess[1:])
        assert closed_within(silent, 3) and closed_within(half_head, 3)
        assert b"408" in half_body.recv(4096).split(b"\r\n")[0]
        for s in [silent, half_head, half_body, *excess]:
            s.close()
        assert httpx.get(server.url + "/models", timeout=5).status_code == 200
    finally:
        server.stop()
