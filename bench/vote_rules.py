"""Which vote rule picks best, on a verifier's own training samples, every learned score out of fold.

`ponder train verifier --features-cache F` leaves F (hidden states `x`, correctness `y`, question `groups`, and
`extras`: mean and lowest-window token log-prob and vote share) and F.candidates.jsonl (each candidate's final
answer, correctness and log-prob statistics, in the same order). This bench votes each question's samples by
every rule #39 asks to compare, on the same samples:

- `majority` (ties to the earliest sample), `pass` (any right: the bound every rule sits under);
- DeepConf's confidences: `confidence` (weights exp(mean log-prob)), `lowest` (exp(lowest-window mean)),
  `deepconf` (the more confident half by lowest window, then `lowest`);
- `head`: the hidden-state head's Platt-scaled probability, the head refitted on the other folds (by question);
- `combiner`: the shipped kind of combined score (logistic regression on the head's out-of-fold logit, both
  log-prob statistics and the vote share), itself refitted on the other folds; `combiner-no-share` without the
  vote share (a weighted vote already counts agreement); `best` the combiner's single top sample;
- `answers`: a ranker of a question's distinct answers rather than its samples (answers grouped as the vote groups
  them; logistic regression on each answer's vote share, its samples' mean and best mean log-prob, mean
  lowest-window log-prob, and mean and best head logit; right or wrong as its first sample), refitted on the other
  folds, L2 by out-of-fold log-loss; the top-scoring answer wins (ties: more votes, then the earliest).

With `--shipped DIR` (a saved verifier, e.g. `resources/components/<model>/verifier`) two more rows score these
samples as the app would with that verifier, untrained on them: `shipped-head` (its calibrated head probability,
weighted) and `shipped` (the app's rule: its combiner's probability where it has one for this temperature, else the
head's; a head saved with `"vote": "majority"` votes by count, so for it the `majority` row is the app's). On
samples the shipped head never saw, this is a held-out measure of the component as shipped.

Each rule's accuracy, its within-question AUC, and its wins and losses against majority on the same questions
are written to `--out` as JSON and Markdown. The L2 strengths are chosen by cross-validation on all questions (one
number each; the scores themselves are out of fold). `python -m bench.vote_rules F --out PREFIX`.
"""
from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from pathlib import Path

import torch
from safetensors.torch import load_file

from core.reasoning.voting import same_answer, vote
from core.training.combiner import L2, oof_scores, within_question_auc
from core.training.heads import oof_logits, pick_weight_decay, platt_scaling

RULES = ("majority", "confidence", "lowest", "deepconf", "head", "combiner", "combiner-no-share", "best", "answers")
ANSWER_FEATURES = ("count", "logprob_mean", "logprob_best", "lowest_mean", "head_mean", "head_best")


def load(cache: Path, candidates: Path | None = None) -> tuple[dict, list[dict]]:
    """The features cache and its candidates, checked to describe the same samples in the same order."""
    data = load_file(str(cache))
    done = int(data["done"].item())
    keep = data["groups"] < done
    data = {k: (v[keep] if k in ("x", "y", "groups", "extras", "layers") else v) for k, v in data.items()}
    data["x"] = data["x"].float()  # caches hold bfloat16 states, older committed copies float16
    with open(candidates or f"{cache}.candidates.jsonl", encoding="utf-8") as f:
        rows = [r for r in map(json.loads, f) if r["question_index"] < done]
    if len(rows) != len(data["y"]) or any(
            r["question_index"] != int(g) or bool(r["correct"]) != bool(y)
            for r, g, y in zip(rows, data["groups"], data["y"], strict=True)):
        raise SystemExit(f"{cache} and its candidates file do not describe the same samples.")
    return data, rows


def learned_scores(data: dict, rows: list[dict], weight_decay: float | None, seed: int,
                   raw: bool = False) -> tuple[dict, dict]:
    """Out-of-fold scores: per candidate the head's calibrated probability and the two combiners' probabilities
    (their logits with `raw`); per question (`answers`, not with `raw`) its distinct answers' ranker scores."""
    x, y, groups, extras = data["x"], data["y"], data["groups"], data["extras"].double()
    if weight_decay is None:
        weight_decay, _ = pick_weight_decay(x, y, groups, x.shape[1], seed=seed)
    logits = oof_logits(x, y, groups, x.shape[1], weight_decay, seed=seed).double()
    cal = platt_scaling(logits, y)
    head_logit = logits * cal["scale"] + cal["shift"]
    scores, settings = {"head": torch.sigmoid(head_logit)}, {"head_weight_decay": weight_decay, "platt": cal}
    for name, feats in (("combiner", torch.cat([head_logit[:, None], extras], 1)),
                        ("combiner-no-share", torch.cat([head_logit[:, None], extras[:, :2]], 1))):
        cv = {l2: within_question_auc(oof_scores(feats, y, groups, l2, seed=seed), y, groups) or 0.0 for l2 in L2}
        l2 = max(cv, key=cv.get)
        combined = oof_scores(feats, y, groups, l2, seed=seed)
        scores[name] = combined if raw else torch.sigmoid(combined)
        settings[f"{name}_l2"] = l2
    if not raw:
        scores["answers"], settings["answers_l2"] = answer_scores(rows, head_logit, seed)
    return scores, settings


def answer_groups(rows: list[dict]) -> list[tuple[int, list[int]]]:
    """(question, its rows) for each distinct final answer, grouped as `vote` groups them (`same_answer` against a
    group's first answer; samples without an answer left out), in order of first appearance."""
    groups: list[tuple[int, list[int]]] = []
    open_groups: dict[int, list[list[int]]] = {}
    for i, r in enumerate(rows):
        if r["final_answer"] is None:
            continue
        q = r["question_index"]
        for members in open_groups.setdefault(q, []):
            if same_answer(rows[members[0]]["final_answer"], r["final_answer"]):
                members.append(i)
                break
        else:
            open_groups[q].append([i])
            groups.append((q, open_groups[q][-1]))
    return groups


def answer_features(rows: list[dict], members: list[int], size: int, head_logit: torch.Tensor) -> list[float]:
    """One distinct answer's ANSWER_FEATURES; `size` is its question's number of samples."""
    means, lows = [rows[i]["logprob_mean"] for i in members], [rows[i]["logprob_lowest"] for i in members]
    values = {"count": len(members) / size, "logprob_mean": sum(means) / len(means), "logprob_best": max(means),
              "lowest_mean": sum(lows) / len(lows), "head_mean": float(head_logit[members].mean()),
              "head_best": float(head_logit[members].max())}
    return [values[name] for name in ANSWER_FEATURES]


def answer_scores(rows: list[dict], head_logit: torch.Tensor, seed: int) -> tuple[dict, float]:
    """Per question, its distinct answers as (ranker score out of fold by question, votes, first row, right);
    the L2 strength chosen by out-of-fold log-loss."""
    groups = answer_groups(rows)
    sizes = Counter(r["question_index"] for r in rows)
    x = torch.tensor([answer_features(rows, m, sizes[q], head_logit) for q, m in groups], dtype=torch.float64)
    y = torch.tensor([float(bool(rows[m[0]]["correct"])) for _, m in groups], dtype=torch.float64)
    question = torch.tensor([q for q, _ in groups])
    cv = {l2: oof_scores(x, y, question, l2, seed=seed) for l2 in L2}
    l2 = min(cv, key=lambda k: float(torch.nn.functional.binary_cross_entropy_with_logits(cv[k], y)))
    ranked: dict[int, list[tuple]] = {}
    for (q, m), score, right in zip(groups, cv[l2].tolist(), y.tolist(), strict=True):
        ranked.setdefault(q, []).append((score, len(m), m[0], bool(right)))
    return ranked, l2


def shipped_scores(data: dict, folder: Path) -> dict:
    """The saved verifier's scores of every candidate, computed as `Engine._combine` computes them."""
    from core.reasoning.verifier import Verifier, combined_features
    from core.training.heads import SAMPLING_TEMPERATURE

    verifier = Verifier.load(folder)
    head = torch.tensor(verifier.scores(data["x"]), dtype=torch.float64)
    scores = {"shipped-head": head, "shipped": head}
    if verifier.combines(SAMPLING_TEMPERATURE):
        scores["shipped"] = torch.tensor(verifier.combine(
            [combined_features(float(p), *map(float, e)) for p, e in zip(head, data["extras"], strict=True)]),
            dtype=torch.float64)
    if verifier.vote == "majority":  # the app votes by count: its rule is the `majority` row
        del scores["shipped"]
    return scores


def pick(cands: list[dict], rule: str, scores: dict) -> bool:
    """Is the answer `rule` picks from one question's candidates right?"""
    answers = [c["final_answer"] for c in cands]
    if rule == "majority":
        v = vote(answers, None, "majority")
    elif rule in ("confidence", "lowest", "deepconf"):
        key = "logprob_mean" if rule == "confidence" else "logprob_lowest"
        kept = cands
        if rule == "deepconf":
            cut = sorted((c[key] for c in cands), reverse=True)[(len(cands) + 1) // 2 - 1]
            kept = [c for c in cands if c[key] >= cut]
        v = vote([c["final_answer"] for c in kept], [math.exp(c[key]) for c in kept], "weighted")
        return v.winner_index is not None and bool(kept[v.winner_index]["correct"])
    elif rule == "answers":  # the top score; ties to more votes, then the earliest answer
        ranked = scores["answers"].get(cands[0]["question_index"], [])
        return bool(ranked) and max(ranked, key=lambda a: (a[0], a[1], -a[2]))[3]
    else:
        source = "combiner" if rule == "best" else rule
        v = vote(answers, [float(scores[source][c["_row"]]) for c in cands], "best" if rule == "best" else "weighted")
    return v.winner_index is not None and bool(cands[v.winner_index]["correct"])


def compare(data: dict, rows: list[dict], scores: dict) -> dict:
    by_q: dict[int, list[dict]] = {}
    for i, r in enumerate(rows):
        by_q.setdefault(r["question_index"], []).append({**r, "_row": i})
    rules = RULES + tuple(k for k in scores if k.startswith("shipped"))
    right = {rule: [pick(c, rule, scores) for c in by_q.values()] for rule in rules}
    n = len(by_q)
    y, groups = data["y"], data["groups"]
    aucs = {"confidence": within_question_auc(data["extras"][:, 0], y, groups),
            "lowest": within_question_auc(data["extras"][:, 1], y, groups),
            "vote share": within_question_auc(data["extras"][:, 2], y, groups),
            **{k: within_question_auc(v.float(), y, groups) for k, v in scores.items() if k != "answers"}}
    table = {}
    for rule in rules:
        wins = sum(a and not b for a, b in zip(right[rule], right["majority"], strict=True))
        losses = sum(b and not a for a, b in zip(right[rule], right["majority"], strict=True))
        table[rule] = {"accuracy": round(100 * sum(right[rule]) / n, 1), "right": sum(right[rule]),
                       "wins_vs_majority": wins, "losses_vs_majority": losses}
    passed = sum(any(c["correct"] for c in cands) for cands in by_q.values())
    return {"questions": n, "candidates": len(rows), "right_share": round(float(y.mean()), 3),
            "pass": round(100 * passed / n, 1), "rules": table, "within_question_auc": aucs,
            "questions_with_both": sum(0 < sum(c["correct"] for c in cands) < len(cands) for cands in by_q.values())}


def markdown(result: dict, source: str) -> str:
    lines = [f"# Vote rules on `{source}`", "",
             f"{result['questions']} questions, {result['candidates']} candidates, {result['right_share']:.1%} right, "
             f"{result['questions_with_both']} questions with right and wrong answers; pass@all "
             f"**{result['pass']}%**. Learned scores out of fold by question (settings in the JSON).", "",
             "| rule | accuracy | right | wins / losses against majority | within-question AUC of its score |",
             "|---|---:|---:|---|---:|"]
    for rule, row in result["rules"].items():
        auc = result["within_question_auc"].get(rule if rule != "best" else "combiner")
        lines.append(f"| {rule} | {row['accuracy']}% | {row['right']} | {row['wins_vs_majority']} / "
                     f"{row['losses_vs_majority']} | {'' if auc is None else auc} |")
    lines += ["", f"Vote share's own within-question AUC: {result['within_question_auc']['vote share']}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cache", type=Path, help="a verifier features cache with extras (and its .candidates.jsonl)")
    ap.add_argument("--candidates", type=Path, help="its candidates JSONL (default: <cache>.candidates.jsonl)")
    ap.add_argument("--out", type=Path, required=True, help="output prefix (.json and .md are written)")
    ap.add_argument("--weight-decay", type=float, help="the head's L2 (default: chosen by cross-validation)")
    ap.add_argument("--seed", type=int, default=39)
    ap.add_argument("--shipped", type=Path, help="a saved verifier folder to score as the app would (held out when "
                                                  "it was trained on other samples)")
    args = ap.parse_args(argv)
    data, rows = load(args.cache, args.candidates)
    if "extras" not in data:
        raise SystemExit(f"{args.cache} has no log-prob / vote-share extras to compare.")
    scores, settings = learned_scores(data, rows, args.weight_decay, args.seed)
    if args.shipped is not None:
        scores.update(shipped_scores(data, args.shipped))
        settings["shipped"] = str(args.shipped)  # held out only if it was trained on other samples than these:
        settings["shipped_trained_on"] = json.loads((args.shipped / "head.json").read_text()).get("trained_on")
    result = {**compare(data, rows, scores), "settings": settings, "source": str(args.cache)}
    write_report(args.out, result, markdown(result, args.cache.name))


def write_report(out: Path, result: dict, md: str) -> None:
    """PREFIX.json and PREFIX.md (a prefix may hold dots), and the table on stdout."""
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    Path(f"{out}.md").write_text(md, encoding="utf-8")
    print(md)


if __name__ == "__main__":
    main()
