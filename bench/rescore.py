"""Re-score saved `ponder eval --out` results with the current scorer (`core.reasoning.voting`), from their saved text.

    python -m bench.rescore                      # every bench/results/eval_*.json
    python -m bench.rescore bench/results/eval_math500_reason_greedy.json

Each question's correctness is recomputed from its saved reply text against the data file's gold answer; a
parallel run whose candidates kept their text also gets its votes and pass@N recomputed (and its `votes_*`
files rewritten). What cannot be recomputed is said in the file's `rescore` block: a summary without
per-question text, or candidates saved without their text (their answers were extracted by the old scorer).
The figures the file held before its first re-scoring stay in `rescore.previous`. Files are rewritten atomically.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from core.data.datasets import load_items
from core.reasoning.voting import METHODS, is_correct, score_candidates, vote

RESULTS = Path(__file__).parent / "results"
SCORER = ("core.reasoning.voting.is_correct: math-verify on the whole reply, verify(gold, answer); last number only for "
          "integer golds")
FIGURES = ("accuracy", "accuracy_weighted", "accuracy_majority", "accuracy_best", "pass_at_n")


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def golds_for(data: dict, root: Path) -> dict[int, str]:
    path = Path(data["data"])
    items = load_items(path if path.is_absolute() else root / path)
    return {i: item.gold for i, item in enumerate(items)}


def replay_votes(candidates: list[dict]) -> dict:
    """Each method's pick under the current vote rules, from the saved answers and scores; a pick is as right as
    the candidate's saved `correct` flag (for candidates saved without text, the old scorer's)."""
    scores = [1.0 if c["score"] is None else c["score"] for c in candidates]
    out = {"pass_at_n": any(c["correct"] for c in candidates)}
    for method in METHODS:
        v = vote([c["answer"] for c in candidates], scores, method)
        out[f"correct_{method}"] = v.winner_index is not None and bool(candidates[v.winner_index]["correct"])
        out[f"tie_{method}"] = v.tie
    return out


def rescore(data: dict, golds: dict[int, str] | None) -> dict:
    """The result with every figure its saved text allows recomputed; `rescore` says what was and was not."""
    previous = data.get("rescore", {}).get("previous") or {k: data[k] for k in FIGURES if k in data}
    questions = data.get("questions") or []
    texts = bool(questions) and golds is not None and all("text" in q for q in questions)
    parallel = any(q.get("candidates") for q in questions)
    cand_texts = texts and parallel and all("text" in c for q in questions for c in q.get("candidates", []))
    method = data.get("vote", "weighted")
    for q in questions:
        if texts:
            q["correct"] = is_correct(q["text"], golds[q["index"]])
        if q.get("candidates"):
            q.update(score_candidates(q["candidates"], golds[q["index"]]) if cand_texts
                     else replay_votes(q["candidates"]))
            if texts and not cand_texts:  # the reply is the pick the run made: its text is re-scored
                q[f"correct_{method}"] = q["correct"]
    out = dict(data)
    if texts:
        out["accuracy"] = statistics.fmean(q["correct"] for q in questions)
    if parallel:
        for m in METHODS:
            out[f"accuracy_{m}"] = statistics.fmean(q[f"correct_{m}"] for q in questions)
        out["pass_at_n"] = statistics.fmean(q["pass_at_n"] for q in questions)
        out["accuracy"] = out[f"accuracy_{method}"]
    if cand_texts or (texts and not parallel):
        done, note = [k for k in FIGURES if k in out], "every figure re-scored from the saved text"
    elif texts:
        done = ["accuracy", f"accuracy_{method}"]
        note = (f"candidates were saved without their text: the replies (the {method} vote's picks) are re-scored "
                "from their text; the other votes are replayed with the current rules (plain majority, ties to "
                "the earliest candidate) on the candidates' saved answers and correctness, which is the old "
                "scorer's (last \\boxed{} or last number, compared in the wrong order) and over-counts")
    elif parallel:
        done = []
        note = ("no text saved: the votes are replayed with the current rules (plain majority, ties to the earliest "
                "candidate) on the candidates' saved answers and correctness, which is the old scorer's and "
                "over-counts")
    else:
        done, note = [], "no per-question text saved: the figures are the old scorer's and cannot be re-scored"
    out["rescore"] = {"scorer": SCORER, "rescored": done, "not_rescorable": [k for k in FIGURES if k in out
                                                                            and k not in done],
                      "note": note, "previous": previous}
    return out


def mark_votes(votes_path: Path, note: str) -> None:
    """Flag a `votes_*` file computed from candidates that cannot be re-scored."""
    votes = json.loads(votes_path.read_text())
    votes["rescore"] = {"rescorable": False, "note": note}
    write_atomic(votes_path, json.dumps(votes, indent=2) + "\n")
    md = votes_path.with_suffix(".md")
    if md.is_file():
        kept = "\n".join(line for line in md.read_text().splitlines() if not line.startswith("**Not re-scorable"))
        write_atomic(md, f"{kept.rstrip()}\n\n**Not re-scorable**: {note}.\n")


def main(argv=None) -> int:
    from bench import votes as votes_bench

    p = argparse.ArgumentParser(prog="python -m bench.rescore")
    p.add_argument("results", nargs="*", type=Path, help="eval_*.json files (default: all in bench/results)")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="folder the results' data paths are relative to")
    args = p.parse_args(argv)
    for path in args.results or sorted(RESULTS.glob("eval_*.json")):
        data = json.loads(path.read_text())
        golds = golds_for(data, args.root) if data.get("questions") else None
        new = rescore(data, golds)
        write_atomic(path, json.dumps(new, indent=2))
        info = new["rescore"]
        figures = ", ".join(f"{k} {info['previous'][k]:.3f} -> {new[k]:.3f}"
                            + ("" if k in info["rescored"] else " (old scorer)") for k in FIGURES if k in new)
        print(f"{path.name}: {figures}" + ("" if info["rescored"] else " — not re-scorable"))
        votes_path = path.with_name(f"votes_{path.stem.removeprefix('eval_')}.json")
        if any(q.get("candidates") for q in new.get("questions") or []):
            votes_bench.main([str(path)])
            if "accuracy_majority" not in new["rescore"]["rescored"]:
                mark_votes(votes_path, "the candidates were saved without their text: the votes are replayed with "
                           "the current rules on their saved answers, but their correctness is the old scorer's, "
                           "which over-counts")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
