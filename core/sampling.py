"""Pure functions that turn logits into the next token: penalty, temperature, top-k, top-p, seeded draw."""
from __future__ import annotations

import torch

from .config import SamplingConfig


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


def sample_next(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None,
                seen: torch.Tensor | None = None) -> torch.Tensor:
    """Pick one token per row. logits: (B, V) -> (B,) int64. Temperature 0 is argmax."""
    logits = logits.float()
    if seen is not None:
        logits = apply_repetition_penalty(logits, seen, cfg.repetition_penalty)
    if cfg.greedy:
        return logits.argmax(dim=-1)
    logits = filter_top_k_top_p(logits / cfg.temperature, cfg.top_k, cfg.top_p)
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def make_generator(seed: int | None) -> torch.Generator:
    gen = torch.Generator()
    gen.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, (1,)).item()))
    return gen
