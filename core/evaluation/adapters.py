"""Before/after evaluation of a trained adapter on held-out records: greedy, short answers.

Each prompt is encoded once by the base model (adapter off), as at inference; the answer is then decoded
greedily with the adapter on ("after") and with it off ("before", the base model alone). Accuracy is reported
when every record has a checkable gold answer (core.reasoning.voting / math-verify), else None; mean answer tokens and a
few side-by-side samples always.
"""
from __future__ import annotations

import contextlib
import copy

import torch

from core.adapters import lora as adapters
from core.data.sft import encode_record
from core.decode.cache import new_cache
from core.prompting.chat_format import stop_token_ids


@torch.no_grad()
def greedy_answers(model, prompt: list[int], max_new_tokens: int, stop: set[int]) -> tuple[list[int], list[int]]:
    """(answer ids with the adapter off, answer ids with it on), both from one base-encoded prompt cache."""
    cache = new_cache(model.config, "bf16")
    with adapters.base(model):
        logits = model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True, logits_to_keep=1).logits
    outs = []
    for adapter_on in (False, True):
        branch = copy.deepcopy(cache) if not adapter_on else cache
        next_logits, ids = logits, []
        with contextlib.nullcontext() if adapter_on else adapters.base(model):
            for _ in range(max_new_tokens):
                tok = int(next_logits[0, -1].argmax())
                if tok in stop:
                    break
                ids.append(tok)
                next_logits = model(input_ids=torch.tensor([[tok]]), cache=branch, use_cache=True).logits
        outs.append(ids)
    return outs[0], outs[1]


def _side(texts: list[str], golds: list[str | None], tokens: list[int]) -> dict:
    from core.reasoning.voting import is_correct

    checkable = bool(golds) and all(g for g in golds)
    accuracy = (sum(is_correct(t, g) for t, g in zip(texts, golds, strict=True)) / len(texts)) if checkable else None
    return {"accuracy": accuracy, "mean_tokens": round(sum(tokens) / len(tokens), 1) if tokens else 0.0}


def evaluate_adapter(model, tokenizer, records: list, kind: str, *, max_new_tokens: int = 64, limit: int = 8,
                     samples: int = 3, should_stop=lambda: False) -> dict:
    """{"before": {accuracy, mean_tokens}, "after": {...}, "samples": [{prompt, before, after, gold}], "examples": n}
    on the first `limit` records."""
    was_training = model.training
    model.eval()
    stop = stop_token_ids(tokenizer)
    before_txt, after_txt, before_n, after_n, golds, out_samples = [], [], [], [], [], []
    try:
        for rec in records[:limit]:
            if should_stop():
                break
            prompt, _ = encode_record(tokenizer, rec, kind)
            before, after = greedy_answers(model, prompt, max_new_tokens, stop)
            b, a = tokenizer.decode(before), tokenizer.decode(after)
            before_txt.append(b)
            after_txt.append(a)
            before_n.append(len(before))
            after_n.append(len(after))
            golds.append(rec.gold)
            if len(out_samples) < samples:
                out_samples.append({"prompt": rec.question(), "before": b, "after": a, "gold": rec.gold})
    finally:
        model.train(was_training)
    return {"before": _side(before_txt, golds, before_n), "after": _side(after_txt, golds, after_n),
            "samples": out_samples, "examples": len(golds)}
