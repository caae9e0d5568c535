"""Voting at k = 1, 2, 4, 8 from one saved parallel evaluation (no decoding).

`ponder eval --parallel 8 --out FILE` keeps every question's candidates (text, final answer, verifier score,
correctness; `python -m bench.rescore` recomputes the correctness from the text). Splitting each question's 8
candidates into disjoint groups of k and voting inside each group gives majority@k (plain: ties go to the earliest
candidate), weighted@k (summed verifier scores) and best-of-k (highest score), averaged over the 8/k groups, plus
pass@k. Candidates saved with their token log-prob statistics (`core.reasoning.confidence`) are also voted by
confidence, as DeepConf does, on the same samples: `confidence` (summed exp(mean log-prob)), `lowest` (summed
exp(lowest-window mean)) and `deepconf` (the more confident half by lowest window, then `lowest`), and each
score's AUC among one question's own candidates is reported. `python -m bench.votes
bench/results/eval_math500_reason_par8.json` writes `votes_<name>.json` and `.md`.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from core.reasoning.voting import vote

METHODS = ("majority", "weighted", "best")
CONFIDENCE = ("confidence", "lowest", "deepconf")
"""Votes from the candidates' own token log-probs (when saved): weights exp(mean), exp(lowest window)."""
KEYS = {"confidence": "logprob_mean", "lowest": "logprob_lowest", "deepconf": "logprob_lowest"}


def has_confidence(questions: list[dict]) -> bool:
    return all(c.get("logprob_lowest") is not None for q in questions for c in q["candidates"])


def has_head_score(questions: list[dict]) -> bool:
    """Whether the head's own score was saved beside a combined one (then `head` votes with it alone)."""
    return all(c.get("head_score") is not None for q in questions for c in q["candidates"])


def methods_of(questions: list[dict]) -> tuple[str, ...]:
    """The votes these saved candidates support: always METHODS, then those whose inputs were saved."""
    return METHODS + (CONFIDENCE if has_confidence(questions) else ()) + (
        ("head",) if has_head_score(questions) else ())


def group_accuracy(candidates: list[dict], method: str) -> bool:
    """Is the answer `method` picks from these candidates right? (Equal answers share correctness.)"""
    if method in CONFIDENCE:
        key = KEYS[method]
        if method == "deepconf" and len(candidates) > 1:  # keep the more confident half (ties kept), then vote
            cut = sorted((c[key] for c in candidates), reverse=True)[(len(candidates) + 1) // 2 - 1]
            candidates = [c for c in candidates if c[key] >= cut]
        answers, scores, method = [c["answer"] for c in candidates], [math.exp(c[key]) for c in candidates], "weighted"
    elif method == "head":
        answers, scores, method = [c["answer"] for c in candidates], [c["head_score"] for c in candidates], "weighted"
    else:
        answers = [c["answer"] for c in candidates]
        scores = [1.0 if c["score"] is None else c["score"] for c in candidates]
    picked = vote(answers, scores, method).winner_index
    return picked is not None and bool(candidates[picked]["correct"])


def accuracy_at(questions: list[dict], k: int) -> dict:
    """Accuracy of each method and pass@k, averaged over disjoint groups of k candidates per question."""
    methods = methods_of(questions)
    per_method = {m: [] for m in methods}
    passes = []
    for q in questions:
        cands = q["candidates"]
        groups = [cands[i:i + k] for i in range(0, len(cands) - k + 1, k)]
        for m in methods:
            per_method[m].append(statistics.fmean(group_accuracy(g, m) for g in groups))
        passes.append(statistics.fmean(any(c["correct"] for c in g) for g in groups))
    out = {f"{m}@{k}": statistics.fmean(v) for m, v in per_method.items()}
    out[f"pass@{k}"] = statistics.fmean(passes)
    return out


def _auc(candidates: list[dict], key: str = "score") -> tuple[float, int] | None:
    """(wins, pairs): how often a right candidate outscores a wrong one (ties count half); None without pairs."""
    scored = [c for c in candidates if c.get(key) is not None]
    pos = [c[key] for c in scored if c["correct"]]
    neg = [c[key] for c in scored if not c["correct"]]
    if not pos or not neg:
        return None
    return sum((p > n) + 0.5 * (p == n) for p in pos for n in neg), len(pos) * len(neg)


def score_auc(questions: list[dict]) -> float | None:
    """AUC of the verifier scores over every candidate: P(a right answer outscores a wrong one); None without
    scores or without both kinds of answer. Mostly says which *questions* are easy."""
    pooled = _auc([c for q in questions for c in q["candidates"]])
    return None if pooled is None else pooled[0] / pooled[1]


def within_question_auc(questions: list[dict], key: str = "score") -> tuple[float | None, int]:
    """(mean over questions with both right and wrong candidates of the AUC among that question's own candidates,
    how many such questions): the ranking a weighted vote needs; 0.5 is a coin."""
    per_question = [w / n for w, n in filter(None, (_auc(q["candidates"], key) for q in questions))]
    return (statistics.fmean(per_question) if per_question else None), len(per_question)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.votes")
    p.add_argument("result", type=Path, help="a `ponder eval --parallel N --out` JSON file")
    args = p.parse_args(argv)
    data = json.loads(args.result.read_text())
    questions = [q for q in data.get("questions", []) if q.get("candidates")]
    if not questions:
        raise SystemExit(f"{args.result} has no per-question candidates (run ponder eval --parallel N --out FILE)")
    n_cand = min(len(q["candidates"]) for q in questions)
    ks = [k for k in (1, 2, 4, 8) if k <= n_cand]
    table = {k: accuracy_at(questions, k) for k in ks}
    name = args.result.stem.removeprefix("eval_")
    auc = score_auc(questions)
    within, mixed = within_question_auc(questions)
    with_text = all("text" in c for q in questions for c in q["candidates"])
    confident = has_confidence(questions)
    confidence_auc = {key: within_question_auc(questions, key)[0] for key in ("logprob_mean", "logprob_lowest")
                      } if confident else {}
    result = {"source": args.result.name, "n": len(questions), "data": data.get("data"), "verifier_auc": auc,
              "verifier_auc_within_question": within, "questions_with_right_and_wrong": mixed,
              "confidence_auc_within_question": confidence_auc, "by_k": table, "candidate_text": with_text}
    out = args.result.parent
    previous = out / f"votes_{name}.json"
    if previous.is_file() and "rescore" in (old := json.loads(previous.read_text())):
        result["rescore"] = old["rescore"]  # what `bench.rescore` said of this file stays with it
    (out / f"votes_{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    methods = methods_of(questions)
    heads = {"head": "weighted by the head alone",
             "best": "best-of-k", "confidence": "confidence (mean)", "lowest": "confidence (lowest window)",
             "deepconf": "DeepConf (top half)"}
    lines = [f"Voting from `{args.result.name}` ({len(questions)} questions), disjoint groups of k candidates:", "",
             "| k | " + " | ".join(heads.get(m, m) for m in methods) + " | pass@k |",
             "|---:|" + "---:|" * (len(methods) + 1)]
    for k, row in table.items():
        lines.append(f"| {k} | " + " | ".join(f"{row[f'{m}@{k}']:.1%}" for m in methods)
                     + f" | {row[f'pass@{k}']:.1%} |")
    if auc is not None:
        lines += ["", f"Verifier AUC over all {sum(len(q['candidates']) for q in questions)} candidates: {auc:.3f}"]
    if within is not None:
        lines += [f"Verifier AUC among one question's own candidates (mean over the {mixed} questions with right "
                  f"and wrong ones): {within:.3f}"]
    for key, value in confidence_auc.items():
        if value is not None:
            lines += [f"AUC of `{key}` among one question's own candidates: {value:.3f}"]
    if not with_text:
        lines += ["", "**Not re-scorable**: the candidates were saved without their text: the votes are replayed "
                  "with the current rules on their saved answers, but their correctness is the old scorer's, which "
                  "over-counts."]
    (out / f"votes_{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
