"""Training the two tiny heads on the frozen quantized base: the switcher and the verifier.

Features come from the same code paths inference uses (engine prefill for the switcher, the parallel
decoder's verification step for the verifier), so what a head sees in training is what it sees in use.
Heads train in seconds; collecting verifier data (sampling answers) is what takes time.
"""
from __future__ import annotations

import random
import time
from pathlib import Path

import torch

from core.config import SamplingConfig
from core.data.datasets import Item
from core.decode.cache import new_cache
from core.decode.prefill import prefill
from core.prompting.prompts import reasoning_system
from core.reasoning.verifier import vote_shares
from core.reasoning.voting import is_correct
from core.training.folds import pairwise_auc, question_folds
from models.fpt import fpt_of
from models.heads import SwitcherHead, VerifierHead, chunk_ema, save_head


@torch.inference_mode()
def switcher_features(engine, prompts: list[str], budget: int = 256, chunk: int = 128, alpha: float = 0.5):
    """Pooled last-layer prefill states (N, H), exactly as `auto` mode computes them."""
    feats = []
    for text in prompts:
        ids = engine.prompt_ids(text, reasoning_system(budget))
        cache = new_cache(engine.model.config, engine.kv)
        with engine._base():
            _, hidden = prefill(engine.model, torch.tensor([ids]), cache, want_hidden=True)
        feats.append(chunk_ema(hidden[0], chunk, alpha))
    return original_basis(engine.model, torch.stack(feats))


def original_basis(model, x: torch.Tensor) -> torch.Tensor:
    """Final hidden states of a transformed (w4-fpt) model as the untransformed model has them (x·Fᵀ), so heads are
    trained and saved in one basis whatever precision they were trained on; loading moves them (models/fpt.py)."""
    spec = fpt_of(model)
    if spec is None or spec.rotation is None:
        return x
    return x.float() @ (spec.gamma_final[:, None] * spec.rotation).t()


def fit_head(head, x: torch.Tensor, y: torch.Tensor, *, epochs: int, lr: float, noise: float = 0.0,
             weight_decay: float = 1e-4, seed: int = 0):
    if lr * weight_decay >= 1:  # AdamW's decoupled decay scales the weights by (1 - lr·wd) every step
        raise ValueError(f"weight decay {weight_decay} at lr {lr} zeroes or flips the weights each step (lr·wd ≥ 1)")
    torch.manual_seed(seed)
    head.norm.fit(x)
    pos = y.mean().clamp(0.05, 0.95)
    loss_fn = torch.nn.BCEWithLogitsLoss(pos_weight=(1 - pos) / pos)
    optim = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    head.train()
    for _ in range(epochs):
        loss = loss_fn(head(x, noise=noise), y)
        optim.zero_grad()
        loss.backward()
        optim.step()
    head.eval()
    return head


def accuracy(head, x, y, threshold: float = 0.5) -> float:
    with torch.no_grad():
        return ((torch.sigmoid(head(x)) >= threshold).float() == y).float().mean().item()


def auc(head, x, y) -> float | None:
    with torch.no_grad():
        return pairwise_auc(torch.sigmoid(head(x)), y)


def split(n: int, val_share: float, seed: int):
    idx = list(range(n))
    random.Random(seed).shuffle(idx)
    k = max(1, int(n * val_share))
    return idx[k:], idx[:k]


def train_switcher(engine, reason_items: list[Item], chat_items: list[Item], out: Path, *, seed: int = 0,
                   noise: float = 0.5, val_share: float = 0.2, report=print, features_cache: Path | None = None,
                   source: dict | None = None) -> dict:
    """Fit the switcher on pooled prefill features of reasoning (1) and chat (0) prompts; `source` (data, command)
    is saved in head.json beside the metrics so the shipped head says how it was made."""
    from safetensors.torch import load_file, save_file

    prompts = [i.prompt for i in reason_items] + [i.prompt for i in chat_items]
    labels = torch.tensor([1.0] * len(reason_items) + [0.0] * len(chat_items))
    source = dict(source or {})
    if features_cache is not None and Path(features_cache).is_file():
        x = load_file(str(features_cache))["x"]
        if x.shape[0] != len(prompts):
            raise ValueError(f"{features_cache} holds {x.shape[0]} feature rows, expected {len(prompts)}")
    else:
        t = time.perf_counter()
        x = switcher_features(engine, prompts).float()
        source["feature_seconds"] = round(time.perf_counter() - t)
        report(f"features: {len(prompts)} prompts in {source['feature_seconds']}s")
        if features_cache is not None:
            save_file({"x": x.contiguous()}, str(features_cache))
    tr, va = split(len(prompts), val_share, seed)
    head = fit_head(SwitcherHead(x.shape[1]), x[tr], labels[tr], epochs=400, lr=1e-2, noise=noise, seed=seed)
    metrics = {"train_accuracy": accuracy(head, x[tr], labels[tr]), "val_accuracy": accuracy(head, x[va], labels[va]),
               "val_auc": auc(head, x[va], labels[va]), "n_train": len(tr), "n_val": len(va)}
    save_head(head, out, {"kind": "switcher", "hidden_size": x.shape[1], "width": 8, "threshold": 0.5, "chunk": 128,
                          "alpha": 0.5, "noise": noise, "model": engine.model_id, "precision": engine.precision,
                          **metrics, "trained_on": source})
    return metrics


class _Capture:
    """Stands in for the verifier while collecting data: keeps each hidden state, returns its index as 'score'.
    With `layers` (indices into the model's hidden states, 0 the embeddings) it also keeps those layers' states at
    the same token, which the engine then passes beside the final one (core.decode.rows)."""

    vote = "weighted"  # the engine's vote over the captured indices is never used

    @staticmethod
    def combines(temperature) -> bool:  # the candidates keep their captured indices as scores
        return False

    def __init__(self, layers: tuple[int, ...] = ()):
        self.layers = (*layers, -1) if layers else None
        self.rows: list[torch.Tensor] = []
        self.layer_rows: list[torch.Tensor] = []

    def scores(self, hidden: torch.Tensor) -> list[float]:
        if self.layers is not None:  # (B, layers + 1, H): the asked layers, then the final state
            self.layer_rows.extend(h[:-1].clone() for h in hidden)
            hidden = hidden[:, -1]
        out = []
        for h in hidden:
            self.rows.append(h.float().clone())
            out.append(float(len(self.rows) - 1))
        return out


SAMPLING_TEMPERATURE, SAMPLING_TOP_P = 0.7, 0.95
"""How verifier training answers are sampled (as `ponder eval --parallel` samples)."""


def verifier_data(engine, items: list[Item], *, samples: int = 4, budget: int = 256, answer_max_tokens: int = 128,
                  temperature: float = SAMPLING_TEMPERATURE, seed: int = 0, report=print, start: dict | None = None,
                  save=None, save_every: int = 8, record=None, layers: tuple[int, ...] = ()):
    """Sample `samples` reasoning answers per question; label each by math-verify against the gold answer.

    Returns a dict: x (N, H) hidden states, y (N,) labels, groups (N,) question index, extras (N, 3) (the
    candidate's mean and lowest-window token log-prob, its vote share among the question's samples) and done (the
    questions behind them); with `layers` (hidden-state indices, 0 the embeddings) also `layers` (N, len(layers), H),
    those layers' states at the same token, as the model computes them (no change of basis). `start`, such a dict,
    resumes after its `done` questions; `save(state)` gets it every `save_every` questions and at the end, so a long
    collection survives being stopped. `record(k, item, rows)` gets each question's candidates as JSON rows (text,
    thinking, lengths, correctness, confidences, vote share)."""
    capture, saved = _Capture(layers), engine.verifier
    engine.verifier = capture
    feats, labels, groups, extras, deep, done = [], [], [], [], [], 0
    if start:
        feats, labels, groups = list(start["x"]), start["y"].tolist(), start["groups"].tolist()
        extras, done = start["extras"].tolist(), int(start["done"])
        deep = list(start["layers"]) if layers else []

    def state(k: int) -> dict:
        out = {"x": torch.stack(feats) if feats else torch.empty(0, engine.model.config.hidden_size),
               "y": torch.tensor(labels), "groups": torch.tensor(groups, dtype=torch.long),
               "extras": torch.tensor(extras, dtype=torch.float32).view(-1, 3), "done": k}
        if layers:
            out["layers"] = (torch.stack(deep) if deep else
                             torch.empty(0, len(layers), engine.model.config.hidden_size, dtype=engine.model.dtype))
        return out

    try:
        for k, item in enumerate(items):
            if k < done:
                continue
            cfg = SamplingConfig(temperature=temperature, top_p=SAMPLING_TOP_P, top_k=0, repetition_penalty=1.0,
                                 seed=seed + k)
            answer = None
            for event in engine.parallel(item.prompt, cfg, n=samples, mode="reason", budget=budget,
                                         answer_max_tokens=answer_max_tokens):
                answer = getattr(event, "answer", answer)
            kept = [c for c in answer.candidates if c.score is not None]
            shares = vote_shares([c.final_answer for c in kept])
            rows = []
            for c, share in zip(kept, shares, strict=True):
                feats.append(original_basis(engine.model, capture.rows[int(c.score)][None])[0])
                if layers:
                    deep.append(capture.layer_rows[int(c.score)])
                labels.append(1.0 if is_correct(c.text, item.gold) else 0.0)
                groups.append(k)
                extras.append([c.logprob_mean, c.logprob_lowest, share])
                rows.append({"question_index": k, "question": item.prompt, "gold": item.gold, "sample": c.index,
                             "text": c.text, "thinking": c.thinking, "final_answer": c.final_answer,
                             "correct": bool(labels[-1]), "thinking_tokens": c.thinking_tokens,
                             "answer_tokens": c.answer_tokens, "budget_forced": c.budget_forced,
                             "logprob_mean": c.logprob_mean, "logprob_lowest": c.logprob_lowest, "vote_share": share})
            if record is not None:
                record(k, item, rows)
            report(f"{k + 1}/{len(items)} questions, {int(sum(labels))}/{len(labels)} correct so far")
            if save is not None and (k + 1) % save_every == 0:
                save(state(k + 1))
    finally:
        engine.verifier = saved
    result = state(len(items))
    if save is not None:
        save(result)
    return result


WEIGHT_DECAYS = (0.1, 1.0, 10.0, 30.0, 100.0)
"""L2 (AdamW weight decay) strengths tried at the verifier's lr 5e-3; 100 already halves the weights each step, and
at 200 the decay zeroes them and above it flips their sign (300 and 1000, tried on 2026-12-06, oscillated and
diverged to NaN)."""
VERIFIER_LR = 5e-3
"""The verifier head's AdamW learning rate (300 full-batch epochs)."""
KEEP_MARGIN = 0.01
"""Within-question AUC the combiner must add to the head's to be saved."""


def group_split(groups: torch.Tensor, val_share: float, seed: int):
    """Train/validation indices with every question's samples on one side (no leak between its answers)."""
    ids = sorted(set(groups.tolist()))
    random.Random(seed).shuffle(ids)
    held = set(ids[: max(1, int(len(ids) * val_share))])
    tr = [i for i, g in enumerate(groups.tolist()) if g not in held]
    va = [i for i, g in enumerate(groups.tolist()) if g in held]
    return tr, va


def pick_weight_decay(x: torch.Tensor, y: torch.Tensor, groups: torch.Tensor, hidden_size: int, folds: int = 5,
                      seed: int = 0):
    """The L2 strength with the best mean k-fold AUC (folds by question): a few hundred samples in 896
    dimensions overfit easily."""
    scores = {}
    for wd in WEIGHT_DECAYS:
        aucs = []
        for tr, va in question_folds(groups, folds, seed):
            head = fit_head(VerifierHead(hidden_size), x[tr], y[tr], epochs=300, lr=VERIFIER_LR, weight_decay=wd, seed=seed)
            a = auc(head, x[va], y[va])
            if a is not None:
                aucs.append(a)
        scores[wd] = sum(aucs) / len(aucs) if aucs else 0.0
    return max(scores, key=scores.get), scores


def oof_logits(x: torch.Tensor, y: torch.Tensor, groups: torch.Tensor, hidden_size: int, weight_decay: float,
               folds: int = 5, seed: int = 0) -> torch.Tensor:
    """Each sample's logit from a head fitted on the other folds (folds by question)."""
    scores = torch.empty(len(y))
    for tr, va in question_folds(groups, folds, seed):
        head = fit_head(VerifierHead(hidden_size), x[tr], y[tr], epochs=300, lr=VERIFIER_LR, weight_decay=weight_decay,
                        seed=seed)
        with torch.no_grad():
            scores[va] = head(x[va]).float()
    return scores


def within_question_auc_oof(x: torch.Tensor, y: torch.Tensor, groups: torch.Tensor, hidden_size: int,
                            weight_decay: float, folds: int = 5, seed: int = 0,
                            logits: torch.Tensor | None = None) -> dict:
    """Out-of-fold (folds by question) AUC among each question's own answers, averaged over the questions with
    both right and wrong ones: the ranking a weighted vote needs (0.5 is a coin), which the pooled AUC hides."""
    scores = logits if logits is not None else oof_logits(x, y, groups, hidden_size, weight_decay, folds, seed)
    per_question = [a for g in set(groups.tolist())
                    if (a := pairwise_auc(scores[groups == g], y[groups == g])) is not None]
    return {"auc": round(sum(per_question) / len(per_question), 3) if per_question else None,
            "questions_with_both": len(per_question),
            "note": f"{folds}-fold by question, weight decay {weight_decay}, out-of-fold scores"}


def platt_scaling(logits: torch.Tensor, y: torch.Tensor, steps: int = 200) -> dict:
    """(scale, shift) with sigmoid(scale·logit + shift) the best calibrated probability (log-loss) for out-of-fold
    logits. A head fitted on a few hundred answers in 896 dimensions separates them perfectly and gives unseen
    answers logits of ±20: its raw probabilities (1e-8 against 1e-5) make a weighted vote a best-of-N; scaled,
    they are probabilities a vote can sum."""
    z = logits.detach().double()
    params = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        params[0] = 1.0 / max(float(z.std()), 1.0)
    optim = torch.optim.LBFGS([params], max_iter=steps, line_search_fn="strong_wolfe")
    target = y.double()

    def closure():
        optim.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(params[0] * z + params[1], target)
        loss.backward()
        return loss

    optim.step(closure)
    scale, shift = (float(v) for v in params.detach())
    return {"scale": round(scale, 6), "shift": round(shift, 6),
            "note": "Platt scaling fitted on the out-of-fold logits: P(correct) = sigmoid(scale·logit + shift)"}


def train_verifier(x: torch.Tensor, y: torch.Tensor, groups: torch.Tensor, out: Path, *, hidden_size: int,
                   model_id: str, precision: str, seed: int = 0, val_share: float = 0.2,
                   source: dict | None = None, extras: torch.Tensor | None = None,
                   answers: list[str | None] | None = None) -> dict:
    """Fit on the training questions (L2 picked by cross-validation), report on held-out questions, save. With
    `extras` (N, 3: mean and lowest-window log-prob, vote share) a combiner is fitted on them and the head's
    calibrated out-of-fold logit. With each candidate's final answer (`answers`) the saved vote rule is the one
    whose out-of-fold vote is right most often: majority, weighted by the head, or weighted by the combiner (each
    kept only when strictly better than the simpler ones); without them the combiner is kept when it ranks a
    question's answers better than the head alone."""
    tr, va = group_split(groups, val_share, seed)
    wd, cv = pick_weight_decay(x[tr], y[tr], groups[tr], hidden_size, seed=seed)
    head = fit_head(VerifierHead(hidden_size), x[tr], y[tr], epochs=300, lr=VERIFIER_LR, weight_decay=wd, seed=seed)
    metrics = {"train_accuracy": accuracy(head, x[tr], y[tr]), "val_accuracy": accuracy(head, x[va], y[va]),
               "val_auc": auc(head, x[va], y[va]), "n_train": len(tr), "n_val": len(va),
               "positive_share": y.mean().item(), "weight_decay": wd,
               "cv_auc": {str(k): round(v, 4) for k, v in cv.items()}}
    logits = oof_logits(x, y, groups, hidden_size, wd, seed=seed)
    metrics["within_question_auc_oof"] = within_question_auc_oof(x, y, groups, hidden_size, wd, seed=seed,
                                                                 logits=logits)
    metrics["calibration"] = platt_scaling(logits, y)
    config = {}
    if extras is not None:
        from core.training.combiner import fit_combiner

        cal = metrics["calibration"]
        combined = torch.cat([(logits * cal["scale"] + cal["shift"])[:, None], extras.float()], 1)
        combiner = fit_combiner(combined, y, groups, seed=seed)
        head_auc = metrics["within_question_auc_oof"]["auc"] or 0.0
        combiner["temperature"] = (source or {}).get("temperature", SAMPLING_TEMPERATURE)
        # kept only when clearly better: its AUC is the best of a few L2 strengths, which flatters it a little
        combiner["kept"] = combiner["within_question_auc_oof"] >= head_auc + KEEP_MARGIN
        if answers is not None:
            chosen = pick_vote(answers, y, groups, torch.sigmoid(logits * cal["scale"] + cal["shift"]), combined,
                               combiner, seed=seed)
            config["vote"], metrics["vote_oof"] = chosen["vote"], chosen["vote_oof"]
        metrics["combiner_fit"] = {k: v for k, v in combiner.items() if k not in ("mean", "std", "coef", "intercept")}
        if combiner["kept"]:
            config["combiner"] = combiner
    save_head(head, out, {"kind": "verifier", "hidden_size": hidden_size, "model": model_id, "precision": precision,
                          **metrics, **config,
                          "trained_on": source or {}})
    return metrics


def pick_vote(answers: list[str | None], y: torch.Tensor, groups: torch.Tensor, head_p: torch.Tensor,
              combined: torch.Tensor, combiner: dict, seed: int = 0) -> dict:
    """The vote rule to save, by out-of-fold vote accuracy: {"vote": ..., "vote_oof": accuracies}; sets
    combiner["kept"]. The head's probabilities are out of fold; the combiner is refitted on the other folds at its
    chosen L2."""
    from core.training.combiner import oof_scores, vote_accuracy

    combined_p = torch.sigmoid(oof_scores(combined.double(), y, groups, combiner["l2"], seed=seed))
    votes = {"majority": vote_accuracy(answers, y, groups), "head": vote_accuracy(answers, y, groups, head_p),
             "combiner": vote_accuracy(answers, y, groups, combined_p)}
    combiner["kept"] = votes["combiner"] > votes["head"]
    weighted = max(votes["head"], votes["combiner"])
    return {"vote": "weighted" if weighted > votes["majority"] else "majority",
            "vote_oof": {**votes, "note": "share of questions each rule's vote gets right, every score out of fold "
                                          "by question; the saved rule is the best, a simpler one on ties"}}
