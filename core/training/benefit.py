"""A switcher that routes by benefit: does thinking help on this prompt?

The first switcher learned math prompts against chat prompts, a topic classifier. This one learns from what each
mode did on the same *train* questions: two `ponder eval` runs over one data file, one in Reason mode and one in
Fast mode, give every question a label — 1 where Reason was right and Fast wrong (thinking helped), 0 otherwise
(Fast was right alone, or both modes agreed, so the trace only cost time). Chat prompts (code, writing) are
labelled 0: no thinking budget is spent on them. The head is the switcher's own (pooled prefill states, the same
features `auto` computes), fitted with the classes balanced; then its threshold is chosen on out-of-fold
probabilities to maximise the accuracy auto mode would reach on the labelled questions (Reason's answer where it
routes to Reason, Fast's elsewhere), the highest such threshold winning ties, since every Reason route costs a
trace, among the thresholds that send at most 5% of the chat prompts to Reason (without that cap, chat rows,
which carry no accuracy, were sent along: 86% of them on the 0.5B's first try). With two modes right on
different questions, routing can beat both; with one mode better everywhere, the threshold sends (almost)
everything to it.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from core.data.datasets import Item
from core.training.folds import pairwise_auc, question_folds
from core.training.heads import fit_head, switcher_features
from models.heads import SwitcherHead, save_head

NOISE = 0.5
MAX_CHAT_SHARE = 0.05
"""At most this share of the chat prompts may go to Reason at the chosen threshold (out of fold)."""


def benefit_rows(reason: dict, fast: dict) -> list[tuple[int, bool, bool]]:
    """(row index in the data file, Reason right, Fast right) for every row both evaluations scored (chat rows,
    which have no gold answer, carry no label)."""
    if reason.get("data") != fast.get("data"):
        raise ValueError(f"the two evaluations ran on different data ({reason.get('data')} and {fast.get('data')})")
    if reason.get("mode") != "reason" or fast.get("mode") != "base":
        raise ValueError("give a Reason-mode evaluation first and a Fast-mode (base) one second")
    fast_by_row = {q["index"]: bool(q["correct"]) for q in fast["questions"] if q["correct"] is not None}
    rows = [(q["index"], bool(q["correct"]), fast_by_row[q["index"]]) for q in reason["questions"]
            if q["index"] in fast_by_row and q["correct"] is not None]
    if not rows:
        raise ValueError("the two evaluations share no question")
    return rows


def auto_accuracy(route_reason: torch.Tensor, reason_right: torch.Tensor, fast_right: torch.Tensor) -> float:
    return float(torch.where(route_reason, reason_right, fast_right).float().mean())


def pick_threshold(probs: torch.Tensor, reason_right: torch.Tensor, fast_right: torch.Tensor,
                   chat_probs: torch.Tensor | None = None, max_chat_share: float = MAX_CHAT_SHARE) -> tuple[float, float]:
    """(threshold, auto accuracy at it): the best accuracy over thresholds between the probabilities, the highest
    threshold among equals (fewest Reason routes). With `chat_probs`, only thresholds that send at most
    `max_chat_share` of the chat prompts to Reason count: chat carries no accuracy to weigh, and a chat request
    answered after a math-style trace is worse, not better (a high enough threshold always qualifies)."""
    candidates = sorted({0.0, 1.0 + 1e-9, *[float(p) for p in probs]}, reverse=True)
    if chat_probs is not None and len(chat_probs):
        candidates = [t for t in candidates if float((chat_probs >= t).float().mean()) <= max_chat_share]
        candidates = candidates or [float(chat_probs.max()) + 1e-9]
    best = max(candidates, key=lambda t: (round(auto_accuracy(probs >= t, reason_right, fast_right), 9), t))
    return best, auto_accuracy(probs >= best, reason_right, fast_right)


def train_benefit_switcher(engine, items: list[Item], reason_right: list[bool], fast_right: list[bool],
                           chat_items: list[Item], out: Path, *, budget: int = 512, seed: int = 0, folds: int = 5,
                           report=print, source: dict | None = None) -> dict:
    """Fit, choose the threshold out of fold, save the head (kind 'switcher', `routes_by: benefit`). `budget`:
    the thinking budget auto mode states in the prompt the features are pooled from (the model's default)."""
    t = time.perf_counter()
    x = switcher_features(engine, [i.prompt for i in items] + [i.prompt for i in chat_items], budget=budget).float()
    report(f"features: {len(x)} prompts in {time.perf_counter() - t:.0f}s")
    r, f = torch.tensor(reason_right), torch.tensor(fast_right)
    n = len(items)
    y = torch.cat([(r & ~f).float(), torch.zeros(len(chat_items))])
    if not 0 < float(y.sum()) < len(y):
        raise ValueError("thinking helped on none (or all) of these questions: nothing to learn which")
    probs = torch.zeros(len(y))
    for tr, va in question_folds(torch.arange(len(y)), folds, seed):
        head = fit_head(SwitcherHead(x.shape[1]), x[tr], y[tr], epochs=400, lr=1e-2, noise=NOISE, seed=seed)
        with torch.no_grad():
            probs[va] = torch.sigmoid(head(x[va]))
    threshold, oof_auto = pick_threshold(probs[:n], r, f, probs[n:], MAX_CHAT_SHARE)
    head = fit_head(SwitcherHead(x.shape[1]), x, y, epochs=400, lr=1e-2, noise=NOISE, seed=seed)
    metrics = {"routes_by": "benefit", "threshold": threshold, "n_questions": n, "n_chat": len(chat_items),
               "thinking_helped": int(y[:n].sum()), "fast_only_right": int((f & ~r).sum()),
               "reason_accuracy": float(r.float().mean()), "fast_accuracy": float(f.float().mean()),
               "oracle_accuracy": float((r | f).float().mean()), "auto_accuracy_oof": oof_auto,
               "reason_share_oof": float((probs[:n] >= threshold).float().mean()),
               "chat_reason_share_oof": float((probs[n:] >= threshold).float().mean()) if chat_items else None,
               "max_chat_share": MAX_CHAT_SHARE,
               "auc_oof": pairwise_auc(probs, y), "folds": folds, "budget": budget}
    save_head(head, out, {"kind": "switcher", "hidden_size": x.shape[1], "width": 8, "chunk": 128, "alpha": 0.5,
                          "noise": NOISE, "model": engine.model_id, "precision": engine.precision, **metrics,
                          "trained_on": source or {}})
    return metrics


def load_benefits(pairs: list[tuple[Path, Path]]) -> tuple[list[Item], list[bool], list[bool], dict]:
    """`load_benefit` over several (Reason, Fast) evaluation pairs (other rows or other data files), pooled; the
    source lists each pair's. A question in two pairs is refused (its copies could fall on both sides of a fold)."""
    items, reason_right, fast_right, sources, seen = [], [], [], [], set()
    for reason_path, fast_path in pairs:
        i, r, f, source = load_benefit(reason_path, fast_path)
        twice = {item.prompt for item in i} & seen
        if twice:
            raise ValueError(f"{reason_path} repeats {len(twice)} question(s) of an earlier pair, e.g. "
                             f"{next(iter(twice))[:60]!r}")
        seen |= {item.prompt for item in i}
        items, reason_right, fast_right = items + i, reason_right + r, fast_right + f
        sources.append(source)
    if len(sources) == 1:
        return items, reason_right, fast_right, sources[0]
    budgets = {s["budget"] for s in sources}
    return items, reason_right, fast_right, {"pairs": sources, "budget": budgets.pop() if len(budgets) == 1 else None}


def load_benefit(reason_path: Path, fast_path: Path) -> tuple[list[Item], list[bool], list[bool], dict]:
    """The questions both evaluations scored (from the data file they name) and each mode's correctness."""
    from core.data.datasets import load_items

    reason, fast = (json.loads(Path(p).read_text()) for p in (reason_path, fast_path))
    rows = benefit_rows(reason, fast)
    data = Path(reason["data"])
    top = max(i for i, _, _ in rows)
    every = load_items(data, top + 1)
    items = [every[i] for i, _, _ in rows]
    return items, [a for _, a, _ in rows], [b for _, _, b in rows], {
        "reason_eval": Path(reason_path).name, "fast_eval": Path(fast_path).name, "data": data.name,
        "rows": f"{min(i for i, _, _ in rows)}-{top}", "adapter": reason.get("adapter"), "budget": reason.get("budget")}
