"""GRIFFIN reselection during decoding: the answer, not only the prompt, picks the feed-forward neurons.

A prompt's neurons predict its answer's poorly (bench.griffin_selection: on a math prompt the prompt's choice at
87.5% kept is no better than a random one). With `reselect = k`, every k-th one-token decode step runs each
feed-forward block dense; its down-projection inputs z are scored as GRIFFIN scores a prompt (per token
L2-normalised, squared) and added to the running scores, the older ones first multiplied by `decay`; then each
layer keeps the new top share (`core.sparse.cut.choose_neurons`) and its cut block is rewritten **in place where
the choice changed**: a replaced neuron's gate and up rows (packed int4 nibbles), its down column (and, when a
32-neuron chunk of the cut down projection moves to another scale group, that chunk's scales) and its LoRA rows
and columns are copied from the dense layer into the slot the dropped neuron held. The kept neurons stay in their
slots, so a block's slots need not be sorted (`CutFF.kept[p]` is slot p's neuron).

Every row of one prompt adds to that prompt's scores (parallel answers share a selection). Blocks are shared by
copies of a cache (`copy.deepcopy`, core.decode.cache.fork): a selection writes only blocks it owns and copies
them first otherwise.
"""
from __future__ import annotations

import copy

import torch

from core.sparse.cut import BLOCK, CHUNK, CutFF, CutLinear, _dense_weight, choose_neurons, packed_group


class Reselection:
    """Running scores `scores[g][layer]` (I,) of prompt g and the period / decay of the rule."""

    def __init__(self, every: int, decay: float, scores: list[list[torch.Tensor]], mlps: list):
        if every < 2:
            raise ValueError("reselect every 2 or more tokens (1 would run every step dense)")
        self.every, self.decay, self.scores, self.mlps = every, decay, scores, mlps
        self.step = 0
        self.rewritten = 0
        """Slots rewritten so far (all layers, all prompts)."""

    def __deepcopy__(self, memo):
        out = copy.copy(self)
        out.scores = [[s.clone() for s in per_layer] for per_layer in self.scores]
        return out

    def dense_now(self, layer: int) -> bool:
        """Whether this step runs dense and reselects (counted at layer 0, once a step)."""
        if layer == 0:
            self.step += 1
        return self.step % self.every == 0

    def observe(self, layer: int, s: torch.Tensor, rows: list[int] | None, blocks: list[list[CutFF | None]]) -> None:
        """Add a dense step's GRIFFIN scores s (B, I) (`core.sparse.ff.neuron_scores` of its down-projection
        inputs) to each prompt's scores and rewrite the prompt's cut block of `layer` where its top neurons
        changed."""
        groups = [0] * s.shape[0] if rows is None else rows
        for g in dict.fromkeys(groups):
            mine = torch.tensor([i for i, r in enumerate(groups) if r == g])
            self.scores[g][layer] = self.scores[g][layer] * self.decay + s[mine].sum(dim=0)
            block = blocks[g][layer]
            if block is not None:
                mlp = self.mlps[layer]
                new = choose_neurons(self.scores[g][layer], len(block.kept), packed_group(mlp.down_proj))
                self.rewritten += rewrite(block, mlp, new)


def clone_block(block: CutFF | None) -> CutFF | None:
    """A copy of `block` whose tensors this copy may write (the dense layer's tensors are not copied)."""
    if block is None:
        return None
    out = copy.copy(block)
    for name in ("gate", "up", "down"):
        part = getattr(block, name)
        lora = {k: tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in v) for k, v in part.lora.items()}
        setattr(out, name, CutLinear(part.kind, part.weight.clone(), group=part.group,
                                     scales=None if part.scales is None else part.scales.clone(),
                                     bias=part.bias, peft=part.peft, lora=lora))
    out.kept = block.kept.clone()
    return out


def _slots(old: torch.Tensor, new: torch.Tensor, chunked: int | None) -> tuple[torch.Tensor, list[int]]:
    """The neuron each slot holds after the change (kept neurons stay put) and the chunks whose scale group
    changed. `chunked`: the scale group of a cut int4 down projection (slots come in chunks of one group)."""
    slots = old.clone()
    keep = torch.isin(old, new)
    if chunked is None:
        slots[~keep] = new[~torch.isin(new, old)]
        return slots, []
    chunks = old.view(-1, CHUNK)
    chunk_group = chunks[:, 0] // chunked
    groups = int(torch.maximum(old.max(), new.max())) // chunked + 1
    want = torch.bincount(new // chunked, minlength=groups) // CHUNK
    have = torch.bincount(chunk_group, minlength=groups)
    overlap = keep.view(-1, CHUNK).sum(dim=1)
    free, moved = [], []
    for g in (have > want).nonzero().flatten().tolist():  # a group that shrinks frees its emptiest chunks
        mine = (chunk_group == g).nonzero().flatten()
        free += mine[overlap[mine].argsort()][: int(have[g] - want[g])].tolist()
    chunk_group = chunk_group.clone()
    for g in (want > have).nonzero().flatten().tolist():  # a group that grows takes freed chunks
        for _ in range(int(want[g] - have[g])):
            c = free.pop()
            chunk_group[c] = g
            moved.append(c)
    slot_group = chunk_group.repeat_interleave(CHUNK)
    stays = keep & (old // chunked == slot_group)
    # each group has as many open slots as new neurons without one: both sorted by group, they pair up in order
    open_slots = (~stays).nonzero().flatten()
    open_slots = open_slots[slot_group[open_slots].argsort(stable=True)]
    slots[open_slots] = new[~torch.isin(new, old[stays])]  # `new` is sorted, so its groups are too
    return slots, moved


def _write_rows(cut: CutLinear, proj, pos: torch.Tensor, neurons: torch.Tensor) -> None:
    """Slots `pos` of a cut gate / up projection become the dense layer's output rows `neurons`."""
    base = getattr(proj, "base_layer", proj)
    if cut.kind == "int4":
        n, k = base.out_features, base.in_features
        src = base.weight._data._data.view(n // BLOCK, k, BLOCK // 2)
        dst = cut.weight.view(-1, k, BLOCK // 2)
        nib = src[neurons // BLOCK, :, neurons % (BLOCK // 2)]
        nib = torch.where((neurons % BLOCK >= BLOCK // 2).view(-1, 1), nib >> 4, nib & 0xF)
        for high in (False, True):  # two passes: slots p and p + 32 share a byte
            sel = (pos % BLOCK >= BLOCK // 2) == high
            p, v = pos[sel], nib[sel]
            byte = dst[p // BLOCK, :, p % (BLOCK // 2)]
            dst[p // BLOCK, :, p % (BLOCK // 2)] = (byte & 0x0F) | (v << 4) if high else (byte & 0xF0) | v
        cut.scales[:, pos] = base.weight._scale_shift[:, neurons]
    else:
        cut.weight[pos] = _dense_weight(base)[neurons].to(cut.weight.dtype)
    if cut.bias is not None:
        cut.bias[pos] = base.bias.detach()[neurons]
    for name, (_a, b, _bias, _s) in cut.lora.items():
        b[pos] = proj.lora_B[name].weight.detach()[neurons]


def _write_columns(cut: CutLinear, proj, pos: torch.Tensor, neurons: torch.Tensor, moved: list[int],
                   slots: torch.Tensor) -> None:
    """Slots `pos` of a cut down projection become the dense layer's input columns `neurons`; chunks `moved`
    take the scales of the group their new neurons (`slots`) belong to."""
    base = getattr(proj, "base_layer", proj)
    if cut.kind == "int4":
        n, k = base.out_features, base.in_features
        src = base.weight._data._data.view(n // BLOCK, k, BLOCK // 2)
        dst = cut.weight.view(n // BLOCK, -1, BLOCK // 2)
        dst[:, pos] = src[:, neurons]
        if moved:
            chunks = torch.tensor(moved)
            cut.scales[chunks] = base.weight._scale_shift[slots[chunks * CHUNK] // base.weight._group_size]
    else:
        cut.weight[:, pos] = _dense_weight(base)[:, neurons].to(cut.weight.dtype)
    for name, (a, _b, _bias, _s) in cut.lora.items():
        a[:, pos] = proj.lora_A[name].weight.detach()[:, neurons]


def rewrite(block: CutFF, mlp, new: torch.Tensor) -> int:
    """Make `block` compute the cut to neurons `new` (any order) by rewriting the slots whose neuron changed;
    returns how many slots were rewritten."""
    old = block.kept
    if bool(torch.isin(old, new).all()):
        return 0
    group = block.down.group == CHUNK and block.down.kind == "int4"
    slots, moved = _slots(old, new, packed_group(mlp.down_proj) if group else None)
    pos = (slots != old).nonzero().flatten()
    neurons = slots[pos]
    _write_rows(block.gate, mlp.gate_proj, pos, neurons)
    _write_rows(block.up, mlp.up_proj, pos, neurons)
    _write_columns(block.down, mlp.down_proj, pos, neurons, moved, slots)
    block.kept = slots
    return len(pos)
