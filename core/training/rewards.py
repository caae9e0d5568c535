"""Budget-forcing RL maths: the soft-barrier length reward, GRPO group advantages, the clipped policy loss, and the
masked two-pass log-probs it is taken on (`policy_update`, one GRPO optimizer step on a group of rollouts).

The reward, advantage and loss functions are pure (floats and tensors in and out), so every number is checkable
by hand.
- `barrier(L; B, m)`: 1 up to (1−m)·B, falling linearly to 0 at (1+m)·B, 0 beyond (the paper's soft barrier
  with penalty floor p = 0; docs/algorithms.md A.4b).
- `reward = correct × barrier`: a wrong answer earns nothing however short; a right one loses reward as it
  overruns the stated budget.
- `group_advantages`: GRPO's (r − mean) / (std + eps) over one question's G samples (population std, 1/G);
  a group whose rewards are all equal carries no signal and gets zeros.
- `grpo_loss`: PPO/GRPO's clipped surrogate per response token, plus β times the k3 estimator of
  KL(π_θ ‖ π_ref) (Schulman's `exp(r−n) − (r−n) − 1`, non-negative, unbiased), averaged over response tokens.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence

import torch

from core.adapters import lora as adapters
from core.decode.cache import fork, new_cache

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
              tokens: float | None = None, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Clipped GRPO objective (to minimise) over response tokens.

    logp_*: (G, T) log-probs of the sampled tokens under the policy being trained, the rollout policy and the
    reference; advantages: (G,) one per sample, shared by its tokens; mask: (G, T), 1 on sampled response
    tokens. Per token: −min(ρ·A, clip(ρ, 1−ε, 1+ε)·A) + β·k3, ρ = exp(new − old). The sum over masked tokens
    is divided by `tokens` (default: the mask's count), so a group can be processed one row at a time with the
    group's token count and the summed gradient is the same. `weights` (G, T), no gradient: each token's
    surrogate is multiplied by it (truncated importance sampling, `tis_weights`).
    """
    mask = mask.to(logp_new.dtype)
    ratio = torch.exp(logp_new - logp_old)
    adv = advantages.to(logp_new.dtype).view(-1, *([1] * (logp_new.dim() - 1)))
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv)
    if weights is not None:
        surrogate = surrogate * weights.to(surrogate.dtype)
    per_token = -surrogate + kl_coef * k3_kl(logp_new, logp_ref)
    count = float(tokens) if tokens is not None else float(mask.sum().item())
    return (per_token * mask).sum() / max(count, 1.0)


def tis_weights(logp_old: torch.Tensor, logp_rollout: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance sampling (Yao et al., 2025): min(π_old / π_rollout, cap) per token, where π_old is
    the trained weights' probability of the sampled token before the update and π_rollout the probability it had
    in the engine that sampled it (int4 weights, int8 cache). NaN rollout log-probs (fed tokens) get weight 1;
    cap ≤ 0 turns the correction off (all ones)."""
    if cap <= 0:
        return torch.ones_like(logp_old)
    rollout = torch.where(torch.isnan(logp_rollout), logp_old, logp_rollout)
    return torch.exp(logp_old - rollout).clamp(max=cap)


def prefix_cache(model, prefix: list[int]):
    """The prefix (prompt + `<think>\\n`) encoded base-only, without gradient: exactly the inference cache."""
    cache = new_cache(model.config, "bf16")
    with torch.no_grad(), adapters.base(model):
        model(input_ids=torch.tensor([prefix]), cache=cache, use_cache=True, logits_to_keep=1)
    return cache


def token_logprobs(model, cache, ids: list[int], temperature: float) -> torch.Tensor:
    """(T−1,) log-probs of ids[1:] with the adapter on, continuing a copy of the prefix cache."""
    logits = model(input_ids=torch.tensor([ids[:-1]]), cache=fork(cache, 1), use_cache=True).logits[0].float()
    logits = logits / temperature
    return logits.gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)


@contextlib.contextmanager
def swapped(params: list[torch.nn.Parameter], values: list[torch.Tensor]):
    """Temporarily load `values` into `params` (the reference adapter), restoring them on exit."""
    saved = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p, v in zip(params, values, strict=True):
            p.copy_(v)
    try:
        yield
    finally:
        with torch.no_grad():
            for p, s in zip(params, saved, strict=True):
                p.copy_(s)


def policy_update(model, optim, prefix: list[int], samples: list, advantages: list[float], ref: list[torch.Tensor],
                  *, clip: float, kl: float, temperature: float, updates: int = 1, tis_cap: float = 2.0,
                  scale: float = 1.0, apply: bool = True) -> dict:
    """`updates` clipped-GRPO optimizer steps on one group of samples (`.ids`, `.sampled`, and `.logprobs`, the
    rollout engine's, or None), one row's forward/backward at a time; `ref` holds the reference values of the
    trainable tensors. With rollout log-probs each token is weighted by `tis_weights(old, rollout, tis_cap)`;
    the stats report the mismatch (mean |old − rollout| over sampled tokens) and the share of capped weights.
    Several questions' groups in one step: each adds its gradient times `scale` with `apply=False` (one update
    only), and `apply_update` then takes the step."""
    if not apply and updates != 1:
        raise ValueError("groups accumulated into one step take one update each")
    params = [p for p in model.parameters() if p.requires_grad]
    cache = prefix_cache(model, prefix)
    rows = [(s, a) for s, a in zip(samples, advantages, strict=True) if len(s.ids) >= 2]
    masks = [torch.tensor(s.sampled[1:], dtype=torch.float32) for s, _ in rows]
    tokens = max(1.0, sum(float(m.sum()) for m in masks))
    refs = [None] * len(rows)
    if kl > 0:
        with torch.no_grad(), swapped(params, ref):
            refs = [token_logprobs(model, cache, s.ids, temperature) for s, _ in rows]
    old: list[torch.Tensor | None] = [None] * len(rows)
    weights: list[torch.Tensor | None] = [None] * len(rows)
    stats = {"loss": 0.0, "kl": 0.0}
    gap = capped = 0.0
    for k in range(updates):
        total = kl_sum = 0.0
        for i, (s, a) in enumerate(rows):
            new = token_logprobs(model, cache, s.ids, temperature)
            if old[i] is None:
                old[i] = new.detach()  # the rollout weights: this is the first pass before any update
                if getattr(s, "logprobs", None) is not None:
                    rollout = torch.tensor(s.logprobs[1:], dtype=torch.float32)
                    weights[i] = tis_weights(old[i], rollout, tis_cap)
                    seen = masks[i].bool() & ~torch.isnan(rollout)
                    gap += float((old[i] - rollout)[seen].abs().sum())
                    capped += float(((old[i] - rollout)[seen] > math.log(tis_cap)).sum()) if tis_cap > 0 else 0.0
            ref_i = refs[i] if refs[i] is not None else new.detach()
            w = weights[i][None] if weights[i] is not None else None
            loss = grpo_loss(new[None], old[i][None], ref_i[None], torch.tensor([a]), masks[i][None], clip, kl,
                             tokens=tokens, weights=w) * scale
            loss.backward()
            total += loss.item()
            kl_sum += float((k3_kl(new.detach(), ref_i) * masks[i]).sum())
        if apply:
            apply_update(params, optim)
        if k == 0:
            stats = {"loss": total, "kl": kl_sum / tokens, "mismatch": round(gap / tokens, 5),
                     "tis_capped": round(capped / tokens, 5)}
    return stats


def apply_update(params: list[torch.Tensor], optim: torch.optim.Optimizer) -> None:
    """One optimizer step on the gradients summed so far (norm clipped to 1), then cleared."""
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optim.step()
    optim.zero_grad(set_to_none=True)
