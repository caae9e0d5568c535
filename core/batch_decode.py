"""Greedy answers to several *different* prompts decoded as one batch, for evaluation throughput.

The prompts are left-padded into one base-model prefill (attention mask and per-row positions), then every
row follows the engine's own rules in lockstep: in reasoning mode a `<think>` trace under the adapter up to
the budget, the engine's forced close and "Final answer: " prefix when the budget is reached, then the
answer; in base mode the answer alone. Finished rows leave the batch. Same prompts, same rules, same
weights as `Engine.stream`; only the batching differs (so results can differ from one-at-a-time runs in
the last bits of floating point). The interactive app never uses this; `ponder eval --batch K` does.
"""
from __future__ import annotations

import torch

from .cache import new_cache
from .parallel import Row
from .prompts import reasoning_prompts
from .text_stream import TextStream


def row_result(row: Row, forced_prefix: str) -> dict:
    text = (forced_prefix if row.forced else "") + row.answer.text.lstrip("\n")
    return {"text": text, "thinking": row.think.text, "thinking_tokens": len(row.thinking_ids),
            "answer_tokens": len(row.answer_ids), "budget_forced": row.budget_hit}


@torch.inference_mode()
def greedy_batch(engine, prompts: list[list[int]], *, reasoning: bool, think_limit: int, answer_limit: int
                 ) -> list[dict]:
    """Greedy results (text, thinking, token counts, budget_forced) for each prompt's ids, in order."""
    tok, model = engine.tokenizer, engine.model
    marker = reasoning_prompts()["think_close_marker"]
    seqs = [ids + (engine._think_open if reasoning else []) for ids in prompts]
    width = max(len(s) for s in seqs)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    input_ids = torch.tensor([[pad] * (width - len(s)) + s for s in seqs])
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = new_cache(model.config, engine.kv)
    with engine._base():
        logits = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
                       logits_to_keep=1).logits[:, -1]
    next_pos = positions[:, -1] + 1
    rows = [Row(i, "thinking" if reasoning else "answer", TextStream(tok, (marker,)), TextStream(tok, ()))
            for i in range(len(seqs))]
    active = list(range(len(seqs)))
    context = (lambda: torch.inference_mode()) if reasoning else engine._base
    while active:
        picks = logits.argmax(-1).tolist()
        inputs = []
        for pos, r in enumerate(active):
            row, t = rows[r], picks[pos]
            if row.queue:
                inputs.append(row.queue.pop(0))
                if not row.queue and row.phase == "closing":
                    row.phase = "answer"
                continue
            is_eos = t in engine.eos_ids
            if row.phase == "thinking":
                if not is_eos:
                    row.thinking_ids.append(t)
                    row.think.push(t)
                if row.think.stopped:  # the model closed its trace itself: answer on
                    row.phase = "answer"
                elif is_eos or len(row.thinking_ids) >= think_limit:
                    row.forced, row.budget_hit = True, not is_eos
                    row.think.flush()
                    row.queue = ([] if is_eos else [t]) + engine._think_close + engine._forced_prefix
                    row.phase = "closing"
                    inputs.append(row.queue.pop(0))
                    continue
                inputs.append(t)
                continue
            if is_eos:  # counted, as the engine counts it, but never shown
                row.answer_ids.append(t)
                row.phase = "done"
                inputs.append(t)
                continue
            row.answer_ids.append(t)
            row.answer.push(t)
            if len(row.answer_ids) >= answer_limit:
                row.phase = "done"
            inputs.append(t)
        keep = [pos for pos, r in enumerate(active) if rows[r].phase != "done"]
        if not keep:
            break
        if len(keep) < len(active):  # drop finished rows before the next forward pass
            index = torch.tensor(keep)
            cache.batch_select_indices(index)
            mask, next_pos = mask[index], next_pos[index]
            inputs = [inputs[pos] for pos in keep]
            active = [active[pos] for pos in keep]
        mask = torch.cat([mask, torch.ones(len(active), 1, dtype=mask.dtype)], dim=1)
        with context():
            logits = model(input_ids=torch.tensor(inputs).view(-1, 1), attention_mask=mask,
                           position_ids=next_pos.view(-1, 1), cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
        next_pos = next_pos + 1
    for row in rows:
        row.answer.flush()
    return [row_result(row, engine._forced_prefix_text) for row in rows]
