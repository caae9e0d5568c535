"""Which layer's state at the verification prompt tells a right answer from a wrong one best (#39's verifier of
another kind): on a collection recorded with `ponder train verifier --layers ...`, the same linear head
(`core.training.heads`: L2 chosen by 5-fold cross-validation by question, then out-of-fold logits) is fitted on each
recorded layer, on the final state the shipped head reads, and on all of them side by side; each gets its
within-question AUC, and the head alone and `bench.vote_rules`' two combiners (its calibrated logit with DeepConf's
confidences, with and without the vote share) vote by `bench.vote_bound`'s two families (`exp` and `llr`, parameters
chosen on the other folds' questions), against majority on the same samples.

The recorded layers are the model's own residual states (in a w4-fpt model's transformed basis; the head
standardises each dimension, so a per-dimension scale is undone, a rotation is not), the final state as heads are
saved (`original_basis`). Everything is chosen on the collection's own train questions, out of fold.

`python -m bench.verifier_layers F --out PREFIX` (F: the features cache, its candidates beside it) writes
PREFIX.json and PREFIX.md.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from safetensors import safe_open

from bench.vote_bound import Groups, real_votes
from bench.vote_rules import learned_scores, load, write_report
from core.training.combiner import within_question_auc


def feature_sets(data: dict, layers: list[int]) -> dict[str, torch.Tensor]:
    """name -> (N, D) features: each recorded layer, the final state, and all of them side by side."""
    deep = data["layers"].float()
    sets = {f"layer {i}": deep[:, k] for k, i in enumerate(layers)}
    sets["final (the shipped head's)"] = data["x"]
    sets["all of them"] = torch.cat([deep.flatten(1), data["x"]], 1)
    return sets


RULES = ("head", "combiner-no-share", "combiner")
"""What votes on each feature set: the head alone, and `bench.vote_rules`' two combiners of its calibrated logit
with DeepConf's two confidences (and the vote share), each out of fold."""


def score(x: torch.Tensor, data: dict, rows: list[dict], groups: Groups, seed: int,
          weight_decay: float | None = None) -> dict:
    """One feature set: the head's L2 (cross-validated unless given) and within-question AUC, and each rule's two
    vote families (`exp`, `llr`), all out of fold."""
    scores, settings = learned_scores({**data, "x": x}, rows, weight_decay, seed, raw=True)
    head = scores["head"].double().clamp(1e-12, 1 - 1e-12)
    logits = {"head": torch.log(head / (1 - head)), **{r: scores[r].double() for r in RULES[1:]}}
    out = {"dims": x.shape[1], "weight_decay": settings["head_weight_decay"],
           "auc": round(within_question_auc(logits["head"].float(), data["y"], data["groups"]), 4)}
    for rule, z in logits.items():
        votes = real_votes(groups, (z - z.mean()) / z.std().clamp(min=1e-9), rows, seed)
        out["majority"] = votes["majority"]
        out[rule] = {f: votes[f]["out_of_fold"] for f in ("exp", "llr")}
    return out


def run(cache: Path, candidates: Path | None, seed: int, weight_decay: float | None = None) -> dict:
    data, rows = load(cache, candidates)
    if "layers" not in data:
        raise SystemExit(f"{cache} holds no other layers: collect it with `ponder train verifier --layers ...`")
    with safe_open(str(cache), "pt") as f:
        layers = json.loads((f.metadata() or {}).get("layers", "[]"))
    if len(layers) != data["layers"].shape[1]:
        raise SystemExit(f"{cache}: its metadata names layers {layers}, but it holds {data['layers'].shape[1]}")
    groups = Groups(rows)
    out = {"cache": cache.name, "questions": groups.n_questions, "candidates": len(rows),
           "right": int(data["y"].sum()), "layers": layers, "seed": seed, "sets": {}}
    started = time.monotonic()
    for name, x in feature_sets(data, layers).items():
        out["sets"][name] = score(x, data, rows, groups, seed, weight_decay)
    out["seconds"] = round(time.monotonic() - started, 1)
    return out


def markdown(r: dict) -> str:
    lines = [f"# The verifier's head on each layer: {r['cache']}", "",
             f"{r['questions']} questions, {r['candidates']} candidates ({r['right']} right); recorded layers "
             f"{r['layers']} (hidden-state indices, 0 the embeddings); every figure out of fold (5 folds by question, "
             f"seed {r['seed']}); majority on the same samples {next(iter(r['sets'].values()))['majority']:.1f}%.", "",
             "| features | dims | L2 | within-question AUC | head `exp` / `llr` | + confidences | + confidences, "
             "vote share | best gain over majority |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, s in r["sets"].items():
        cells = [f"{s[rule]['exp']:.1f} / {s[rule]['llr']:.1f}%" for rule in RULES]
        gain = max(v for rule in RULES for v in s[rule].values()) - s["majority"]
        lines.append(f"| {name} | {s['dims']} | {s['weight_decay']:g} | {s['auc']:.3f} | {' | '.join(cells)} | "
                     f"{gain:+.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.verifier_layers", description=__doc__.split("\n\n")[0])
    p.add_argument("cache", type=Path)
    p.add_argument("--candidates", type=Path, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--weight-decay", type=float, default=None, help="one L2 for every set (default: cross-validated)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    result = run(args.cache, args.candidates, args.seed, args.weight_decay)
    write_report(args.out, result, markdown(result))


if __name__ == "__main__":
    main()
