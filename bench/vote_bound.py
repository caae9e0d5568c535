"""How good a verifier a weighted vote needs to beat majority by a margin, on a verifier's own samples, and how fast
the hidden-state head gets better with more of them: the measured bound for #39's vote target.

Part 1 (simulated verifiers on the real samples). The samples, their final answers and whether each is right stay
as sampled; only the verifier's score is drawn: s = Δ·right + N(0, 1), so that a right answer outscores a wrong one
of the same question with probability Φ(Δ / √2), the within-question AUC. Each question's answers are voted with
weights exp(τ·s), the temperature τ chosen per AUC on the same samples (in-sample, every benefit of the doubt to
the verifier; τ = 0 is majority, large τ picks the single best-scored sample), averaged over `--seeds` draws. Out
comes the smallest within-question AUC at which the best weighted vote is `--margin` points above majority.

Part 2 (the learning curve of the real head). The hidden-state head (`core.training.heads`, its L2 chosen by
cross-validation on all the samples) is fitted on the samples of the first m questions of each training split
(5 folds by question) and scored on the held-out fold; the within-question AUC of those out-of-fold scores at each m
says how the head improves per doubling of its data, and a straight line in log2(m) says how many questions it would
need to reach Part 1's AUC, and at the sampling cost the features cache records, how many hours of this machine.

`python -m bench.vote_bound F --out PREFIX` (F: a features cache of `ponder train verifier`, with its
.candidates.jsonl), writes PREFIX.json and PREFIX.md.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from bench.vote_rules import answer_groups, load
from core.training.combiner import within_question_auc
from core.training.folds import question_folds
from core.training.heads import VERIFIER_LR, fit_head, pick_weight_decay
from models.heads import VerifierHead

TEMPERATURES = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 32.0)
AUCS = (0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.98)
SUBSETS = (25, 50, 100, 200, 400)


class Groups:
    """The samples' answer groups as flat tensors, so that a vote of every question is a few scatter ops."""

    def __init__(self, rows: list[dict]):
        groups = answer_groups(rows)
        questions = sorted({r["question_index"] for r in rows})
        self.n_questions = len(questions)
        qpos = {q: i for i, q in enumerate(questions)}
        member, gid = [], []
        for g, (_, members) in enumerate(groups):
            member += members
            gid += [g] * len(members)
        self.member, self.gid = torch.tensor(member), torch.tensor(gid)
        self.question = torch.tensor([qpos[q] for q, _ in groups])
        self.right = torch.tensor([bool(rows[m[0]]["correct"]) for _, m in groups], dtype=torch.float64)
        self.first = torch.tensor([m[0] for _, m in groups], dtype=torch.float64)

    def accuracy(self, weights: torch.Tensor) -> torch.Tensor:
        """weights (S, N) per sample → (S,) share of questions whose heaviest answer group is right (ties to the
        group seen first, as core.reasoning.voting.vote breaks them)."""
        s = weights.shape[0]
        sums = torch.zeros(s, len(self.right), dtype=torch.float64).index_add_(1, self.gid, weights[:, self.member])
        best = torch.full((s, self.n_questions), -math.inf, dtype=torch.float64)
        best = best.scatter_reduce(1, self.question.expand(s, -1), sums, "amax")
        top = sums >= best[:, self.question] * (1 - 1e-12)
        first = torch.where(top, self.first, math.inf)
        winner_first = torch.full((s, self.n_questions), math.inf, dtype=torch.float64)
        winner_first = winner_first.scatter_reduce(1, self.question.expand(s, -1), first, "amin")
        won = top & (first == winner_first[:, self.question])
        return (won * self.right).sum(1) / self.n_questions


def simulated(groups: Groups, y: torch.Tensor, seeds: int) -> list[dict]:
    """Part 1: per AUC level, majority and the best temperature's weighted vote, mean over `seeds` draws."""
    gen = torch.Generator().manual_seed(0)
    noise = torch.randn(seeds, len(y), generator=gen, dtype=torch.float64)
    majority = float(groups.accuracy(torch.ones(1, len(y), dtype=torch.float64))[0])
    out = []
    for auc in AUCS:
        delta = math.sqrt(2) * torch.distributions.Normal(0, 1).icdf(torch.tensor(auc)).item()
        s = delta * y.double() + noise
        by_t = {}
        for t in TEMPERATURES:
            w = torch.exp(t * (s - s.max(1, keepdim=True).values))  # scaled per draw: only ratios matter
            by_t[t] = float(groups.accuracy(w).mean())
        t_best = max(by_t, key=by_t.get)
        out.append({"auc": auc, "delta": round(delta, 3), "majority": round(100 * majority, 2),
                    "weighted_best": round(100 * by_t[t_best], 2), "temperature": t_best,
                    "gain": round(100 * (by_t[t_best] - majority), 2)})
    return out


def learning_curve(data: dict, weight_decay: float | None, seed: int) -> tuple[list[dict], float]:
    """Part 2: the head's out-of-fold within-question AUC when each fold's head sees m training questions."""
    x, y, groups = data["x"], data["y"], data["groups"]
    if weight_decay is None:
        weight_decay, _ = pick_weight_decay(x, y, groups, x.shape[1], seed=seed)
    folds = list(question_folds(groups, 5, seed))
    rows = []
    for m in SUBSETS:
        scores = torch.zeros(len(y))
        for tr, va in folds:
            train_questions = sorted({int(groups[i]) for i in tr})[:m]
            keep = torch.tensor([i for i in tr if int(groups[i]) in set(train_questions)])
            head = fit_head(VerifierHead(x.shape[1]), x[keep], y[keep], epochs=300, lr=VERIFIER_LR,
                            weight_decay=weight_decay, seed=seed)
            with torch.no_grad():
                scores[va] = head(x[va]).float()
        rows.append({"questions": min(m, len({int(g) for g in groups}) * 4 // 5),
                     "auc": within_question_auc(scores, y, groups)})
    return rows, weight_decay


def extrapolate(curve: list[dict], target_auc: float | None) -> dict | None:
    """Least-squares line AUC = a + b·log2(questions) through the curve; the questions it needs for target_auc."""
    pts = [(math.log2(r["questions"]), r["auc"]) for r in curve if r["auc"] is not None]
    if target_auc is None or len(pts) < 2:
        return None
    mx, my = sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)
    b = sum((p[0] - mx) * (p[1] - my) for p in pts) / sum((p[0] - mx) ** 2 for p in pts)
    a = my - b * mx
    need = None if b <= 0 else 2 ** ((target_auc - a) / b)
    return {"intercept": round(a, 4), "per_doubling": round(b, 4), "questions_needed": need}


def run(cache: Path, candidates: Path | None, margin: float, seeds: int, weight_decay: float | None,
        seed: int) -> dict:
    data, rows = load(cache, candidates)
    groups = Groups(rows)
    sim = simulated(groups, data["y"], seeds)
    needed = next((r["auc"] for r in sim if r["gain"] >= margin), None)
    curve, weight_decay = learning_curve(data, weight_decay, seed)
    line = extrapolate(curve, needed)
    n_q = groups.n_questions
    sec_per_q = float(data["seconds"].item()) / n_q if "seconds" in data else None
    hours = None
    if line and line["questions_needed"] and sec_per_q:
        hours = round(line["questions_needed"] * sec_per_q / 3600, 1)
    return {"source": str(cache), "questions": n_q, "candidates": len(rows), "margin": margin, "seeds": seeds,
            "simulated": sim, "auc_needed": needed, "head_weight_decay": weight_decay, "learning_curve": curve,
            "line": line, "sampling_seconds_per_question": sec_per_q, "hours_for_auc_needed": hours}


def markdown(r: dict) -> str:
    lines = [f"# How good a verifier +{r['margin']} points over majority needs: `{Path(r['source']).name}`", "",
             f"{r['questions']} questions, {r['candidates']} candidates. Simulated verifier scores on the real samples "
             f"(mean of {r['seeds']} draws), the vote temperature chosen in-sample per row:", "",
             "| within-question AUC | majority | best weighted vote | gain | temperature |", "|---:|---:|---:|---:|---:|"]
    lines += [f"| {s['auc']} | {s['majority']}% | {s['weighted_best']}% | {s['gain']:+} | {s['temperature']} |"
              for s in r["simulated"]]
    lines += ["", f"AUC needed for +{r['margin']}: **{r['auc_needed']}**.", "",
              "The hidden-state head's out-of-fold within-question AUC by the training questions each fold's head saw "
              f"(weight decay {r['head_weight_decay']}):", "", "| questions | AUC |", "|---:|---:|"]
    lines += [f"| {c['questions']} | {c['auc']} |" for c in r["learning_curve"]]
    line = r["line"]
    if line:
        need = line["questions_needed"]
        lines += ["", f"Line through them: AUC = {line['intercept']} + {line['per_doubling']} per doubling of the "
                      f"questions; the AUC needed at "
                      + ("no finite number of questions (the line does not rise)" if need is None else
                         f"~{need:,.0f} questions, ~{r['hours_for_auc_needed']} h of this machine's sampling "
                         f"({r['sampling_seconds_per_question']:.1f} s a question of 8 samples)") + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cache", type=Path, help="a verifier features cache (and its .candidates.jsonl)")
    ap.add_argument("--candidates", type=Path, help="its candidates JSONL (default: <cache>.candidates.jsonl)")
    ap.add_argument("--out", type=Path, required=True, help="output prefix (.json and .md are written)")
    ap.add_argument("--margin", type=float, default=3.0, help="points over majority the vote target asks for")
    ap.add_argument("--seeds", type=int, default=64, help="draws of the simulated scores per AUC level")
    ap.add_argument("--weight-decay", type=float, help="the head's L2 (default: chosen by cross-validation)")
    ap.add_argument("--seed", type=int, default=39)
    args = ap.parse_args(argv)
    result = run(args.cache, args.candidates, args.margin, args.seeds, args.weight_decay, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{args.out}.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    Path(f"{args.out}.md").write_text(markdown(result), encoding="utf-8")
    print(markdown(result))


if __name__ == "__main__":
    main()
