"""GRIFFIN reselection during decoding (core.sparse.reselect): rewritten cut blocks, the engine's use of them."""
import copy

import pytest
import torch
from torch import nn
from transformers import Qwen2Config
from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP

from core.config import EngineConfig, SamplingConfig
from core.sparse import cut as sparse_cut
from core.sparse import ff as sparse_ff
from core.sparse import reselect
from models.quantization import quantize_model
from tests.tiny import make_reasoning_engine

GREEDY = SamplingConfig(temperature=0, repetition_penalty=1.0, max_tokens=12)


@pytest.fixture(scope="module")
def engine():
    return make_reasoning_engine()


def packed_mlp(seed: int) -> Qwen2MLP:
    """A Qwen2 MLP (256 -> 512 -> 256) quantized to int4 as the app serves its layers (packed where this CPU's
    packing is the one the cut reads, else the cut is bf16)."""
    torch.manual_seed(seed)
    holder = nn.Module()
    holder.mlp = Qwen2MLP(Qwen2Config(hidden_size=256, intermediate_size=512, hidden_act="silu"))
    quantize_model(holder, 4)
    return holder.mlp


def masked_ff(mlp, x, kept):
    z = mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x)
    mask = torch.zeros(z.shape[-1], dtype=z.dtype)
    mask[kept] = 1
    return mlp.down_proj(z * mask)


def fresh_cut(mlp, slots):
    """The block cut anew to neurons `slots` in that slot order: what a rewritten block must equal exactly."""
    return sparse_cut.CutFF(sparse_cut.cut_rows(mlp.gate_proj, slots), sparse_cut.cut_rows(mlp.up_proj, slots),
                            sparse_cut.cut_columns(mlp.down_proj, slots), mlp.act_fn, slots)


@pytest.mark.parametrize("seed,shift", [(0, 0.6), (1, 0.6), (2, 4.0), (3, 4.0)])
def test_a_rewritten_int4_block_equals_a_fresh_cut_of_its_new_neurons(seed, shift):
    mlp = packed_mlp(seed)
    gen = torch.Generator().manual_seed(seed)
    scores = torch.rand(512, generator=gen)
    old = sparse_cut.choose_neurons(scores, 256, group=128)
    later = scores + shift * torch.rand(512, generator=gen)
    if shift > 1:  # the answer favours other scale groups: whole chunks of the cut down projection move
        later = later + torch.tensor([2.0, 0.0, 1.0, 0.0]).repeat_interleave(128)
    new = sparse_cut.choose_neurons(later, 256, group=128)
    assert bool(reselect._slots(old, new, 128)[1]) == (shift > 1)
    block = sparse_cut.cut_layer(mlp, old)
    before = block.kept.clone()
    with torch.inference_mode():
        written = reselect.rewrite(block, mlp, new)
        assert torch.equal(block.kept.sort().values, new)  # the new neurons, each once
        assert 0 < written < 256  # only the slots whose neuron changed
        assert torch.equal(block.kept[torch.isin(before, new) & (block.kept == before)],
                           before[torch.isin(before, new) & (block.kept == before)])
        if block.down.kind == "int4":  # every chunk of the cut down projection still lies in one scale group
            chunks = block.kept.view(-1, sparse_cut.CHUNK) // 128
            assert bool((chunks == chunks[:, :1]).all())
        x = torch.randn(3, 1, 256, dtype=torch.bfloat16)
        assert torch.equal(block(x), fresh_cut(mlp, block.kept)(x))  # the same int4 numbers in the same slots
        torch.testing.assert_close(block(x), masked_ff(mlp, x, new), atol=3e-2, rtol=2e-2)
        assert reselect.rewrite(block, mlp, new) == 0  # nothing changed, nothing written


def test_a_rewritten_block_follows_the_adapter(engine):
    mlp = sparse_ff._layers(engine.model)[1].mlp
    block = sparse_cut.cut_layer(mlp, torch.arange(0, mlp.intermediate_size, 2))
    new = torch.randperm(mlp.intermediate_size, generator=torch.Generator().manual_seed(0))[:128].sort().values
    x = torch.randn(2, 1, mlp.hidden_size, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert reselect.rewrite(block, mlp, new) > 0
        for switch in (engine.slots.using(engine.slots.reasoning), engine._base()):
            with switch:
                torch.testing.assert_close(block(x), masked_ff(mlp, x, new), atol=2e-2, rtol=2e-2)


def test_a_copied_selection_leaves_the_original_blocks_alone(engine):
    mlp = sparse_ff._layers(engine.model)[0].mlp
    kept = torch.arange(128)
    scores = [[torch.zeros(mlp.intermediate_size)]]
    selection = sparse_ff.FFSelection([[sparse_cut.cut_layer(mlp, kept)]], [0], owned=True,
                                      reselection=reselect.Reselection(2, 1.0, scores, [mlp]))
    twin = copy.deepcopy(selection)
    assert not selection.owned and not twin.owned
    x = torch.randn(1, 1, mlp.hidden_size, dtype=torch.bfloat16)
    z_high = torch.zeros(1, 1, mlp.intermediate_size)
    z_high[..., 128:] = 1  # the other half of the neurons lights up

    def dense(h, sink=None):
        if sink is not None:
            sink.append(z_high)
        return mlp(h)

    with torch.inference_mode():
        twin.forward(0, x, dense)  # step 1: sparse
        twin.forward(0, x, dense)  # step 2: dense, reselects
    assert twin.owned and torch.equal(twin.blocks[0][0].kept.sort().values, torch.arange(128, 256))
    assert torch.equal(selection.blocks[0][0].kept, kept)  # the original's block was copied, not written
    assert selection.reselection.scores[0][0].sum() == 0


def test_the_engine_reselects_while_decoding(engine):
    prompt = "Name three colours of the rainbow, please, in order."
    try:
        engine.decode, engine.ff_keep = "griffin", 0.5
        plain = engine.generate(prompt, GREEDY, mode="base")
        engine.ff_reselect = 100  # a period longer than the answer: the prompt's choice holds
        assert engine.generate(prompt, GREEDY, mode="base").token_ids == plain.token_ids
        engine.ff_reselect = 2
        answer = engine.generate(prompt, GREEDY, mode="reason", budget=8, answer_max_tokens=8)
        selection = engine.last_cache.ff_selection
        assert answer.token_ids and selection.reselection.step >= 4 and selection.reselection.rewritten > 0
        x = torch.randn(2, 1, engine.model.config.hidden_size, dtype=torch.bfloat16)
        with torch.inference_mode(), engine._base():
            for i, block in enumerate(selection.blocks[0]):  # each block computes its (new) neurons' cut
                mlp = sparse_ff._layers(engine.model)[i].mlp
                torch.testing.assert_close(block(x), masked_ff(mlp, x, block.kept), atol=2e-2, rtol=2e-2)
        list(engine.parallel(prompt, GREEDY, n=3, mode="base", answer_max_tokens=6))  # forked rows share one
        assert set(engine.last_cache.ff_selection.rows) == {0}
        engine.ff_keep = 1.0  # everything kept: reselection changes nothing, the answer is the dense one
        full = engine.generate(prompt, GREEDY, mode="base")
        engine.decode = "dense"
        assert full.token_ids == engine.generate(prompt, GREEDY, mode="base").token_ids
    finally:
        engine.decode, engine.ff_keep, engine.ff_reselect = "dense", 0.5, 0


def test_config_refuses_a_reselection_every_step():
    with pytest.raises(ValueError):
        EngineConfig(ff_reselect=1)
    with pytest.raises(ValueError):
        EngineConfig(ff_decay=0)
    assert EngineConfig(ff_reselect=16, ff_decay=0.9).ff_reselect == 16
