"""Budget-forcing RL maths: the soft-barrier length reward, GRPO group advantages and the clipped policy loss.

Pure functions (floats and tensors in, floats and tensors out), so every number is checkable by hand.
- `barrier(L; B, m)`: 1 up to (1−m)·B, falling linearly to 0 at (1+m)·B, 0 beyond (the paper's soft barrier
  with penalty floor p = 0; algorithms.md A.4b).
- `reward = correct × barrier`: a wrong answer earns nothing however short; a right one loses reward as it
  overruns the stated budget.
- `group_advantages`: GRPO's (r − mean) / (std + eps) over one question's G samples (population std, 1/G);
  a group whose rewards are all equal carries no signal and gets zeros.
- `grpo_loss`: PPO/GRPO's clipped surrogate per response token, plus β times the k3 estimator of
  KL(π_θ ‖ π_ref) (Schulman's `exp(r−n) − (r−n) − 1`, non-negative, unbiased), averaged over response tokens.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

EPS = 1e-4


def barrier(length: float, budget: float, margin: float) -> float:
    """1 for length ≤ (1−m)·B, linear down to 0 at (1+m)·B, 0 beyond. m = 0 is a hard step at B."""
    if budget <= 0:
        raise ValueError("budget must be > 0")
    if not 0 <= margin <= 1:
        raise ValueError("margin must be in [0, 1]")
    low, high = (1 - margin) * budget, (1 + margin) * budget
    if length <= low:
        return 1.0
    if length >= high:
        return 0.0
    return 1.0 - (length - low) / (high - low)


def reward(correct: bool, length: float, budget: float, margin: float) -> float:
    """Correctness (0 or 1) times the barrier on the generated length."""
    return float(bool(correct)) * barrier(length, budget, margin)


def group_advantages(rewards: Sequence[float], eps: float = EPS) -> list[float]:
    """GRPO advantages of one question's samples: (r − mean) / (std + eps), population std; all equal → zeros."""
    if not rewards:
        return []
    n = len(rewards)
    mean = sum(rewards) / n
    std = (sum((r - mean) ** 2 for r in rewards) / n) ** 0.5
    if std < 1e-12:
        return [0.0] * n
    return [(r - mean) / (std + eps) for r in rewards]


def k3_kl(logp_new: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(π_new ‖ π_ref) from the sampled tokens' log-probs: e^(ref−new) − (ref−new) − 1."""
    delta = logp_ref - logp_new
    return torch.exp(delta) - delta - 1


def grpo_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, logp_ref: torch.Tensor, advantages: torch.Tensor,
              mask: torch.Tensor, clip: float = 0.2, kl_coef: float = 0.02,
              tokens: float | None = None) -> torch.Tensor:
    """Clipped GRPO objective (to minimise) over response tokens.

    logp_*: (G, T) log-probs of the sampled tokens under the policy being trained, the rollout policy and the
    reference; advantages: (G,) one per sample, shared by its tokens; mask: (G, T), 1 on sampled response
    tokens. Per token: −min(ρ·A, clip(ρ, 1−ε, 1+ε)·A) + β·k3, ρ = exp(new − old). The sum over masked tokens
    is divided by `tokens` (default: the mask's count), so a group can be processed one row at a time with the
    group's token count and the summed gradient is the same.
    """
    mask = mask.to(logp_new.dtype)
    ratio = torch.exp(logp_new - logp_old)
    adv = advantages.to(logp_new.dtype).view(-1, *([1] * (logp_new.dim() - 1)))
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv)
    per_token = -surrogate + kl_coef * k3_kl(logp_new, logp_ref)
    count = float(tokens) if tokens is not None else float(mask.sum().item())
    return (per_token * mask).sum() / max(count, 1.0)
