"""GRIFFIN sparse feed-forward for decoding: each prompt picks the feed-forward neurons its answer uses.

GRIFFIN (docs/algorithms.md B.1): the prefill runs dense; there, the input of each layer's down projection,
z = SiLU(gate(x)) · up(x) of shape (T, I), is L2-normalised per token, and neuron j scores the norm of its
column over the prompt's tokens. The top `keep` share of neurons (rounded to whole blocks of 64, the packed
kernel's unit) is kept, and one-token decode steps run gate / up / down cut to them: gate and up lose rows,
down loses columns. Multi-token feeds during decoding (a forced close, the verification prompt) run dense.

The cut weights are built once per prompt (`build`) by `core.sparse.cut`, as index copies of the packed int4
weights, so they hold the same numbers and run on the same kernels; LoRA adapters are cut alike, so Reason mode,
skills and parallel answers work on the sparse path.

With `reselect = k` (core.sparse.reselect) the answer picks too: every k-th decode step runs dense, adds its
activations to the scores and rewrites each cut block where its top neurons changed.

The selection belongs to the prompt, so it lives on the cache (`cache.ff_selection`, see `core.decode.cache`), one
entry per cache row, and follows the cache's row operations (parallel answers fork one prompt's selection,
finished rows leave); `core.decode.lean_layers` reads it in its one-token step.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import time
from dataclasses import dataclass

import torch

from core.sparse.cut import BLOCK, CutFF, choose_neurons, cut_layer, fold_branch, packed_group
from core.sparse.reselect import Reselection, clone_block


def kept_count(intermediate: int, keep: float) -> int:
    """How many of `intermediate` neurons a `keep` share keeps (whole blocks of 64 when the layer has them)."""
    if not 0 < keep <= 1:
        raise ValueError("keep must be in (0, 1]")
    n = max(1, round(intermediate * keep))
    if intermediate % BLOCK == 0:
        n = min(intermediate, max(BLOCK, round(n / BLOCK) * BLOCK))
    return n


def neuron_scores(z: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Squared GRIFFIN scores (B, I) of down-projection inputs z (B, T, I): per token L2-normalised, summed
    over the tokens `mask` (B, T) keeps (all when None). Sums of squares add up over prefill chunks."""
    zf = z.float()
    zf = zf / zf.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    sq = zf.square()
    if mask is not None:
        sq = sq * mask[:, -z.shape[1]:, None].to(sq.dtype)
    return sq.sum(dim=1)


@dataclass
class FFSelection:
    """Cut feed-forward blocks for the prompts in a cache: `blocks[g][layer]` for prompt g (None: that layer
    runs dense), `rows[i]` = the prompt cache row i belongs to."""

    blocks: list[list[CutFF | None]]
    rows: list[int] | None
    """None: every row uses blocks[0] (one prompt, or a rule that is not per prompt such as CATS)."""
    build_s: float = 0.0
    """Seconds the cut blocks took to build (part of the time to first token)."""
    reselection: Reselection | None = None
    """Reselection during decoding (core.sparse.reselect), or None: the prompt's choice holds."""
    owned: bool = False
    """Whether `blocks` belong to this selection alone (reselection rewrites them in place; shared ones are
    copied first)."""

    def __deepcopy__(self, memo):  # a forked cache shares the weights; neither copy writes them in place now
        self.owned = False
        return FFSelection(self.blocks, None if self.rows is None else list(self.rows),
                           reselection=copy.deepcopy(self.reselection))

    def _moved(self, rows: list[int] | None) -> FFSelection:
        """This selection with other rows (the cache replaces it): the blocks and their ownership move along."""
        out = FFSelection(self.blocks, rows, reselection=self.reselection, owned=self.owned)
        self.owned = False
        return out

    def repeat(self, n: int) -> FFSelection:
        return self._moved(None if self.rows is None else [g for g in self.rows for _ in range(n)])

    def select(self, indices: torch.Tensor) -> FFSelection:
        return self._moved(None if self.rows is None else [self.rows[i] for i in indices.tolist()])

    def forward(self, layer: int, x: torch.Tensor, dense) -> torch.Tensor:
        """The feed-forward output for x (B, 1, H), each row through its prompt's cut block (`dense(x)` where
        a layer has none). On a reselection step every row runs `dense(x, sink)`, which appends its
        down-projection input to `sink`, and the blocks of this layer are rewritten for the next steps."""
        if self.reselection is not None and self.reselection.dense_now(layer):
            sink: list[torch.Tensor] = []
            out = dense(x, sink)
            if not self.owned:
                self.blocks = [[clone_block(b) for b in per_layer] for per_layer in self.blocks]
                self.owned = True
            self.reselection.observe(layer, neuron_scores(sink[0]), self.rows, self.blocks)
            return out
        first = 0 if self.rows is None else self.rows[0]
        if self.rows is None or all(g == first for g in self.rows):
            block = self.blocks[first][layer]
            return block(x) if block is not None else dense(x)
        out = None
        for g in dict.fromkeys(self.rows):
            pos = torch.tensor([i for i, r in enumerate(self.rows) if r == g])
            block = self.blocks[g][layer]
            y = block(x[pos]) if block is not None else dense(x[pos])
            if out is None:
                out = y.new_empty(x.shape[0], *y.shape[1:])
            out[pos] = y
        return out


def _layers(model):
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return inner.model.layers


class Scorer:
    """Collects GRIFFIN scores from every prefill run inside `with scorer.collect(model)`."""

    def __init__(self, keep: float = 0.5, mask: torch.Tensor | None = None, min_tokens: int = 2):
        self.keep, self.mask, self.min_tokens = keep, mask, min_tokens
        """`min_tokens`: the shortest forward that is scored (2: prefills, not one-token decode steps)."""
        self.sums: dict[int, torch.Tensor] = {}

    @contextlib.contextmanager
    def collect(self, model):
        handles = []
        for i, layer in enumerate(_layers(model)):
            def hook(_module, args, i=i):
                z = args[0]
                if z.dim() == 3 and z.shape[1] >= self.min_tokens:
                    mask = self.mask if self.mask is not None and self.mask.shape[1] >= z.shape[1] else None
                    s = neuron_scores(z, mask)
                    self.sums[i] = s if i not in self.sums else self.sums[i] + s
            handles.append(layer.mlp.down_proj.register_forward_pre_hook(hook))
        try:
            yield self
        finally:
            for h in handles:
                h.remove()

    def build(self, model, branches=None, reselect: int = 0, decay: float = 1.0) -> FFSelection | None:
        """The cut blocks of each prompt seen (cache row order), with `branches(layer, x)` beside each (Caprese)
        when given, reselected every `reselect` decode steps when > 0; None when nothing was scored."""
        layers = _layers(model)
        if len(self.sums) != len(layers):
            return None
        prompts = next(iter(self.sums.values())).shape[0]
        blocks = []
        for b in range(prompts):
            per_layer = []
            for i, layer in enumerate(layers):
                scores = self.sums[i][b]
                n = kept_count(scores.numel(), self.keep)
                kept = choose_neurons(scores, n, packed_group(layer.mlp.down_proj))
                block = None if n >= scores.numel() else cut_layer(layer.mlp, kept)
                if block is not None and branches is not None and not fold_branch(
                        block, branches.up[i], branches.down[i]):
                    block.branch = functools.partial(branches, i)
                per_layer.append(block)
            blocks.append(per_layer)
        if not reselect:
            return FFSelection(blocks, list(range(prompts)))
        scores = [[self.sums[i][b].clone() for i in range(len(layers))] for b in range(prompts)]
        return FFSelection(blocks, list(range(prompts)), owned=True,
                           reselection=Reselection(reselect, decay, scores, [layer.mlp for layer in layers]))


class CatsBlock:
    """One layer's feed-forward with CATS's threshold (core.sparse.cats), plus `branch(x)` (Caprese) when given."""

    def __init__(self, mlp, threshold: float, branch=None):
        self.mlp, self.threshold, self.branch = mlp, threshold, branch

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        mlp = self.mlp
        h = mlp.act_fn(mlp.gate_proj(x))
        h = h.masked_fill(h.abs() < self.threshold, 0)
        out = mlp.down_proj(h * mlp.up_proj(x))
        return out if self.branch is None else out + self.branch(x)


@dataclass(frozen=True)
class SparsePlan:
    """How decode steps run the feed-forward: `kind` 'griffin' (per-prompt neurons, `keep` of them) or 'cats'
    (per-layer `thresholds` on |SiLU(gate)|, core.sparse.cats), with Caprese `branches` beside each block or not."""

    kind: str
    keep: float = 0.5
    thresholds: tuple[float, ...] | None = None
    branches: object = None
    reselect: int = 0
    """GRIFFIN: every this many decode steps one runs dense and reselects (0: never; core.sparse.reselect)."""
    decay: float = 1.0
    """GRIFFIN reselection: the earlier scores' factor at each reselection."""


@contextlib.contextmanager
def prefill_selection(model, cache, plan: SparsePlan | None, mask: torch.Tensor | None = None):
    """Run a request's prefills inside this block; with a plan, the cache then carries the decode steps' blocks
    (GRIFFIN: the prompts' own cuts; CATS: the thresholded blocks, one for every row)."""
    if plan is None:
        yield
        return
    if plan.kind == "cats":

        yield
        blocks = [CatsBlock(layer.mlp, t, functools.partial(plan.branches, i) if plan.branches else None)
                  for i, (layer, t) in enumerate(zip(_layers(model), plan.thresholds, strict=True))]
        cache.ff_selection = FFSelection([blocks], None)
        return
    if plan.kind != "griffin":
        raise ValueError(f"unknown sparse feed-forward {plan.kind!r}")
    scorer = Scorer(plan.keep, mask)
    with scorer.collect(model):
        yield
    start = time.perf_counter()
    cache.ff_selection = scorer.build(model, plan.branches, plan.reselect, plan.decay)
    if cache.ff_selection is not None:
        cache.ff_selection.build_s = time.perf_counter() - start


def plan_for(decode: str, keep: float, cats: dict | None, caprese: dict, reselect: int = 0,
             decay: float = 1.0) -> SparsePlan | None:
    """The plan for decode mode `decode` with the parts a model has: no CATS calibration means dense, no Caprese
    branches for the sparsity means the sparse blocks alone; None for dense. `reselect`/`decay`: GRIFFIN's
    reselection during decoding."""
    kind, _, extra = decode.partition("+")
    if kind == "dense" or (kind == "cats" and cats is None):
        return None
    branches = caprese.get(kind) if extra == "caprese" else None
    if kind == "cats":
        return SparsePlan("cats", thresholds=tuple(cats["thresholds"]), branches=branches)
    return SparsePlan("griffin", keep=branches.keep if branches is not None else keep, branches=branches,
                      reselect=reselect, decay=decay)


def missing_parts(decode: str, cats: dict | None, caprese: dict) -> str | None:
    """A note for the user when `decode` asks for a part the model lacks (what runs instead)."""
    kind, _, extra = decode.partition("+")
    if kind == "cats" and cats is None:
        return "This model has no CATS calibration (`ponder train cats`): decoding is dense."
    if extra == "caprese" and kind not in caprese:
        name = "GRIFFIN" if kind == "griffin" else "CATS"
        return f"This model has no Caprese branches for {name} (`ponder train caprese`): decoding uses {name} alone."
    return None


def teacher_forced(engine, example, hooks, plan: SparsePlan | None = None) -> None:
    """Run one SftExample as Reason mode runs it — the prompt by the base model (with `plan`'s prefill hook), the
    response with the reasoning adapter — with `hooks(selection)`'s forward hooks on during the response."""
    from core.data.sft import encode_example
    from core.decode.cache import new_cache

    model = engine.model
    prompt, response = encode_example(engine.tokenizer, example)
    cache = new_cache(model.config, "bf16")
    with engine._base(), torch.inference_mode(), prefill_selection(model, cache, plan):
        model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True, logits_to_keep=1)
    handles = hooks(cache.ff_selection)
    try:
        with engine.slots.using(engine.slots.reasoning), torch.inference_mode():
            model(input_ids=torch.tensor([response]), cache=cache, use_cache=True, logits_to_keep=1)
    finally:
        for h in handles:
            h.remove()
