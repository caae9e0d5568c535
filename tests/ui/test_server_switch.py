"""The Settings switch "Serve the OpenAI API on 127.0.0.1:PORT": the window's engine answers both the window and
an OpenAI client (decoding side by side in one batch), the switch stops it, a taken port is reported, not raised."""
import threading
from dataclasses import replace

import httpx
import openai
import pytest

from app.server import bind
from app.settings import AppSettings
from tests.qt_helpers import run_until
from tests.tiny import make_reasoning_engine
from tests.ui.helpers import ask, make_window


def free_port() -> int:
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    return port


@pytest.fixture
def window(qtbot, loop, tmp_path):
    win = make_window(qtbot, loop, tmp_path, make_reasoning_engine())
    yield win
    win.close()
    win.service.shutdown()


def test_the_switch_serves_the_windows_engine_and_stops(window, loop):
    port = free_port()
    # the window's answer at most 16 tokens, so it is short whatever the tiny random model draws
    window.apply_settings(replace(window.settings, serve=True, serve_port=port, answer_max_tokens=16))
    url = f"http://127.0.0.1:{port}/v1"
    assert window.server.url == url and url in window.status.text()
    client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60)
    reply = {}
    long = threading.Thread(target=lambda: reply.update(r=client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=200, extra_body={"ignore_eos": True})))
    long.start()
    assert run_until(loop, lambda: window.service.worker.busy, 5)
    message = ask(window, loop, "hello", "base")  # joins the server's request at the next step
    long.join(60)
    assert message.role == "assistant" and message.content and reply["r"].usage.completion_tokens == 200
    # the window's short answer ended while the server's 200 tokens were still decoding: it did not wait its turn
    # (a job's record is written just after its last event reached the client: wait for both)
    assert run_until(loop, lambda: len(window.service.worker.recent) >= 2, 10)
    assert [r.source for r in list(window.service.worker.recent)[-2:]] == ["window", "server"]
    # the switch's server keeps the rules of `ponder serve` (#40): what a web page could send is refused
    body = b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
    for headers, status, code in (({"Content-Type": "text/plain"}, 415, "unsupported_media_type"),
                                  ({"Content-Type": "application/json", "Host": "attacker.example"}, 403,
                                   "host_not_allowed"),
                                  ({"Content-Type": "application/json", "Origin": "http://attacker.example"}, 403,
                                   "origin_not_allowed")):
        refused = httpx.post(url + "/chat/completions", content=body, headers=headers, timeout=60)
        assert refused.status_code == status and refused.json()["error"]["code"] == code
    window.apply_settings(replace(window.settings, serve=False))
    assert window.server.url is None and "stopped" in window.status.text()
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/models")


def test_a_taken_port_is_reported(window, monkeypatch):
    shown = []
    monkeypatch.setattr("ui.main_window.show_info", lambda parent, title, text: shown.append(text))
    taken = bind("127.0.0.1", 0)
    taken.listen()
    port = taken.getsockname()[1]
    try:
        window.apply_settings(replace(window.settings, serve=True, serve_port=port))
    finally:
        taken.close()
    assert len(shown) == 1 and str(port) in shown[0] and window.server.url is None


def test_the_dialog_edits_the_switch(qtbot, tmp_path):
    from ui.settings_dialog import SettingsDialog

    dialog = SettingsDialog(AppSettings(model_id="m"), tmp_path)
    qtbot.addWidget(dialog)
    assert not dialog.serve.isChecked() and not dialog.serve_port.isEnabled()
    dialog.serve.setChecked(True)
    dialog.serve_port.setValue(9090)
    assert dialog.serve_port.isEnabled()
    got = dialog.settings()
    assert (got.serve, got.serve_port) == (True, 9090)


def test_stored_server_settings_are_validated():
    from app.settings import from_dict

    assert from_dict({"serve": True, "serve_port": 9000}).serve_port == 9000
    assert from_dict({"serve": "yes", "serve_port": 80}) == AppSettings()
