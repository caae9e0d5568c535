"""How long a newcomer waits for the first answer: a fresh clone, an empty data folder, then the same steps as
`make run` (the window runs them on its engine thread, showing each stage): the venv, the model's download,
conversion and preparation, and one question answered.

    python -m bench.first_answer [--model auto|ID] [--question TEXT]

Each step runs as its own command in a clone of this repository (HEAD) under a temporary folder, with
PONDER_HOME there, so nothing already prepared on this machine is reused; pip's download cache is (a machine
that never ran pip downloads about 1 GB more for the venv). Results: bench/results/first_answer_<model>[_<tag>].{json,md}.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.machine import cpu_name

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
QUESTION = "A shop sells pens at 3 dollars each. How much do 7 pens cost?"


def timed(cmd: list[str], cwd: Path, env: dict, log: Path) -> tuple[float, str]:
    start = time.perf_counter()
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=f, text=True)
        f.write(proc.stdout)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}); see {log}")
    return time.perf_counter() - start, proc.stdout


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="auto", help="'auto' (the window's first-launch choice) or a model id")
    p.add_argument("--question", default=QUESTION)
    p.add_argument("--keep", action="store_true", help="keep the temporary clone")
    p.add_argument("--tag", default="", help="suffix of the result files (a CPU family, say)")
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="ponder-first-"))
    clone, home, log = tmp / "ponder", tmp / "home", tmp / "log.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PONDER_"))}
    env.update(PONDER_HOME=str(home), QT_QPA_PLATFORM="offscreen", HF_HUB_OFFLINE="1")
    steps = {}
    steps["clone"], _ = timed(["git", "clone", "--quiet", str(ROOT), str(clone)], tmp, env, log)
    steps["venv"], _ = timed(["make", "install"], clone, env, log)
    ponder = str(clone / ".venv" / "bin" / "ponder")
    steps["setup"], out = timed([ponder, "setup", "--model", args.model], clone, env, log)
    chosen = re.search(r"Chosen for this computer: (.*)", out)
    ready = re.search(r"Ready: (.*) \((\S+)\) in (\S+)(?: \((.*)\))?", out)
    model_id = Path(ready.group(3)).name if ready else args.model
    stages = dict((k, float(v)) for k, v in re.findall(r"(\w[\w ]*?) (\d+) s", ready.group(4) or "")) if ready else {}
    steps["first answer"], answer = timed([ponder, "ask", "--model", model_id, "--json", args.question], clone, env, log)
    reply = json.loads(answer.strip().splitlines()[-1])
    total = sum(steps.values())
    report = {"model": model_id, "chosen": chosen.group(1) if chosen else None, "cpu": cpu_name(),
              "date": time.strftime("%Y-%m-%d %H:%M"), "seconds": {k: round(v, 1) for k, v in steps.items()},
              "setup_stages_s": stages, "total_s": round(total, 1), "question": args.question,
              "answer": reply.get("answer", reply), "log": str(log) if args.keep else None}
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = f"first_answer_{model_id}{'_' + args.tag if args.tag else ''}"
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [f"Fresh clone to first answer on {model_id}, {report['cpu']}, {report['date']}:", "",
             "| step | seconds |", "|---|---:|"]
    lines += [f"| {k} | {v:.0f} |" for k, v in steps.items()]
    lines += [f"| (setup: {k}) | {v:.0f} |" for k, v in stages.items()]
    lines += [f"| **total** | **{total:.0f}** |", ""]
    if report["chosen"]:
        lines.append(f"Chosen: {report['chosen']}")
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if not args.keep:
        subprocess.run(["rm", "-rf", str(tmp)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
