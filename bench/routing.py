"""Auto against Fast and Reason on one question file: accuracy per part, tokens, and where Auto sent each question.

    python -m bench.routing --fast FAST.json --reason REASON.json --auto AUTO.json [--tag T]

Three `ponder eval --out` files of the same rows (Fast: `--mode base`, Reason: `--mode reason`, Auto: `--mode
auto`). Where the data file has a `<name>.subsets.json` beside it (scripts.make_mixed_dev writes one for the mixed
dev set), each part gets its own row. Tokens are what each answer generated, thinking and answer together — the
time Auto saves against Reason (the files' latencies are not comparable: Fast and Reason ran in batches of 8,
Auto one question at a time). The oracle column is the bound on any switcher over the scored rows: per question
the mode that is right where only one is, else the cheaper. Rows without a gold answer (chat instructions) count
for tokens and routing, not accuracy ("—"). Writes bench/results/routing[_T].{json,md}; #39's target is Auto at
least max(Fast, Reason) over the file's scored rows, with fewer tokens than Reason over all of them.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.machine import write_results


def load(path: Path, mode: str) -> dict:
    run = json.loads(Path(path).read_text())
    if run.get("mode") != mode:
        raise SystemExit(f"{path}: a --mode {mode} evaluation is expected here, not {run.get('mode')}")
    if run.get("partial"):
        raise SystemExit(f"{path} is a partial run")
    return run


def summary(runs: dict[str, dict], lo: int, hi: int) -> dict | None:
    """Each run's accuracy, tokens and Reason share over the rows [lo, hi) of the file; None when it has none."""
    out = {}
    for name, run in runs.items():
        rows = [q for q in run["questions"] if lo <= q["index"] < hi]
        if not rows:
            return None
        out["n"] = len(rows)  # the same for every run: they cover the same rows (checked by `main`)
        graded = [q["correct"] for q in rows if q["correct"] is not None]  # chat rows: timed, not scored
        out["graded"] = len(graded)
        out[name] = {"accuracy": sum(graded) / len(graded) if graded else None,
                     "tokens": sum(map(tokens, rows)) / len(rows),
                     "reasoned_share": sum(q["reasoned"] for q in rows) / len(rows)}
    out["oracle"] = oracle(runs["fast"], runs["reason"], lo, hi)
    return out


def tokens(q: dict) -> int:
    return q["thinking_tokens"] + q["answer_tokens"]


def oracle(fast: dict, reason: dict, lo: int, hi: int) -> dict | None:
    """The bound on routing over the scored rows [lo, hi): per question the mode that is right where only one is,
    else the one that spends fewer tokens — the most accurate and, at that accuracy, the cheapest any switcher can
    be with these two runs' answers. None where no row is scored."""
    by_index = {q["index"]: q for q in fast["questions"]}
    pairs = [(by_index[q["index"]], q) for q in reason["questions"] if lo <= q["index"] < hi and q["correct"] is not None]
    if not pairs:
        return None
    picks = [r if r["correct"] > f["correct"] or (r["correct"] == f["correct"] and tokens(r) < tokens(f)) else f
             for f, r in pairs]
    n = len(pairs)
    return {"accuracy": sum(q["correct"] for q in picks) / n, "tokens": sum(map(tokens, picks)) / n,
            "reason_share": sum(p is r for p, (_, r) in zip(picks, pairs, strict=True)) / n,
            "scored_tokens": {"fast": sum(tokens(f) for f, _ in pairs) / n, "reason": sum(tokens(r) for _, r in pairs) / n}}


def check_comparable(runs: dict[str, dict]) -> None:
    """The three runs answer the same rows of the same file with the same weights; Reason and Auto think with the
    same budget."""
    for key in ("data", "model", "precision", "kv"):
        if len({str(r.get(key)) for r in runs.values()}) != 1:
            raise SystemExit(f"the three evaluations differ in {key}: {[r.get(key) for r in runs.values()]}")
    if len({frozenset(q["index"] for q in r["questions"]) for r in runs.values()}) != 1:
        raise SystemExit("the three evaluations do not cover the same rows")
    if runs["reason"]["budget"] != runs["auto"]["budget"]:
        raise SystemExit(f"Reason thought with budget {runs['reason']['budget']}, Auto with {runs['auto']['budget']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.routing", description=__doc__.split("\n\n")[0])
    p.add_argument("--fast", type=Path, required=True)
    p.add_argument("--reason", type=Path, required=True)
    p.add_argument("--auto", type=Path, required=True)
    p.add_argument("--tag", default="")
    args = p.parse_args(argv)
    runs = {"fast": load(args.fast, "base"), "reason": load(args.reason, "reason"), "auto": load(args.auto, "auto")}
    check_comparable(runs)
    data = Path(runs["auto"]["data"])
    sidecar = data.with_name(data.stem + ".subsets.json")
    parts = json.loads(sidecar.read_text()) if sidecar.is_file() else {}
    if not parts:
        print(f"no {sidecar} beside the data: one row for the whole file", file=sys.stderr)
    n = runs["fast"]["n"]
    result = {"data": str(data), "files": {k: str(v) for k, v in vars(args).items() if k != "tag"},
              "model": runs["auto"]["model"], "precision": runs["auto"]["precision"],
              "budget": runs["auto"]["budget"], "systems": {k: r.get("system") for k, r in runs.items()},
              "parts": {name: part for name, (lo, hi) in parts.items() if (part := summary(runs, lo, hi))},
              "all": summary(runs, 0, 10**9)}
    if result["all"]["graded"] == 0:
        raise SystemExit("no row of the file has a gold answer: nothing to compare accuracy on")
    best = max(result["all"]["fast"]["accuracy"], result["all"]["reason"]["accuracy"])
    result["auto_at_least_best"] = result["all"]["auto"]["accuracy"] >= best
    result["auto_fewer_tokens_than_reason"] = result["all"]["auto"]["tokens"] < result["all"]["reason"]["tokens"]
    md = ["| part | n | Fast | Reason | Auto | Auto sent to Reason | tokens Fast / Reason / Auto | oracle routing: "
          "accuracy, tokens |", "|---|---:|---:|---:|---:|---:|---|---|"]
    for name, s in [*result["parts"].items(), ("all", result["all"])]:
        acc = {k: "—" if s[k]["accuracy"] is None else f"{s[k]['accuracy']:.1%}" for k in runs}
        md.append(f"| {name} | {s['n']} | {acc['fast']} | {acc['reason']} | **{acc['auto']}** | "
                  f"{s['auto']['reasoned_share']:.0%} | "
                  f"{s['fast']['tokens']:.0f} / {s['reason']['tokens']:.0f} / {s['auto']['tokens']:.0f} | "
                  + ("—" if s["oracle"] is None else f"{s['oracle']['accuracy']:.1%}, {s['oracle']['tokens']:.0f}")
                  + " |")
    md += ["", f"{result['model']}, budget {result['budget']}, {n} questions of {data.name}: Auto "
           f"{'is' if result['auto_at_least_best'] else 'is not'} at least the better mode's accuracy, with "
           f"{'fewer' if result['auto_fewer_tokens_than_reason'] else 'no fewer'} tokens than Reason."]
    write_results("routing" + (f"_{args.tag}" if args.tag else ""), result, md, print_json=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
