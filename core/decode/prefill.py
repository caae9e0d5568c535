"""A bare prefill for measurements that need the prompt's logits or hidden states without decoding
(the switcher's route-only evaluation, head training, benchmarks). Decoding lives in `core.decode.rows`."""
from __future__ import annotations

import torch


@torch.inference_mode()
def prefill(model, input_ids: torch.Tensor, cache, want_hidden: bool = False):
    """Run the prompt (B, T) into `cache`. Returns (last logits (B, V), last-layer hidden states (B, T, H) or None)."""
    out = model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=1, output_hidden_states=want_hidden)
    hidden = out.hidden_states[-1] if want_hidden else None
    return out.logits[:, -1], hidden
