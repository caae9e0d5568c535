"""How good a verifier a weighted vote needs to beat majority by a margin, on a verifier's own samples; what the real
head's scores reach under the same vote rules; and how fast the head improves with more samples (#39's vote target).

Two families of vote rules, each answer group of a question scored and the top group winning (ties to the group seen
first, as core.reasoning.voting.vote breaks them):
- `exp`: the sum of exp(τ·s) over the group's samples (τ = 0 is majority, a large τ the best single sample);
- `llr`: α·log(count) + β·Σs + γ·count, a prior on the group's size plus each sample's log-likelihood ratio
  (for scores drawn as below, β = Δ and γ = −Δ²/2 make it the log posterior that the group is right, up to a
  per-question constant: the same winner).

Part 1 (simulated verifiers on the real samples). The samples, their answers and whether each is right stay as
sampled; only the score is drawn, s = Δ·right + N(0, 1), so that a right answer outscores a wrong one of its question
with probability Φ(Δ / √2), the within-question AUC. Each family's parameters are chosen on the same samples for each
AUC (in-sample, and the drawn errors are independent between samples of one answer, where a real verifier's are not:
both favour the simulated verifier), mean of `--seeds` draws; out comes the smallest AUC (0.01 steps) at which each
family's best vote is `--margin` points above majority.

Part 2 (the real head). The hidden-state head (`core.training.heads`, its L2 chosen by cross-validation) scores every
sample out of fold (5 folds by question); both families vote on those logits with parameters chosen in-sample (what
the scores could give at best) and out of fold (each fold's parameters chosen on the other folds' questions: a rule one
could ship; the logits themselves come from heads whose training folds include the other folds' questions, and the L2
was chosen on all of them, so it is slightly optimistic). The same for DeepConf's two confidences and for
`bench.vote_rules`' two combiners, out of fold by question (the head's calibrated logit with both confidences, and
with the vote share as well, as the shipped verifier combines them; slightly optimistic too: their L2 is chosen on
every fold, and the head logits they learn from come from heads that saw the held-out questions). Then the
learning curve: each fold's head fitted on `m` of its training questions drawn at random (`--curve-seeds` draws),
within-question AUC of the out-of-fold scores by m, and a straight line in log2(m) for the questions it would take
to reach Part 1's AUC; likewise each vote family's out-of-fold gain over majority by m, and lines through it for the
questions +margin would take and the gain at every question of the data set (`--pool`): extrapolations.

`python -m bench.vote_bound F --candidates F.candidates.jsonl --out PREFIX` (F: a features cache of `ponder train
verifier`), writes PREFIX.json and PREFIX.md.
"""
from __future__ import annotations

import argparse
import itertools
import math
import random
from pathlib import Path

import torch

from bench.vote_rules import answer_groups, learned_scores, load, write_report
from core.training.combiner import within_question_auc
from core.training.folds import question_folds
from core.training.heads import VERIFIER_LR, fit_head, oof_logits, pick_weight_decay
from models.heads import VerifierHead

TEMPERATURES = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 8.0, 32.0)
ALPHAS = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0)
BETAS = (0.0, 0.25, 0.5, 1.0, 2.0)
GAMMAS = (-1.0, -0.5, -0.25, 0.0, 0.25, 0.5)
AUCS = tuple(round(0.6 + 0.01 * i, 2) for i in range(39))  # 0.60 .. 0.98
SUBSETS = (25, 50, 100, 200, 400)
GSM8K_TRAIN = 7473
"""Questions in GSM8K's train split: the most a collection of this kind could sample from."""


class Groups:
    """The samples' answer groups as flat tensors, so that a vote of every question is a few scatter ops."""

    def __init__(self, rows: list[dict]):
        groups = answer_groups(rows)
        questions = sorted({r["question_index"] for r in rows})
        self.n_questions = len(questions)
        self.qpos = {q: i for i, q in enumerate(questions)}
        member, gid = [], []
        for g, (_, members) in enumerate(groups):
            member += members
            gid += [g] * len(members)
        self.member, self.gid = torch.tensor(member, dtype=torch.long), torch.tensor(gid, dtype=torch.long)
        self.question = torch.tensor([self.qpos[q] for q, _ in groups], dtype=torch.long)
        self.right = torch.tensor([bool(rows[m[0]]["correct"]) for _, m in groups], dtype=torch.float64)
        self.first = torch.tensor([m[0] for _, m in groups], dtype=torch.float64)
        self.count = torch.tensor([len(m) for _, m in groups], dtype=torch.float64)

    def sums(self, values: torch.Tensor) -> torch.Tensor:
        """values (S, N) per sample → (S, G) summed over each answer group."""
        out = torch.zeros(values.shape[0], len(self.right), dtype=torch.float64)
        return out.index_add_(1, self.gid, values[:, self.member].double())

    def right_by_question(self, scores: torch.Tensor) -> torch.Tensor:
        """scores (S, G) per answer group → (S, questions) 1 where the top group is right. Scores within 1e-12 of the
        top (relative) tie, and a tie goes to the group seen first; a question without answers is wrong."""
        s = scores.shape[0]
        index = self.question.expand(s, -1)
        best = torch.full((s, self.n_questions), -math.inf, dtype=torch.float64).scatter_reduce(1, index, scores, "amax")
        top_value = best[:, self.question]
        top = scores >= top_value - 1e-12 * top_value.abs()
        first = torch.where(top, self.first, math.inf)
        winner = torch.full((s, self.n_questions), math.inf, dtype=torch.float64).scatter_reduce(1, index, first, "amin")
        won = top & (first == winner[:, self.question])
        return torch.zeros(s, self.n_questions, dtype=torch.float64).index_add_(1, self.question, won * self.right)

    def accuracy(self, scores: torch.Tensor) -> torch.Tensor:
        """(S,) share of questions whose top-scored answer group is right."""
        return self.right_by_question(scores).mean(1)

    def exp_sums(self, s: torch.Tensor, t: float) -> torch.Tensor:
        """The `exp` family at temperature t: (S, G) sums of exp(t·s), s scaled per draw (only ratios matter)."""
        return self.sums(torch.exp(t * (s - s.max(1, keepdim=True).values)))

    def family_scores(self, s: torch.Tensor) -> dict[tuple, torch.Tensor]:
        """Every parameter setting of both families → its (S, G) group scores for per-sample scores s (S, N)."""
        out = {("exp", t): self.exp_sums(s, t) for t in TEMPERATURES}
        total, log_count = self.sums(s), self.count.log()
        for a, b, c in itertools.product(ALPHAS, BETAS, GAMMAS):
            out[("llr", a, b, c)] = a * log_count + b * total + c * self.count
        return out


def simulated(groups: Groups, y: torch.Tensor, seeds: int) -> tuple[float, list[dict]]:
    """Part 1: per AUC, each family's best in-sample vote (mean over `seeds` draws), the `llr` family with the true
    β = Δ, γ = −Δ²/2 and α chosen."""
    noise = torch.randn(seeds, len(y), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    majority = float(groups.accuracy(groups.sums(torch.ones(1, len(y))))[0])
    normal = torch.distributions.Normal(0.0, 1.0)
    out = []
    for auc in AUCS:
        delta = math.sqrt(2) * normal.icdf(torch.tensor(auc, dtype=torch.float64)).item()
        s = delta * y.double() + noise
        exp = {t: float(groups.accuracy(groups.exp_sums(s, t)).mean()) for t in TEMPERATURES}
        total, log_count = groups.sums(s), groups.count.log()
        llr = {a: float(groups.accuracy(a * log_count + delta * total - delta ** 2 / 2 * groups.count).mean())
               for a in ALPHAS}
        t, a = max(exp, key=exp.get), max(llr, key=llr.get)
        out.append({"auc": auc, "exp": round(100 * exp[t], 2), "temperature": t, "llr": round(100 * llr[a], 2),
                    "alpha": a})
    return 100 * majority, out


def needed(majority: float, sim: list[dict], family: str, margin: float) -> float | None:
    """The smallest simulated AUC at which `family`'s best vote is `margin` points above majority."""
    return next((r["auc"] for r in sim if r[family] - majority >= margin), None)


def real_votes(groups: Groups, logits: torch.Tensor, rows: list[dict], seed: int) -> dict:
    """Part 2a: both families on the head's out-of-fold logits, parameters chosen in-sample and out of fold."""
    scores = groups.family_scores(logits[None, :].double())
    per_q = {k: groups.right_by_question(v)[0] for k, v in scores.items()}
    out = {"majority": 100 * float(per_q[("exp", 0.0)].mean())}
    qids = torch.tensor([groups.qpos[r["question_index"]] for r in rows])
    for family in ("exp", "llr"):
        keys = [k for k in per_q if k[0] == family]
        best = max(keys, key=lambda k: float(per_q[k].mean()))
        right = torch.zeros(groups.n_questions, dtype=torch.float64)
        chosen = []
        for tr, va in question_folds(qids, 5, seed):
            train_q, held_q = sorted({int(qids[i]) for i in tr}), sorted({int(qids[i]) for i in va})
            pick = max(keys, key=lambda k: float(per_q[k][train_q].sum()))
            right[held_q] = per_q[pick][held_q]
            chosen.append(list(pick[1:]))
        out[family] = {"in_sample": round(100 * float(per_q[best].mean()), 2), "in_sample_params": list(best[1:]),
                       "out_of_fold": round(100 * float(right.mean()), 2), "fold_params": chosen}
    out["majority"] = round(out["majority"], 2)
    return out


def learning_curve(data: dict, weight_decay: float, seed: int, draws: int, vote_groups: Groups | None = None,
                   rows: list[dict] | None = None) -> list[dict]:
    """Part 2b: the out-of-fold within-question AUC when each fold's head sees m random training questions (mean and
    range over `draws` draws, each with its own starting weights), and once with every training question of each fold
    (reported at their mean number). With the samples' answer groups (`vote_groups`) and `rows`, also each family's out-of-fold
    vote on those scores, as points over majority (mean over the draws)."""
    x, y, groups = data["x"], data["y"], data["groups"]
    folds = list(question_folds(groups, 5, seed))
    sizes = [len({int(groups[i]) for i in tr}) for tr, _ in folds]
    smallest = min(sizes)
    out = []
    for m in [m for m in SUBSETS if m < smallest] + [None]:  # None: every training question of each fold
        last = m is None
        aucs, gains = [], {"exp": [], "llr": []}
        for draw in range(1 if last else draws):
            scores = torch.zeros(len(y))
            for k, (tr, va) in enumerate(folds):
                questions = sorted({int(groups[i]) for i in tr})
                kept = set(questions) if last else set(random.Random(1000 * draw + k).sample(questions, m))
                keep = torch.tensor([i for i in tr if int(groups[i]) in kept])
                torch.manual_seed(seed + 1000 * draw + k)  # the head's starting weights (fit_head seeds only its fit)
                head = fit_head(VerifierHead(x.shape[1]), x[keep], y[keep], epochs=300, lr=VERIFIER_LR,
                                weight_decay=weight_decay, seed=seed)
                with torch.no_grad():
                    scores[va] = head(x[va]).float()
            aucs.append(within_question_auc(scores, y, groups))
            if vote_groups is not None:
                z = scores.double()
                votes = real_votes(vote_groups, (z - z.mean()) / z.std().clamp(min=1e-9), rows, seed)
                for family in gains:
                    gains[family].append(votes[family]["out_of_fold"] - votes["majority"])
        point = {"questions": sum(sizes) / len(sizes) if last else m, "auc": round(sum(aucs) / len(aucs), 4),
                 "low": min(aucs), "high": max(aucs)}
        if vote_groups is not None:
            for f, v in gains.items():
                point |= {f"gain_{f}": round(sum(v) / len(v), 2), f"gain_{f}_low": round(min(v), 2),
                          f"gain_{f}_high": round(max(v), 2)}
        out.append(point)
    return out


def line_to(pts: list[tuple[float, float]], target: float, digits: int = 4) -> dict:
    """Least-squares line y = a + b·x through (log2 questions, y) points: its intercept, slope a doubling, the
    questions at which it reaches `target` (None where it does not rise, or only past 2^40 questions: `beyond`)."""
    mx, my = sum(q[0] for q in pts) / len(pts), sum(q[1] for q in pts) / len(pts)
    b = sum((q[0] - mx) * (q[1] - my) for q in pts) / sum((q[0] - mx) ** 2 for q in pts)
    a = my - b * mx
    doublings = None if b <= 1e-6 else (target - a) / b
    need = None if doublings is None or doublings > 40 else 2 ** doublings  # 2^40: no data set holds that
    return {"intercept": round(a, digits), "per_doubling": round(b, digits), "questions_needed": need,
            "beyond": doublings is not None and doublings > 40}


def extrapolate_gain(curve: list[dict], margin: float, pool: int) -> dict | None:
    """Least-squares lines gain = a + b·log2(questions) through each family's out-of-fold vote gains on the curve, all
    of it and its last three points (the small subsets' heads often lose to majority, so the vote falls back to it and
    the curve bends: the last three give the steeper, more hopeful slope): the questions each needs for `margin` points
    and the gain each gives at `pool` questions (every question the data set holds). An extrapolation past the
    measured range, not a bound."""
    out = {}
    for family in ("exp", "llr"):
        pts = [(math.log2(r["questions"]), r[f"gain_{family}"]) for r in curve if f"gain_{family}" in r]
        if len(pts) < 2:
            return None

        def fit(p):
            line = line_to(p, margin, 3)
            need = line["questions_needed"]
            return {**line, "questions_needed": None if need is None else round(need),
                    "gain_at_pool": round(line["intercept"] + line["per_doubling"] * math.log2(pool), 2)}

        out[family] = {"all": fit(pts), "last_three": fit(pts[-3:]) if len(pts) >= 3 else None}
    return out


def extrapolate(curve: list[dict], target_auc: float | None) -> dict | None:
    """Least-squares line AUC = a + b·log2(questions) through the curve, all of it and its last three points; the
    questions each needs for target_auc (None where the line does not rise, or only past 2^40 questions)."""
    pts = [(math.log2(r["questions"]), r["auc"]) for r in curve if r["auc"] is not None]
    if target_auc is None or len(pts) < 2:
        return None
    return {"all": line_to(pts, target_auc), "last_three": line_to(pts[-3:], target_auc) if len(pts) >= 3 else None}


def run(cache: Path, candidates: Path | None, margin: float, seeds: int, weight_decay: float | None, seed: int,
        curve_seeds: int, pool: int = GSM8K_TRAIN) -> dict:
    data, rows = load(cache, candidates)
    groups = Groups(rows)
    majority, sim = simulated(groups, data["y"], seeds)
    need = {family: needed(majority, sim, family, margin) for family in ("exp", "llr")}
    x, y, g = data["x"], data["y"], data["groups"]
    if weight_decay is None:
        weight_decay, _ = pick_weight_decay(x, y, g, x.shape[1], seed=seed)
    torch.manual_seed(seed)  # the heads' starting weights: fit_head seeds only their fit
    logits = oof_logits(x, y, g, x.shape[1], weight_decay, seed=seed)
    sources = {"head": logits}
    if "extras" in data:  # DeepConf's confidences: the mean and the lowest-window token log-prob
        sources |= {"logprob_mean": data["extras"][:, 0], "logprob_lowest": data["extras"][:, 1]}
        torch.manual_seed(seed)  # the same out-of-fold head under the combiners `bench.vote_rules` fits
        learned, _ = learned_scores(data, rows, weight_decay, seed, raw=True)
        for name in ("combiner-no-share", "combiner"):  # their logits: the head with the confidences (and share)
            sources[name] = learned[name]
    real = {}
    for name, score in sources.items():
        z = (score.double() - score.double().mean()) / score.double().std().clamp(min=1e-9)  # the grids' scale
        real[name] = {**real_votes(groups, z, rows, seed), "auc": within_question_auc(score.float(), y, g)}
    curve = learning_curve(data, weight_decay, seed, curve_seeds, groups, rows)
    target = min((a for a in need.values() if a is not None), default=None)
    line = extrapolate(curve, target)
    gain_line = extrapolate_gain(curve, margin, pool)
    seconds = float(data["seconds"].item()) if "seconds" in data else None
    return {"source": str(cache), "questions": groups.n_questions, "candidates": len(rows), "margin": margin,
            "seeds": seeds, "majority": round(majority, 2), "simulated": sim, "auc_needed": need,
            "head_weight_decay": weight_decay, "real_scores": real, "learning_curve": curve, "line": line,
            "gain_line": gain_line, "pool": pool,
            "collection_seconds_per_question": None if seconds is None else seconds / groups.n_questions}


def markdown(r: dict) -> str:
    m, need = r["majority"], r["auc_needed"]
    lines = [f"# How good a verifier +{r['margin']} points over majority needs: `{Path(r['source']).name}`", "",
             f"{r['questions']} questions, {r['candidates']} candidates, majority {m}%. Simulated verifier scores on "
             f"the real samples (mean of {r['seeds']} draws), each family's parameters chosen in-sample per row:", "",
             "| within-question AUC | `exp` best | gain | τ | `llr` best | gain | α |", "|---:|---:|---:|---:|---:|---:|---:|"]
    shown = {round(0.6 + 0.05 * i, 2) for i in range(8)} | {0.98} | {a for a in need.values() if a is not None}
    lines += [f"| {s['auc']} | {s['exp']}% | {s['exp'] - m:+.2f} | {s['temperature']} | {s['llr']}% | "
              f"{s['llr'] - m:+.2f} | {s['alpha']} |" for s in r["simulated"] if s["auc"] in shown]
    lines += ["", f"Smallest AUC (0.01 steps) for +{r['margin']}: `exp` **{need['exp']}**, `llr` **{need['llr']}**.", "",
              f"The real scores (each standardised; the head's out of fold, weight decay {r['head_weight_decay']}) "
              "under both families:", "",
              "| score | within-question AUC | family | in-sample parameters | accuracy | chosen out of fold, by fold | "
              "accuracy |", "|---|---:|---|---|---:|---|---:|"]
    for name, real in r["real_scores"].items():
        for family in ("exp", "llr"):
            f = real[family]
            lines.append(f"| {name} | {real['auc']} | `{family}` | {f['in_sample_params']} | {f['in_sample']}% | "
                         f"{f['fold_params']} | {f['out_of_fold']}% |")
    lines += ["", "The head's out-of-fold within-question AUC by the training questions each fold's head saw (random "
              "draws; mean, low, high; the last row: every training question of each fold, their mean number):", "",
              "| questions | AUC | low | high | `exp` vote over majority, points (low, high) | `llr` vote over majority "
              "(low, high) |", "|---:|---:|---:|---:|---:|---:|"]
    for c in r["learning_curve"]:
        gains = [f"{c[f'gain_{f}']:+.2f} ({c[f'gain_{f}_low']:+.2f}, {c[f'gain_{f}_high']:+.2f})" if f"gain_{f}" in c
                 else "–" for f in ("exp", "llr")]
        lines.append(f"| {c['questions']:g} | {c['auc']} | {c['low']} | {c['high']} | {gains[0]} | {gains[1]} |")
    if r["line"]:
        sec = r["collection_seconds_per_question"]
        for name, line in r["line"].items():
            if line is None:
                continue
            n = line["questions_needed"]
            cost = "" if n is None or sec is None else f", ~{n * sec / 3600:.0f} h at the collection's {sec:.1f} s a question"
            lines.append(f"- line through {'every point' if name == 'all' else 'the last three points'}: "
                         f"{line['per_doubling']:+} a doubling; the smaller AUC above at "
                         + (("more than 2^40 questions" if line["beyond"] else "no number of questions") if n is None
                            else f"~{n:,.0f} questions{cost}") + ".")
    if r.get("gain_line"):
        lines += ["", "The vote's out-of-fold gain, a straight line in log2(training questions) extrapolated past the "
                  "measured range (an assumption, not a bound; the points share their questions and majority, the "
                  "last is one draw, the L2 was chosen on all the data):"]
    for family, fits in (r.get("gain_line") or {}).items():
        for name, g in fits.items():
            if g is None:
                continue
            n = g["questions_needed"]
            reach = ("more than 2^40 questions" if g["beyond"] else "no number of questions") if n is None \
                else f"~{n:,} questions"
            lines.append(f"- `{family}` vote gain, line through {'every point' if name == 'all' else 'the last three'}: "
                         f"{g['per_doubling']:+} a doubling; +{r['margin']} at {reach}; {g['gain_at_pool']:+} at all "
                         f"{r['pool']:,} questions of the data set.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cache", type=Path, help="a verifier features cache (and its .candidates.jsonl)")
    ap.add_argument("--candidates", type=Path, help="its candidates JSONL (default: <cache>.candidates.jsonl)")
    ap.add_argument("--out", type=Path, required=True, help="output prefix (.json and .md are written)")
    ap.add_argument("--margin", type=float, default=3.0, help="points over majority the vote target asks for")
    ap.add_argument("--seeds", type=int, default=64, help="draws of the simulated scores per AUC")
    ap.add_argument("--curve-seeds", type=int, default=3, help="random draws of each learning-curve subset")
    ap.add_argument("--weight-decay", type=float, help="the head's L2 (default: chosen by cross-validation)")
    ap.add_argument("--seed", type=int, default=39)
    ap.add_argument("--pool", type=int, default=GSM8K_TRAIN,
                    help="questions the data set holds, for the vote-gain line's projection (default: GSM8K train)")
    args = ap.parse_args(argv)
    result = run(args.cache, args.candidates, args.margin, args.seeds, args.weight_decay, args.seed, args.curve_seeds,
                 args.pool)
    write_report(args.out, result, markdown(result))


if __name__ == "__main__":
    main()
