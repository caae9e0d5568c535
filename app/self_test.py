"""`ponder --self-test`: does this build work on this computer? One line per check, exit code 0 or 1.

Runs the same in the source tree and in the frozen (PyInstaller) app, with no model installed and no network:
the Qt platform plugin, torch's threads, the packed int4/int8 CPU kernels, the math scorer, the chat
database, that switching a LoRA adapter on and off changes the logits, a short generation on the tiny random
Qwen2 built in code (core.tiny), and the bundled resources. Nothing is written outside a temporary folder.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

RESOURCE_FILES = (
    "prompts/reasoning.json",
    "icons/ponder.png",
    "icons/ponder.svg",
    "components/qwen2.5-coder-0.5b-instruct/reasoning/adapter_model.safetensors",
    "components/qwen2.5-coder-0.5b-instruct/switcher/head.safetensors",
    "components/qwen2.5-coder-0.5b-instruct/verifier/head.safetensors",
)


@dataclass(frozen=True)
class Result:
    name: str
    ok: bool
    seconds: float
    detail: str


def check_qt() -> str:
    """The Qt platform plugin loads and paints (offscreen when there is no display)."""
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")) and sys.platform.startswith("linux"):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QColor, QImage, QPainter
    from PySide6.QtWidgets import QApplication, QLabel

    app = QApplication.instance() or QApplication([sys.argv[0]])
    image = QImage(64, 32, QImage.Format.Format_ARGB32)
    image.fill(QColor("white"))
    painter = QPainter(image)
    painter.setPen(Qt.GlobalColor.black)
    painter.drawText(image.rect(), Qt.AlignmentFlag.AlignCenter, "Ponder")
    painter.end()
    if all(image.pixelColor(x, y) == QColor("white") for x in range(64) for y in range(32)):
        raise RuntimeError("text did not paint (no usable font?)")
    label = QLabel("Ponder")
    label.adjustSize()
    from PySide6 import __version__ as pyside_version

    return f"platform {app.platformName()}, PySide6 {pyside_version}"


def check_threads() -> str:
    """torch uses the requested number of threads and its parallel matmul runs."""
    import torch

    from core.loading import set_threads

    n = set_threads(None)
    if torch.get_num_threads() != n:
        raise RuntimeError(f"asked for {n} threads, torch uses {torch.get_num_threads()}")
    a = torch.randn(256, 256)
    if not torch.allclose(a @ torch.eye(256), a):
        raise RuntimeError("matmul is wrong")
    return f"{n} threads, {torch.__version__}"


def check_kernels() -> str:
    """A quantized layer through the packed int4 (and int8) CPU kernels agrees with its dense original."""
    import torch
    from torch import nn

    from models.quantization import _int4_forward, _int8_forward, quantize_model
    from models.quantized_files import cpu_capability

    torch.manual_seed(0)
    x = torch.randn(4, 512, dtype=torch.bfloat16)
    errors = []
    for bits, kernel, limit in ((4, _int4_forward, 0.2), (8, _int8_forward, 0.02)):
        layer = nn.Sequential()
        layer.add_module("proj", nn.Linear(512, 256, bias=False))
        layer.to(torch.bfloat16)
        with torch.inference_mode():
            dense = layer(x).float()
        quantize_model(layer, bits)
        if getattr(layer.proj.forward, "__func__", None) is not kernel:
            raise RuntimeError(f"int{bits} layer is not on the packed kernel")
        with torch.inference_mode():
            error = ((layer(x).float() - dense).norm() / dense.norm()).item()
        if not error < limit:
            raise RuntimeError(f"int{bits} relative error {error:.3f} >= {limit}")
        errors.append(f"int{bits} err {error:.3f}")
    return f"{cpu_capability()}: " + ", ".join(errors)


def check_scorer() -> str:
    """math-verify (and its LaTeX grammar) parses and compares answers."""
    from core.reasoning.voting import is_correct

    if not is_correct("The answer is \\boxed{0.5}", "\\frac{1}{2}") or is_correct("\\boxed{4}", "3"):
        raise RuntimeError("math-verify compares wrongly")
    return "1/2 = 0.5, 3 != 4"


def check_database() -> str:
    """The chat database (sqlite) opens, writes and reads."""
    from core.storage.chats import ChatStore

    with tempfile.TemporaryDirectory(prefix="ponder-selftest-") as tmp:
        store = ChatStore(Path(tmp) / "chats.db")
        cid = store.new_conversation("self-test")
        store.add_message(cid, "user", "hello")
        if [m.content for m in store.messages(cid)] != ["hello"]:
            raise RuntimeError("read back a different message")
        store.close()
    return "sqlite ok"


def check_adapter() -> str:
    """Turning the LoRA adapter off gives the base model's logits exactly; on, different logits."""
    import torch

    from core.adapters import lora as adapters
    from core.tiny import make_model

    model = make_model(448)
    ids = torch.tensor([[5, 17, 42, 99, 7]])
    with torch.inference_mode():
        plain = model(input_ids=ids).logits.float()
    model = adapters.attach_new(model, rank=4)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                torch.nn.init.normal_(p, std=0.05)
    model.eval()
    with torch.inference_mode():
        on = model(input_ids=ids).logits.float()
        with adapters.base(model):
            off = model(input_ids=ids).logits.float()
    if not torch.equal(off, plain):
        raise RuntimeError("adapter off differs from the base model")
    delta = (on - off).abs().max().item()
    if delta == 0:
        raise RuntimeError("adapter on does not change the logits")
    return f"max |on - off| = {delta:.3f}"


def check_generation() -> str:
    """A short greedy generation (thinking with the adapter, then answering) on the tiny random Qwen2."""
    from core.config import SamplingConfig
    from core.tiny import make_reasoning_engine

    engine = make_reasoning_engine()
    answer = engine.generate("What is 2+2?", SamplingConfig(temperature=0, max_tokens=12, ignore_eos=True),
                             mode="reason", budget=6, answer_max_tokens=6)
    tokens = answer.stats.completion_tokens
    if tokens < 1:
        raise RuntimeError("no tokens generated")
    return f"{tokens} tokens, {answer.stats.decode_tok_s:.0f} tok/s"


def check_resources() -> str:
    """The bundled resources (prompts, shipped adapter and heads, icons) are present."""
    from core.storage.paths import resource_dir

    root = resource_dir()
    missing = [f for f in RESOURCE_FILES if not (root / f).is_file()]
    if missing:
        raise RuntimeError(f"missing in {root}: {', '.join(missing)}")
    return f"{len(RESOURCE_FILES)} files in {root}"


CHECKS: tuple[tuple[str, Callable[[], str]], ...] = (
    ("qt platform", check_qt), ("torch threads", check_threads), ("packed kernels", check_kernels),
    ("math scorer", check_scorer), ("chat database", check_database), ("adapter switch", check_adapter),
    ("tiny generation", check_generation), ("resources", check_resources),
)


def run_checks(checks=CHECKS) -> list[Result]:
    results = []
    for name, check in checks:
        start = time.perf_counter()
        try:
            detail, ok = check(), True
        except Exception as err:  # every failure is reported, the other checks still run
            lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [""]
            text = lines[0] if len(lines) == 1 else f"{lines[0]} … {lines[-1]}"  # e.g. numpy's long import advice
            detail, ok = f"{type(err).__name__}: {text}", False
        results.append(Result(name, ok, time.perf_counter() - start, detail))
    return results


def report(results: list[Result], out=None) -> int:
    """Print one line per check and a summary; return the exit code (0 when every check passed)."""
    out = out or sys.stdout
    frozen = "frozen" if getattr(sys, "frozen", False) else "source"
    print(f"Ponder self-test ({frozen}, Python {sys.version.split()[0]}, {sys.platform})", file=out)
    for r in results:
        print(f"  {'ok  ' if r.ok else 'FAIL'}  {r.name:16s} {r.seconds:6.2f}s  {r.detail}", file=out)
    failed = [r.name for r in results if not r.ok]
    total = sum(r.seconds for r in results)
    print(f"{'FAILED: ' + ', '.join(failed) if failed else 'all checks passed'} ({total:.1f}s)", file=out)
    return 1 if failed else 0


def main() -> int:
    return report(run_checks())
