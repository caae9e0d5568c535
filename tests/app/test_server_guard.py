"""The local server refuses what a web page could send it (issue #40's probes), against a real uvicorn server on
127.0.0.1 backed by the tiny random Qwen2; and still serves real clients (the `openai` package)."""
import httpx
import openai
import pytest

from app.engine_worker import EngineWorker
from app.server import LocalServer
from app.server_guard import Guard, host_name
from tests.tiny import make_reasoning_engine

BODY = b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}'
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def worker():
    worker = EngineWorker(make_reasoning_engine())
    yield worker
    worker.shutdown()


@pytest.fixture(scope="module")
def server(worker):
    server = LocalServer(worker, port=0, allow_origins=("http://allowed.example",))
    server.start()
    yield server
    server.stop()


def post(server, headers: dict, body: bytes = BODY) -> httpx.Response:
    return httpx.post(server.url + "/chat/completions", content=body, headers=headers, timeout=60)


def refused(response: httpx.Response, status: int, code: str) -> bool:
    error = response.json()["error"]
    return response.status_code == status and error["code"] == code and error["type"] == "invalid_request_error"


@pytest.mark.parametrize("kind", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", None])
def test_posts_that_a_page_can_send_without_a_preflight_are_refused(server, kind):
    response = post(server, {"Content-Type": kind} if kind else {})
    assert refused(response, 415, "unsupported_media_type") and "application/json" in response.json()["error"]["message"]


@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:8080", "127.0.0.1.nip.io", ""])
def test_a_host_that_does_not_name_this_server_is_refused(server, host):
    response = post(server, {**JSON, "Host": host})
    assert refused(response, 403, "host_not_allowed")


@pytest.mark.parametrize("origin", ["http://attacker.example", "null", "https://localhost.attacker.example"])
def test_foreign_origins_are_refused_before_anything_runs(server, origin):
    assert refused(post(server, {**JSON, "Origin": origin}), 403, "origin_not_allowed")
    preflight = httpx.options(server.url + "/chat/completions", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST"})
    assert refused(preflight, 403, "origin_not_allowed")


def test_this_computers_hosts_and_origins_and_allowed_origins_are_served(server):
    port = server.port
    for host in ("127.0.0.1", f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):
        assert post(server, {**JSON, "Host": host}).status_code == 200, host
    for origin in (f"http://localhost:{port}", "http://127.0.0.1:3000", "http://allowed.example"):
        response = post(server, {**JSON, "Origin": origin})
        assert response.status_code == 200 and response.headers["access-control-allow-origin"] == origin
    preflight = httpx.options(server.url + "/chat/completions", headers={
        "Origin": "http://allowed.example", "Access-Control-Request-Method": "POST"})
    assert preflight.status_code == 204 and "Content-Type" in preflight.headers["access-control-allow-headers"]
    sdk = httpx.options(server.url + "/chat/completions", headers={  # the openai JS SDK's own headers pass
        "Origin": "http://allowed.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os, x-stainless-retry-count"})
    assert sdk.headers["access-control-allow-headers"] == "authorization, content-type, x-stainless-os, " \
                                                         "x-stainless-retry-count"
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
    assert client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=2).choices


def test_listening_off_loopback_needs_an_api_key(worker):
    with pytest.raises(ValueError, match="API key"):
        LocalServer(worker, host="0.0.0.0", port=0)
    server = LocalServer(worker, host="0.0.0.0", port=0, api_key="k")
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}/v1/models"
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers={"Authorization": "Bearer k"}).status_code == 200
        assert httpx.get(url, headers={"Authorization": "Bearer k", "Host": "192.168.1.20"}).status_code == 200
        assert refused(httpx.get(url, headers={"Authorization": "Bearer k", "Host": "rebind.example"}), 403,
                       "host_not_allowed")
    finally:
        server.stop()


def test_host_rules():
    guard = Guard(None, bound_host="127.0.0.1", allow_hosts=("ponder.lan",))
    assert [host_name(h) for h in ("[::1]:80", "Example.COM:8080", "::1", "a")] == ["::1", "example.com", "::1", "a"]
    assert guard.host_allowed("ponder.lan:8080") and guard.host_allowed("localhost")
    assert not guard.host_allowed("10.0.0.2") and not guard.host_allowed("ponder.lan.evil")
    with_port = Guard(None, allow_hosts=("ponder.lan:8080",))  # a port given with --allow-host still matches
    assert with_port.host_allowed("ponder.lan:8080") and with_port.host_allowed("ponder.lan")
    assert guard.host_allowed("localhost.") and guard.host_allowed("localhost.:8080")  # the fully qualified form
    assert not guard.host_allowed("[::1]evil.example") and host_name("[::1]evil.example") == "[::1]evil.example"
