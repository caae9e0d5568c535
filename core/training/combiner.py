"""The verifier's combiner: a logistic regression over what a candidate says of itself, fitted on out-of-fold data.

Inputs (`core.reasoning.verifier.COMBINED_FEATURES`): the hidden-state head's calibrated logit (out of fold, so
the combiner learns how far an unseen answer's score can be trusted, not how well the head remembers its training
answers), the candidate's mean and lowest-window token log-prob, and its vote share among its question's samples.
Features are standardised; L2 strength is picked by question-grouped cross-validation on the within-question AUC,
the ranking a weighted vote needs. `fit_combiner` reports that AUC out of fold for the combiner and for each input
alone (DeepConf's confidences and the vote share are baselines in their own right), and returns the config the
verifier saves; `train_verifier` keeps the combiner only when it ranks better than the head alone.
"""
from __future__ import annotations

import torch

from core.reasoning.verifier import COMBINED_FEATURES
from core.training.folds import pairwise_auc, question_folds

L2 = (0.01, 0.1, 1.0, 10.0)


def fit_logistic(x: torch.Tensor, y: torch.Tensor, l2: float, steps: int = 100) -> tuple[torch.Tensor, float]:
    """(coef, intercept) of an L2-regularised logistic regression on standardised x (N, F), by L-BFGS."""
    x, y = x.double(), y.double()
    params = torch.zeros(x.shape[1] + 1, dtype=torch.float64, requires_grad=True)
    optim = torch.optim.LBFGS([params], max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        optim.zero_grad()
        z = x @ params[:-1] + params[-1]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(z, y) + l2 * (params[:-1] ** 2).sum() / len(y)
        loss.backward()
        return loss

    optim.step(closure)
    coef = params.detach()
    return coef[:-1], float(coef[-1])


def within_question_auc(scores: torch.Tensor, y: torch.Tensor, groups: torch.Tensor) -> float | None:
    """Mean AUC among each question's own candidates, over questions with right and wrong ones."""
    values = [a for g in set(groups.tolist()) if (a := pairwise_auc(scores[groups == g], y[groups == g])) is not None]
    return round(sum(values) / len(values), 4) if values else None


def _standardise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.mean(0), x.std(0).clamp(min=1e-6)


def oof_scores(x: torch.Tensor, y: torch.Tensor, groups: torch.Tensor, l2: float, folds: int = 5,
               seed: int = 0) -> torch.Tensor:
    """Each candidate's combined logit from a regression fitted on the other questions."""
    out = torch.zeros(len(y), dtype=torch.float64)
    for tr, va in question_folds(groups, folds, seed):
        mean, std = _standardise(x[tr])
        coef, intercept = fit_logistic((x[tr] - mean) / std, y[tr], l2)
        out[va] = ((x[va].double() - mean) / std) @ coef + intercept
    return out


def fit_combiner(x: torch.Tensor, y: torch.Tensor, groups: torch.Tensor, seed: int = 0) -> dict:
    """x: (N, 4) COMBINED_FEATURES rows (the head's logit out of fold). Returns the saved config: the regression
    fitted on everything with the L2 strength that ranks best out of fold, and the out-of-fold AUCs."""
    x = x.double()
    cv = {l2: within_question_auc(oof_scores(x, y, groups, l2, seed=seed), y, groups) or 0.0 for l2 in L2}
    l2 = max(cv, key=cv.get)
    mean, std = _standardise(x)
    coef, intercept = fit_logistic((x - mean) / std, y, l2)
    alone = {name: within_question_auc(x[:, i], y, groups) for i, name in enumerate(COMBINED_FEATURES)}
    return {"features": list(COMBINED_FEATURES), "mean": mean.tolist(), "std": std.tolist(), "coef": coef.tolist(),
            "intercept": intercept, "l2": l2, "within_question_auc_oof": cv[l2],
            "within_question_auc_alone": alone, "n": len(y),
            "note": "logistic regression on standardised features; AUCs among each question's own candidates, "
                    "the combiner's out of fold by question (5 folds), each input's as it stands"}


def vote_accuracy(answers: list[str | None], y: torch.Tensor, groups: torch.Tensor,
                  weights: torch.Tensor | None = None) -> float:
    """Share of questions whose vote over their own candidates picks a right one: weighted by `weights` (the app's
    weighted vote) or, without them, a plain count. The measure a vote rule is chosen by: a score's within-question
    AUC does not say what it adds to a vote that already counts agreement."""
    from core.reasoning.voting import vote

    by_question: dict[int, list[int]] = {}
    for i, g in enumerate(groups.tolist()):
        by_question.setdefault(g, []).append(i)
    right = 0
    for rows in by_question.values():
        result = vote([answers[i] for i in rows], None if weights is None else [float(weights[i]) for i in rows],
                      "majority" if weights is None else "weighted")
        right += result.winner_index is not None and bool(y[rows[result.winner_index]])
    return round(right / len(by_question), 4) if by_question else 0.0
