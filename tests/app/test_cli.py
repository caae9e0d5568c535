"""The `ponder` command line, run as a user would (a subprocess), on the tiny model installed in a temp store."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def ponder(*args, home: Path, timeout=180):
    env = {**os.environ, "PONDER_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=timeout)


def test_help_documents_every_command(tmp_path):
    out = ponder("--help", home=tmp_path)
    assert out.returncode == 0
    for word in ("ask", "models", "setup", "bench"):
        assert word in out.stdout
    ask = ponder("ask", "--help", home=tmp_path).stdout
    for flag in ("--mode", "--temperature", "--max-tokens", "--seed", "--precision", "--kv", "--json"):
        assert flag in ask


def test_ask_json_fields(tiny_store, ponder_home):
    out = ponder("ask", "--model", "tiny-qwen2", "--precision", "w4", "--kv", "int8", "--temperature", "0",
                 "--max-tokens", "8", "--json", "What is 17*23?", home=ponder_home)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    for key in ("answer", "tokens", "ttft_s", "decode_tok_s", "model"):
        assert key in data
    assert data["model"] == "tiny-qwen2" and 1 <= data["tokens"] <= 8 and data["precision"] == "w4"


def test_ask_streams_text_and_is_repeatable_greedy(tiny_store, ponder_home):
    args = ("ask", "--model", "tiny-qwen2", "--precision", "bf16", "--kv", "bf16", "--temperature", "0",
            "--max-tokens", "6", "hello")
    a, b = ponder(*args, home=ponder_home), ponder(*args, home=ponder_home)
    assert a.returncode == 0 and a.stdout == b.stdout and "tok/s" in a.stderr


def test_models_list_and_missing_model_error(tiny_store, ponder_home):
    out = ponder("models", home=ponder_home)
    assert out.returncode == 0 and "tiny-qwen2" in out.stdout
    missing = ponder("ask", "--model", "nope", "hi", home=ponder_home)
    assert missing.returncode == 1 and "not installed" in missing.stderr


def test_import_bad_file_is_a_clear_error(ponder_home, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"hello")
    out = ponder("models", "import", str(bad), home=ponder_home)
    assert out.returncode == 1 and "not a valid GGUF" in out.stderr


def test_setup_reports_how_long_each_stage_took():
    import time

    from app.progress import TerminalProgress

    bar = TerminalProgress()
    bar("convert", 0, 2)
    time.sleep(0.06)
    bar("convert", 1, 2)
    time.sleep(0.06)
    bar("quantize", 0, 3)
    time.sleep(0.03)
    bar.close()
    assert list(bar.seconds) == ["convert", "quantize"]
    assert 0.11 <= bar.seconds["convert"] < 0.5 and 0.025 <= bar.seconds["quantize"] < 0.3


CTRL_C_WHILE_LOADING = """
import os, signal, sys, time, types
signal.signal(signal.SIGINT, signal.default_int_handler)  # as under a terminal (a background job inherits SIGINT ignored)
fake = types.ModuleType("app.cli")
def run_cli(argv):  # Ctrl+C while `ponder ask` loads the model
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)
fake.run_cli = run_cli
sys.modules["app.cli"] = fake
from app.main import main
raise SystemExit(main(["ask", "hello"]))
"""


@pytest.mark.skipif(sys.platform == "win32", reason="a real SIGINT to itself")
def test_ctrl_c_in_a_command_says_interrupted_without_a_traceback(tmp_path):
    env = {**os.environ, "PONDER_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", CTRL_C_WHILE_LOADING], capture_output=True, text=True, cwd=ROOT,
                         env=env, timeout=120)
    assert out.returncode == 130, out.stderr
    assert out.stderr.strip() == "ponder: interrupted" and "Traceback" not in out.stderr
