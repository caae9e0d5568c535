"""Pure functions that turn logits into the next token: penalty, temperature, top-k, top-p, seeded draw."""
from __future__ import annotations

import torch

from core.config import SamplingConfig


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL-style penalty on tokens in `seen` (B, S): positive logits divided, negative multiplied."""
    if penalty == 1.0 or seen.numel() == 0:
        return logits
    picked = torch.gather(logits, 1, seen)  # (B, S)
    picked = torch.where(picked > 0, picked / penalty, picked * penalty)
    return logits.scatter(1, seen, picked)


def filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) everything outside the top-k and the top-p nucleus. logits: (B, V)."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop = cum - torch.softmax(sorted_logits, dim=-1) >= top_p  # keep the token that crosses top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(1, order, sorted_logits)
    return logits


SHORTLIST = 256
"""Candidates examined before falling back to a full-vocabulary sort (Qwen's vocabulary has 151k entries)."""


def shortlist(logits: torch.Tensor, top_k: int, top_p: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The top-k / top-p filter on at most SHORTLIST candidates per row, when that is exact: (logits (B, C)
    with -inf outside the filter, their token ids (B, C)); None when a row's nucleus reaches past them."""
    vocab = logits.shape[-1]
    k = top_k if 0 < top_k < vocab else vocab
    c = min(k, SHORTLIST)
    if c == vocab or (top_p >= 1.0 and k > c):
        return None
    values, ids = torch.topk(logits, c, dim=-1)  # sorted, highest first
    if top_p >= 1.0:
        return values, ids
    pool = values if k == c else (logits if k == vocab else torch.topk(logits, k, dim=-1).values)
    probs = torch.exp(values - torch.logsumexp(pool, dim=-1, keepdim=True))  # over the top-k set, as the full filter
    cum = probs.cumsum(-1)
    if bool((cum[:, -1] < top_p).any()) and k > c:
        return None
    drop = cum - probs >= top_p  # keep the token that crosses top_p
    return values.masked_fill(drop, float("-inf")), ids


def sample_next(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None,
                seen: torch.Tensor | None = None) -> torch.Tensor:
    """Pick one token per row. logits: (B, V) -> (B,) int64. Temperature 0 is argmax.

    Top-k / top-p work on a short candidate list when it provably holds the whole filtered set (almost always:
    a language model's nucleus is rarely 256 tokens wide) and on the full sorted vocabulary otherwise."""
    logits = logits.float()
    if seen is not None:
        logits = apply_repetition_penalty(logits, seen, cfg.repetition_penalty)
    if cfg.greedy:
        return logits.argmax(dim=-1)
    logits = logits / cfg.temperature
    short = shortlist(logits, cfg.top_k, cfg.top_p)
    if short is not None:
        values, ids = short
        pick = torch.multinomial(torch.softmax(values, dim=-1), 1, generator=generator)
        return ids.gather(1, pick).squeeze(-1)
    probs = torch.softmax(filter_top_k_top_p(logits, cfg.top_k, cfg.top_p), dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def pick_logprobs(logits: torch.Tensor, picks: torch.Tensor, cfg: SamplingConfig,
                  seen: torch.Tensor | None = None) -> torch.Tensor:
    """(B,) log-probabilities of `picks` under the distribution `sample_next` draws from before its top-k/top-p
    filter: the penalised logits over the temperature (the raw penalised logits when greedy). With top_k = 0 and
    top_p = 1, as RL samples, that is exactly the sampling distribution."""
    logits = logits.float()
    if seen is not None:
        logits = apply_repetition_penalty(logits, seen, cfg.repetition_penalty)
    if not cfg.greedy:
        logits = logits / cfg.temperature
    return logits.gather(1, picks.view(-1, 1)).squeeze(1) - torch.logsumexp(logits, dim=-1)


def make_generator(seed: int | None) -> torch.Generator:
    gen = torch.Generator()
    gen.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, (1,)).item()))
    return gen
