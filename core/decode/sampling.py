"""Functions that turn logits into the next token: penalty, temperature, top-k, top-p, seeded draw.

Qwen's vocabulary has 151,936 entries, so a step's logits are 0.6 MB a row, and the decode step itself is ~12 ms on
two cores. Drawing with torch's general ops costs as much as the step on eight rows: every out-of-place op on a
(B, V) tensor is a fresh allocation (page faults), `argmax` is a scalar loop and `multinomial` over the whole
vocabulary takes ~3 ms a row. So each call copies the logits once into a float32 buffer kept per thread, works on
it in place, takes argmax with numpy's vectorised loop and draws in two small stages (a block of the vocabulary by
its summed weight, then a token within the block), which is the same distribution. Top-k / top-p draws look only at
a shortlist of the best candidates, which one C scan of the logits finds (`core.decode.ops.top_candidates`).
"""
from __future__ import annotations

import threading

import torch

from core.config import SamplingConfig

BLOCK = 1024
"""Vocabulary entries per block of the two-stage draw (fewer where the vocabulary is smaller)."""
KEEP = 4 * 2**20
"""Buffers up to this many floats (16 MB) stay allocated between calls; 8 rows of Qwen's vocabulary need 1.2 M."""

_SCRATCH = threading.local()


def _block(vocab: int) -> int:
    return min(BLOCK, vocab)


def _scratch(logits: torch.Tensor) -> torch.Tensor:
    """A float32 CPU copy of logits (B, V), without gradient, in this thread's buffer, zero-padded to whole blocks
    behind column V (the view returned has V columns). Valid until the next call on this thread; the joint
    decoder's greenlets share their thread's buffer, which is safe as no call here yields to another."""
    rows, vocab = logits.shape
    width = -(-vocab // _block(vocab)) * _block(vocab)
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.numel() < rows * width:
        with torch.inference_mode(False):  # a normal tensor, writable in and out of inference mode
            buf = torch.empty(rows * width, dtype=torch.float32)
        if buf.numel() <= KEEP:
            _SCRATCH.buf = buf
    full = buf[:rows * width].view(rows, width)
    full[:, vocab:].zero_()
    out = full[:, :vocab]
    out.copy_(logits.detach())
    return out


def _argmax(x: torch.Tensor) -> torch.Tensor:
    """(B,) int64 index of each row's first maximum; x float32 (B, V) with unit column stride. Row by row: numpy's
    vectorised loop runs on contiguous rows, not along the last axis of a strided 2-D view."""
    return torch.tensor([int(row.argmax()) for row in x.numpy()], dtype=torch.int64)


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float,
                             in_place: bool = False) -> torch.Tensor:
    """CTRL-style penalty on tokens in `seen` (B, S): positive logits divided, negative multiplied."""
    if penalty == 1.0 or seen.numel() == 0:
        return logits
    picked = torch.gather(logits, 1, seen)  # (B, S)
    picked = torch.where(picked > 0, picked / penalty, picked * penalty)
    return logits.scatter_(1, seen, picked) if in_place else logits.scatter(1, seen, picked)


def _draw_full(x: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one token per row from softmax(x / temperature) over the whole vocabulary; x is a `_scratch` view
    and is overwritten with the unnormalised weights."""
    rows, vocab = x.shape
    size = _block(vocab)
    x.sub_(x.amax(dim=-1, keepdim=True)).div_(temperature).exp_()
    if size == vocab:  # one block: one draw
        return torch.multinomial(x, 1, generator=generator).squeeze(-1)
    blocks = x.as_strided((rows, x.stride(0) // size, size), (x.stride(0), size, 1))  # the padding weighs 0
    block = torch.multinomial(blocks.sum(-1), 1, generator=generator).squeeze(-1)
    within = blocks[torch.arange(rows), block]  # (B, size)
    return block * size + torch.multinomial(within, 1, generator=generator).squeeze(-1)


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


def shortlist(logits: torch.Tensor, top_k: int, top_p: float,
              top: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The top-k / top-p filter on at most SHORTLIST candidates per row, when that is exact: (logits (B, C)
    with -inf outside the filter, their token ids (B, C)); None when a row's nucleus reaches past them.
    top: the C highest logits and their ids, highest first, where the caller has them (`top_candidates`), on the
    same scale as `logits`; `logits` is then read only when top_k is above SHORTLIST or off (and None is returned
    only then)."""
    vocab = logits.shape[-1]
    k = top_k if 0 < top_k < vocab else vocab
    c = min(k, SHORTLIST)
    if c == vocab or (top_p >= 1.0 and k > c):
        return None
    values, ids = torch.topk(logits, c, dim=-1) if top is None else top  # sorted, highest first
    if top_p >= 1.0:
        return values, ids
    pool = values if k == c else (logits if k == vocab else torch.topk(logits, k, dim=-1).values)
    probs = torch.exp(values - torch.logsumexp(pool, dim=-1, keepdim=True))  # over the top-k set, as the full filter
    cum = probs.cumsum(-1)
    if k > c and bool((cum[:, -1] < top_p).any()):
        return None
    drop = cum - probs >= top_p  # keep the token that crosses top_p
    return values.masked_fill(drop, float("-inf")), ids


def sample_next(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None,
                seen: torch.Tensor | None = None) -> torch.Tensor:
    """Pick one token per row. logits: (B, V) -> (B,) int64. Temperature 0 is argmax.

    Top-k / top-p work on a short candidate list when it provably holds the whole filtered set (almost always:
    a language model's nucleus is rarely 256 tokens wide) and on the full sorted vocabulary otherwise."""
    logits = _scratch(logits)
    if seen is not None:
        apply_repetition_penalty(logits, seen, cfg.repetition_penalty, in_place=True)
    if cfg.greedy:
        return _argmax(logits)
    if (cfg.top_k == 0 or cfg.top_k >= logits.shape[-1]) and cfg.top_p >= 1.0:
        return _draw_full(logits, cfg.temperature, generator)
    vocab = logits.shape[-1]
    k = cfg.top_k if 0 < cfg.top_k < vocab else vocab
    c = min(k, SHORTLIST)
    # the shortlist's c best from one C scan (torch's topk was most of a sampled token's cost), shifted as the whole
    # row would be (the first is the row's maximum)
    top = top_candidates(logits, c) if c < vocab and (cfg.top_p < 1.0 or k == c) else None
    if top is not None:
        values, ids = top
        top = values.sub_(values[:, :1].clone()).div_(cfg.temperature), ids
    if top is None or k > c:  # a top-p pool wider than the shortlist, and the full filter, read the whole row
        # each row's maximum at 0 first: logits over a tiny temperature (1e-40) would overflow to inf, inf - inf = nan
        logits = logits.sub_(logits.amax(dim=-1, keepdim=True)).div_(cfg.temperature)
    short = shortlist(logits, cfg.top_k, cfg.top_p, top)
    if short is not None:
        return _draw(*short, generator)
    probs = torch.softmax(filter_top_k_top_p(logits, cfg.top_k, cfg.top_p), dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def pick_logprobs(logits: torch.Tensor, picks: torch.Tensor, cfg: SamplingConfig,
                  seen: torch.Tensor | None = None) -> torch.Tensor:
    """(B,) log-probabilities of `picks` under the distribution `sample_next` draws from before its top-k/top-p
    filter: the penalised logits over the temperature (the raw penalised logits when greedy). With top_k = 0 and
    top_p = 1, as RL samples, that is exactly the sampling distribution."""
    logits = _scratch(logits)
    if seen is not None:
        apply_repetition_penalty(logits, seen, cfg.repetition_penalty, in_place=True)
    logits.sub_(logits.amax(dim=-1, keepdim=True))  # before the temperature, as in sample_next: no overflow
    if not cfg.greedy:
        logits.div_(cfg.temperature)
    picked = logits.gather(1, picks.view(-1, 1)).squeeze(1)
    return picked - logits.exp_().sum(-1).log()


def _draw(values: torch.Tensor, ids: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One id per row from softmax over a shortlist's logits (B, C), -inf outside the filter."""
    pick = torch.multinomial(torch.softmax(values, dim=-1), 1, generator=generator)
    return ids.gather(1, pick).squeeze(-1)


def top_candidates(x: torch.Tensor, c: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`core.decode.ops.top_candidates`, imported on first use (it loads the decode ops and the int4 kernel)."""
    from core.decode.ops import top_candidates as op

    return op(x, c)


def make_generator(seed: int | None) -> torch.Generator:
    gen = torch.Generator()
    gen.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, (1,)).item()))
    return gen
