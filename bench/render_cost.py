"""What the message renderer costs: import time (ui.markdown_render; matplotlib's mathtext on the first formula,
or on a thread by math_render.warm_up()), milliseconds to render a ~2,000-token Markdown answer with 10 formulas
and 3 code blocks (first render, cold caches, warm caches), the per-call cost while that answer streams in (a
render every ~10 tokens, `streaming=True`, as the view re-renders the live message every 50-100 ms), what Qt then
pays to lay the HTML out (QTextDocument.setHtml), and the memory (RSS) the renderer and matplotlib add.

`python -m bench.render_cost [--json]`; writes bench/results/render_cost.json and render_cost.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
CHARS_PER_TOKEN = 4  # English prose and code with a Qwen2.5 tokenizer: about 4 characters a token

PROSE = ("To see why, write the quantity in terms of what we already know and simplify step by step; each "
         "line follows from the one before it, so a mistake is easy to spot when you check the units. ")
FORMULAS_INLINE = [r"$x^2 + y^2 = r^2$", r"\(\frac{a}{b} \cdot \frac{c}{d}\)", r"$\sqrt{2} \approx 1.414$",
                   r"$\sum_{i=1}^{n} i = \frac{n(n+1)}{2}$", r"$e^{i\pi} + 1 = 0$", r"$\binom{n}{k}$"]
FORMULAS_DISPLAY = ["$$\n\\int_0^1 x^2 \\, dx = \\frac{1}{3}\n$$", "\\[\nx = \\frac{-b \\pm \\sqrt{b^2-4ac}}{2a}\n\\]",
                    "$$\\lim_{n \\to \\infty} \\left(1 + \\frac{1}{n}\\right)^n = e$$"]
BOXED = r"So the answer is \boxed{42}."
CODE = {
    "python": "def mean(xs: list[float]) -> float:\n    if not xs:\n        raise ValueError('empty <list>')\n"
              "    total = 0.0\n    for x in xs:\n        total += x  # a & b\n    return total / len(xs)\n",
    "javascript": "function clamp(x, lo, hi) {\n  if (x < lo) return lo;\n  if (x > hi) return hi;\n"
                  "  return x && x;\n}\nconsole.log(clamp(5, 0, 3));\n",
    "c": "#include <stdio.h>\nint main(void) {\n    for (int i = 0; i < 10; i++) {\n"
         "        printf(\"%d\\n\", i * i);\n    }\n    return 0;\n}\n",
}


def answer(tokens: int = 2000) -> str:
    """A ~`tokens`-token answer: headings, prose, 6 inline + 3 display formulas + 1 \\boxed, 3 code blocks."""
    parts, k = ["## Working it out\n"], 0
    sections = list(zip(FORMULAS_DISPLAY, CODE.items(), strict=True))
    for disp, (lang, code) in sections:
        for _ in range(2):
            parts.append(PROSE * 3 + f"Here {FORMULAS_INLINE[k]} holds. " + PROSE * 2 + "\n")
            k += 1
        parts.append(disp + "\n")
        parts.append(f"```{lang}\n{code}```\n")
        parts.append("- a point about it\n- and another, with `inline < code > & more`\n")
    text = "\n".join(parts)
    while len(text) < tokens * CHARS_PER_TOKEN - len(BOXED) - 10:
        text += "\n" + PROSE * 2 + "\n"
    return text + "\n" + BOXED + "\n"


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def ms(seconds: float) -> float:
    return round(1000 * seconds, 2)


def layout_ms(rendered, width: int = 700) -> float:
    from PySide6.QtCore import QUrl
    from PySide6.QtGui import QTextDocument

    t = time.perf_counter()
    doc = QTextDocument()
    for url, image in rendered.images.items():
        doc.addResource(QTextDocument.ResourceType.ImageResource, QUrl(url), image)
    doc.setHtml(rendered.html)
    doc.setTextWidth(width)
    doc.size()  # forces the layout
    return ms(time.perf_counter() - t)


def sync_first_render() -> float:
    """In a fresh process: the first render of the answer with nothing warmed up (what the GUI thread pays
    when a chat with math is opened before any answer streamed)."""
    code = ("import os, time; from PySide6.QtWidgets import QApplication; app = QApplication([]);"
            "from ui.markdown_render import render_markdown; from bench.render_cost import answer; t = answer();"
            "s = time.perf_counter(); render_markdown(t); print(1000 * (time.perf_counter() - s))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "QT_QPA_PLATFORM": "offscreen"}, cwd=Path(__file__).resolve().parents[1])
    return round(float(out.stdout.strip().splitlines()[-1]), 2)


def measure() -> dict:
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([])  # noqa: F841 (QImage/QPainter need it)
    rss0 = rss_mb()
    assert "matplotlib" not in sys.modules
    t = time.perf_counter()
    from ui import markdown_render, math_render

    import_renderer = time.perf_counter() - t
    rss_renderer = rss_mb()
    text = answer()
    # mathtext and pygments warmed up on their threads (as when an answer starts streaming): how long, and how
    # long the GUI thread's 5 ms sleeps overran meanwhile (the GIL it has to share)
    t = time.perf_counter()
    markdown_render.warm_up()
    threads, gaps = [math_render.warming(), markdown_render._warm_code], []
    while any(th.is_alive() for th in threads):
        tick = time.perf_counter()
        time.sleep(0.005)
        gaps.append(time.perf_counter() - tick - 0.005)
    warm_up = time.perf_counter() - t
    t = time.perf_counter()
    markdown_render.render_markdown("# warm-up\n\n```python\nx = 1\n```\n")
    first_no_math = time.perf_counter() - t
    rss_math = rss_mb()
    t = time.perf_counter()
    first = markdown_render.render_markdown(text, key_prefix="m1-")
    first_render = time.perf_counter() - t
    assert len(first.code_blocks) == 3, first.code_blocks
    formulas = len(first.images)

    colds = []
    for _ in range(3):
        math_render.cache_clear()
        markdown_render.highlight.cache_clear()
        t = time.perf_counter()
        markdown_render.render_markdown(text, key_prefix="m1-")
        colds.append(time.perf_counter() - t)
    warms = []
    for _ in range(10):
        t = time.perf_counter()
        r = markdown_render.render_markdown(text, key_prefix="m1-")
        warms.append(time.perf_counter() - t)
    dark_t = time.perf_counter()
    markdown_render.render_markdown(text, key_prefix="m1-", dark=True)
    dark_cold = time.perf_counter() - dark_t
    rss_after = rss_mb()

    # streaming: the live message re-rendered every ~10 tokens (caches warm for what was already seen)
    math_render.cache_clear()
    markdown_render.highlight.cache_clear()
    step = 10 * CHARS_PER_TOKEN
    stream = []
    for end in range(step, len(text) + step, step):
        t = time.perf_counter()
        markdown_render.render_markdown(text[:end], key_prefix="m1-", streaming=True)
        stream.append(time.perf_counter() - t)
    stream_sorted = sorted(stream)
    lay = [layout_ms(r) for _ in range(5)]
    return {
        "answer_chars": len(text),
        "answer_tokens_est": len(text) // CHARS_PER_TOKEN,
        "formula_images": formulas,
        "code_blocks": len(first.code_blocks),
        "html_chars": len(first.html),
        "import_renderer_ms": ms(import_renderer),
        "first_render_without_math_ms": ms(first_no_math),
        "sync_first_render_with_math_ms": sync_first_render(),
        "warm_up_thread_ms": ms(warm_up),
        "gui_thread_max_stall_during_warm_up_ms": ms(max(gaps, default=0.0)),
        "first_render_after_warm_up_ms": ms(first_render),
        "cold_cache_render_ms": ms(statistics.median(colds)),
        "cold_cache_dark_render_ms": ms(dark_cold),
        "warm_render_ms": ms(statistics.median(warms)),
        "warm_render_min_ms": ms(min(warms)),
        "streaming_calls": len(stream),
        "streaming_median_ms": ms(statistics.median(stream)),
        "streaming_p95_ms": ms(stream_sorted[int(0.95 * (len(stream) - 1))]),
        "streaming_max_ms": ms(max(stream)),
        "streaming_last_call_ms": ms(stream[-1]),
        "qt_layout_ms": statistics.median(lay),
        "rss_base_mb": round(rss0, 1),
        "rss_added_by_renderer_import_mb": round(rss_renderer - rss0, 1),
        "rss_added_by_mathtext_warm_up_mb": round(rss_math - rss_renderer, 1),
        "rss_added_total_mb": round(rss_after - rss0, 1),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python "
                   f"{platform.python_version()}",
    }


def report(r: dict) -> str:
    return "\n".join([
        "# Renderer cost (ui/markdown_render.py + ui/math_render.py)",
        "",
        f"Answer: {r['answer_chars']} characters (≈{r['answer_tokens_est']} tokens), {r['formula_images']} formula "
        f"images (10 formulas, one with \\boxed), {r['code_blocks']} highlighted code blocks; {r['machine']}.",
        "",
        "| what | ms |",
        "|---|---:|",
        f"| import ui.markdown_render (markdown-it-py, plugins; no matplotlib) | {r['import_renderer_ms']} |",
        f"| first render after the warm-up, no math (headings, a python block) | {r['first_render_without_math_ms']} |",
        f"| first render of the answer in a fresh process, no warm-up (matplotlib import and fonts on the GUI "
        f"thread) | {r['sync_first_render_with_math_ms']} |",
        f"| markdown_render.warm_up(): mathtext import + fonts, pygments, on their threads | {r['warm_up_thread_ms']} |",
        f"| … longest GUI-thread stall meanwhile (5 ms sleeps) | {r['gui_thread_max_stall_during_warm_up_ms']} |",
        f"| first render of the answer after the warm-up | {r['first_render_after_warm_up_ms']} |",
        f"| render, cold caches (every formula typeset, code highlighted) | {r['cold_cache_render_ms']} |",
        f"| render in the dark palette, cold for dark images | {r['cold_cache_dark_render_ms']} |",
        f"| render, warm caches (median of 10) | {r['warm_render_ms']} |",
        f"| streaming: per call, median of {r['streaming_calls']} (every ~10 tokens) | {r['streaming_median_ms']} |",
        f"| streaming: per call, p95 | {r['streaming_p95_ms']} |",
        f"| streaming: per call, max (a formula or code block completing) | {r['streaming_max_ms']} |",
        f"| streaming: last call (whole answer) | {r['streaming_last_call_ms']} |",
        f"| Qt: QTextDocument.setHtml + layout of the result at 700 px (view's cost) | {r['qt_layout_ms']} |",
        "",
        "| memory (RSS) | MB |",
        "|---|---:|",
        f"| base (Python + PySide6 QApplication) | {r['rss_base_mb']} |",
        f"| added by importing the renderer | {r['rss_added_by_renderer_import_mb']} |",
        f"| added by the mathtext warm-up (matplotlib, fonts) | {r['rss_added_by_mathtext_warm_up_mb']} |",
        f"| added in all after the runs (caches full) | {r['rss_added_total_mb']} |",
        "",
    ])


def main(argv=None) -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    result = measure()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "render_cost.json").write_text(json.dumps(result, indent=2))
    md = report(result)
    (RESULTS / "render_cost.md").write_text(md)
    print(json.dumps(result) if args.json else md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
