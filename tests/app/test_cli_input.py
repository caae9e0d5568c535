"""Command-line input: bad values are refused with one clear line and exit code 2 before any model loads; an
empty question is refused (argument or stdin); stderr stays clean (no library noise such as torch's
"No CUDA runtime is found")."""
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import run_cli

ROOT = Path(__file__).resolve().parents[2]


def ponder(*args, home: Path, stdin: str | None = None, env: dict | None = None):
    env = {**os.environ, "PONDER_HOME": str(home), "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True, cwd=ROOT, env=env,
                          input=stdin, timeout=120)


BAD = [
    (["ask", ""], "the question is empty"),
    (["ask", "  \n\t"], "the question is empty"),
    (["ask", "--parallel", "0", "hi"], "--parallel"),
    (["ask", "--parallel", "9", "hi"], "--parallel"),
    (["ask", "--budget", "-5", "hi"], "--budget"),
    (["ask", "--temperature", "-0.1", "hi"], "--temperature"),
    (["ask", "--temperature", "nan", "hi"], "--temperature"),
    (["ask", "--top-p", "0", "hi"], "--top-p"),
    (["ask", "--top-p", "1.01", "hi"], "--top-p"),
    (["ask", "--top-k", "-1", "hi"], "--top-k"),
    (["ask", "--max-tokens", "0", "hi"], "--max-tokens"),
    (["ask", "--answer-max-tokens", "0", "hi"], "--answer-max-tokens"),
    (["ask", "--repetition-penalty", "0", "hi"], "--repetition-penalty"),
    (["ask", "--parallel", "two", "hi"], "--parallel"),
    (["ask", "--seed", str(2**64), "hi"], "--seed"),  # torch's generator takes 64 bits (as the server's seed)
    (["ask", "--seed", str(-(2**63) - 1), "hi"], "--seed"),
    (["ask", "--seed", "1.5", "hi"], "--seed"),
    (["frobnicate"], "invalid choice"),
]


@pytest.mark.parametrize(("argv", "says"), BAD)
def test_bad_values_are_one_line_and_exit_2(argv, says, capsys, monkeypatch):
    monkeypatch.setattr("core.loading.load_engine", lambda *a, **k: pytest.fail("no model may load"))
    with pytest.raises(SystemExit) as exit_:
        run_cli(argv)
    out = capsys.readouterr()
    assert exit_.value.code == 2 and out.out == ""
    assert out.err.count("\n") == 1 and says in out.err and out.err.startswith("ponder")


def test_good_edge_values_are_accepted():
    from app.cli import build_parser

    args = build_parser().parse_args(["ask", "--parallel", "8", "--budget", "0", "--temperature", "0", "--top-p", "1",
                                      "--top-k", "0", "--max-tokens", "1", "x"])
    assert (args.parallel, args.budget, args.temperature, args.top_p, args.top_k, args.max_tokens) == (8, 0, 0, 1, 0, 1)
    for seed in (2**64 - 1, -(2**63), -1, 0):
        assert build_parser().parse_args(["ask", "--seed", str(seed), "x"]).seed == seed


def test_empty_question_from_stdin_is_refused(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(" \n\n"))
    monkeypatch.setattr("core.loading.load_engine", lambda *a, **k: pytest.fail("no model may load"))
    assert run_cli(["ask", "-"]) == 2
    err = capsys.readouterr().err
    assert err == "ponder ask: error: the question read from stdin is empty\n"


def test_help_and_bad_values_as_a_user_runs_them(tmp_path):
    help_ = ponder("--help", home=tmp_path)
    assert help_.returncode == 0 and help_.stderr == "" and "ask" in help_.stdout
    for args, stdin in ((("ask", ""), None), (("ask", "--parallel", "0", "hi"), None), (("ask", "-"), "   ")):
        out = ponder(*args, home=tmp_path, stdin=stdin)
        assert out.returncode == 2 and out.stdout == "", args
        assert len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr, (args, out.stderr)


def test_torch_cuda_home_notice_is_dropped(tmp_path):
    """A CUDA build of torch on a computer without a GPU but with a CUDA toolkit logs "No CUDA runtime is found,
    using CUDA_HOME=…" when transformers or quanto import torch.utils.cpp_extension. Simulated here on any torch;
    the control run shows the simulation does reproduce it."""
    script = ("import torch\n"
              "torch.cuda._is_compiled = lambda: True\n"
              "torch.version.cuda = '12.8'\n"
              "torch.cuda.is_available = lambda: False\n"
              "from app.main import main\n"
              "if QUIET:\n"
              "    assert main(['models', 'known']) == 0\n"
              "import torch.utils.cpp_extension\n")
    env = {**os.environ, "CUDA_HOME": str(tmp_path), "PONDER_HOME": str(tmp_path / "home")}

    def run(quiet: bool):
        return subprocess.run([sys.executable, "-c", f"QUIET = {quiet}\n" + script], capture_output=True, text=True,
                              cwd=ROOT, env=env, timeout=120)

    control = run(False)
    assert control.returncode == 0 and "No CUDA runtime is found" in control.stderr
    quiet = run(True)
    assert quiet.returncode == 0 and quiet.stderr == ""


class ClosedPipe(io.StringIO):
    """stdout of `ponder ask … | head -c 5` once head has exited."""

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_stdout_ends_quietly(capsys, monkeypatch):
    """`ponder ask … | head -1`: the reader goes away mid-answer; no traceback, exit code 141 (as SIGPIPE)."""
    from core.events import TokenEvent

    class Engine:
        warnings, adapter_name = (), None

        def stream(self, text, sampling, **kwargs):
            yield TokenEvent("The answer", "answer")
            pytest.fail("the answer went on after its reader had gone")

    monkeypatch.setattr("core.loading.load_engine", lambda *a, **k: Engine())
    monkeypatch.setattr("app.cli.ask._install_sigint", lambda cancel: None)  # pytest keeps its own Ctrl+C
    monkeypatch.setattr("sys.stdout", ClosedPipe())
    assert run_cli(["ask", "--model", "tiny-qwen2", "hi"]) == 141
    assert capsys.readouterr().err == ""
