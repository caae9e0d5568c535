"""GRIFFIN sparse feed-forward (core.sparse.ff): the selection, the cut weights and the engine's use of them."""
import pytest
import torch
from torch import nn
from transformers import Qwen2Config
from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP

from core.config import SamplingConfig
from core.sparse import cut as sparse_cut
from core.sparse import ff as sparse_ff
from models import int4_grid
from models.quantization import quantize_model, unpack_matches_kernel
from tests.tiny import make_reasoning_engine

GREEDY = SamplingConfig(temperature=0, repetition_penalty=1.0, max_tokens=10)


@pytest.fixture(scope="module")
def engine():
    return make_reasoning_engine()


def masked_ff(mlp, x, kept):
    """The dense block with every neuron outside `kept` switched off: what a cut block must compute."""
    z = mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x)
    mask = torch.zeros(z.shape[-1], dtype=z.dtype)
    mask[kept] = 1
    return mlp.down_proj(z * mask)


def test_scores_are_per_token_normalised_norms():
    z = torch.tensor([[[3.0, 4.0, 0.0], [0.0, 0.0, 2.0]]])
    s = sparse_ff.neuron_scores(z)
    assert torch.allclose(s, torch.tensor([[0.36, 0.64, 1.0]]))
    masked = sparse_ff.neuron_scores(z, torch.tensor([[0, 1]]))  # a padding token counts for nothing
    assert torch.allclose(masked, torch.tensor([[0.0, 0.0, 1.0]]))


def test_kept_count_takes_whole_packed_blocks():
    assert sparse_ff.kept_count(4864, 0.5) == 2432 and sparse_ff.kept_count(4864, 0.5) % 64 == 0
    assert sparse_ff.kept_count(256, 0.3) == 64 and sparse_ff.kept_count(256, 1.0) == 256
    assert sparse_ff.kept_count(100, 0.5) == 50
    with pytest.raises(ValueError):
        sparse_ff.kept_count(256, 0)


def test_prefill_selection_keeps_the_highest_scoring_neurons(engine):
    model, layers = engine.model, sparse_ff._layers(engine.model)
    seen = {}
    hooks = [layer.mlp.down_proj.register_forward_pre_hook(
        lambda _m, args, i=i: seen.__setitem__(i, args[0].detach().clone())) for i, layer in enumerate(layers)]
    cache = sparse_ff_cache(engine)
    try:
        with sparse_ff.prefill_selection(model, cache, sparse_ff.SparsePlan("griffin", keep=0.25)), torch.inference_mode():
            model(input_ids=torch.tensor([engine.prompt_ids("What is 17*23?")]), cache=cache, use_cache=True)
    finally:
        for h in hooks:
            h.remove()
    selection = cache.ff_selection
    assert selection.rows == [0] and len(selection.blocks[0]) == len(layers)
    for i, block in enumerate(selection.blocks[0]):
        z = seen[i].float()
        scores = (z / z.norm(dim=-1, keepdim=True)).norm(dim=1)[0]  # per neuron, over the prompt's tokens
        want = scores.topk(sparse_ff.kept_count(z.shape[-1], 0.25)).indices.sort().values
        assert torch.equal(block.kept, want)
        assert scores[block.kept].min() >= scores[~torch.isin(torch.arange(z.shape[-1]), block.kept)].max()


def sparse_ff_cache(engine):
    from core.decode.cache import new_cache

    return new_cache(engine.model.config, engine.kv)


def test_cut_block_equals_the_dense_block_on_its_neurons(engine):
    mlp = sparse_ff._layers(engine.model)[0].mlp
    x = torch.randn(3, 1, mlp.hidden_size, dtype=torch.bfloat16)
    everything = torch.arange(mlp.intermediate_size)
    with torch.inference_mode():
        assert torch.equal(sparse_cut.cut_layer(mlp, everything)(x), mlp(x))  # keep = 100%: the dense block
        kept = torch.randperm(mlp.intermediate_size)[:100]
        torch.testing.assert_close(sparse_cut.cut_layer(mlp, kept)(x), masked_ff(mlp, x, kept), atol=2e-2, rtol=2e-2)


def test_cut_lora_follows_the_adapter_switch(engine):
    mlp = sparse_ff._layers(engine.model)[1].mlp
    x = torch.randn(2, 1, mlp.hidden_size, dtype=torch.bfloat16)
    kept = torch.arange(0, mlp.intermediate_size, 2)
    block = sparse_cut.cut_layer(mlp, kept)
    with torch.inference_mode():
        with engine.slots.using(engine.slots.reasoning):
            on, want_on = block(x), masked_ff(mlp, x, kept)
        with engine._base():
            off, want_off = block(x), masked_ff(mlp, x, kept)
    torch.testing.assert_close(on, want_on, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(off, want_off, atol=2e-2, rtol=2e-2)
    assert not torch.allclose(on, off, atol=1e-3)  # the adapter's cut weights are really applied


@pytest.mark.skipif(not unpack_matches_kernel(), reason="this CPU's int4 packing is not the one core reads")
def packed_mlp(seed: int) -> Qwen2MLP:
    """A Qwen2 MLP (256 -> 512 -> 256) quantized to packed int4, as the app serves its layers."""
    torch.manual_seed(seed)
    holder = nn.Module()
    holder.mlp = Qwen2MLP(Qwen2Config(hidden_size=256, intermediate_size=512, hidden_act="silu"))
    quantize_model(holder, 4)
    return holder.mlp


def test_packed_int4_cuts_keep_the_same_int4_numbers():
    mlp = packed_mlp(0)
    x = torch.randn(2, 1, 256, dtype=torch.bfloat16)
    kept = sparse_cut.choose_neurons(torch.rand(512), 256, group=128)
    with torch.inference_mode():
        gate = sparse_cut.cut_rows(mlp.gate_proj, kept)
        assert gate.kind == "int4"
        assert torch.equal(gate(x), mlp.gate_proj(x)[..., kept])  # same int4 numbers, same kernel
        scattered = torch.randperm(512)[:256].sort().values  # any rows, not only chosen ones
        assert torch.equal(sparse_cut.cut_rows(mlp.up_proj, scattered)(x), mlp.up_proj(x)[..., scattered])
        block = sparse_cut.cut_layer(mlp, kept)
        assert block.down.kind == "int4" and block.down.group == sparse_cut.CHUNK
        want = masked_ff(mlp, x, kept)  # the full down kernel on an input zero outside `kept`
        torch.testing.assert_close(block(x), want, atol=2e-2, rtol=1e-2)
        assert not sparse_cut.fold_branch(block, torch.zeros(8, 256), torch.zeros(256, 8))  # int4: kept beside
        assert block.folded == 0 and block.up.kind == "int4"


def _kernel_weight(packed, scales, n, k, group):
    """The float weight (n, k) a packed int4 tensor stands for, read back through the kernel itself."""
    return torch._weight_int4pack_mm_for_cpu(torch.eye(k, dtype=torch.bfloat16), packed, group, scales).t()


def test_a_rank_64_branch_folds_into_packed_int4_blocks_rounded_to_int4():
    """Where the cut reads this CPU's int4 packing the branch folds in rounded to int4; elsewhere the cut blocks
    are bf16 and the branch folds in as it is. Either way the folded block computes the block plus its branch."""
    mlp = packed_mlp(2)
    packed = unpack_matches_kernel()
    kept = sparse_cut.choose_neurons(torch.rand(512), 256, group=128)
    up, down = torch.randn(64, 256) / 16, torch.randn(256, 64) / 16
    r_int4 = _kernel_weight(*int4_grid.quantize_packed(up, 128), 64, 256, 128)
    l_int4 = _kernel_weight(*int4_grid.quantize_packed(down, sparse_cut.CHUNK), 256, 64, sparse_cut.CHUNK)
    assert (r_int4.float() - up).norm() < 0.1 * up.norm() and (l_int4.float() - down).norm() < 0.1 * down.norm()
    beside, folded = sparse_cut.cut_layer(mlp, kept), sparse_cut.cut_layer(mlp, kept)
    r_want, l_want = (r_int4, l_int4) if packed else (up.bfloat16(), down.bfloat16())
    beside.branch = lambda h: torch.nn.functional.linear(torch.nn.functional.linear(h, r_want), l_want)
    assert sparse_cut.fold_branch(folded, up, down)
    kind = "int4" if packed else "dense"
    assert folded.folded == 64 and folded.up.kind == kind and folded.down.kind == kind and folded.branch is None
    x = torch.randn(3, 1, 256, dtype=torch.bfloat16)
    with torch.inference_mode():
        want = beside(x)  # the cut block plus the (int4-rounded) branch, as two separate passes
        torch.testing.assert_close(folded(x), want, atol=3e-2, rtol=2e-2)
        assert not torch.allclose(want, masked_ff(mlp, x, kept), atol=1e-2)  # the branch does add something


def test_chosen_neurons_come_in_whole_chunks_of_one_group_and_follow_the_scores():
    torch.manual_seed(1)
    scores = torch.rand(4864)
    kept = sparse_cut.choose_neurons(scores, 2432, group=128)
    assert len(kept) == 2432 and torch.equal(kept, kept.sort().values)
    assert sparse_cut._whole_chunks(kept, 128)
    top = scores.topk(2432).indices
    assert torch.isin(kept, top).float().mean() > 0.85  # mostly the plain top-k's neurons
    assert scores[kept].sum() > 0.97 * scores[top].sum()
    assert torch.equal(sparse_cut.choose_neurons(scores, 2432), top.sort().values)  # no group: plain top-k


def test_selection_routes_each_row_through_its_own_prompts_block(engine):
    mlp = sparse_ff._layers(engine.model)[0].mlp
    a, b = torch.arange(0, 128), torch.arange(128, 256)
    blocks = [[sparse_cut.cut_layer(mlp, a)], [sparse_cut.cut_layer(mlp, b)]]
    selection = sparse_ff.FFSelection(blocks, [1, 0, 1])
    x = torch.randn(3, 1, mlp.hidden_size, dtype=torch.bfloat16)
    with torch.inference_mode():
        out = selection.forward(0, x, dense=None)
        for i, g in enumerate([1, 0, 1]):
            assert torch.equal(out[i:i + 1], blocks[g][0](x[i:i + 1]))
    assert selection.select(torch.tensor([2, 1])).rows == [1, 0]
    assert selection.repeat(2).rows == [1, 1, 0, 0, 1, 1]


@pytest.mark.parametrize("mode", ["base", "reason"])
def test_griffin_engine_answers_and_full_keep_equals_dense(engine, mode):
    try:
        dense = engine.generate("What is 2+2?", GREEDY, mode=mode, budget=6, answer_max_tokens=6)
        engine.decode, engine.ff_keep = "griffin", 1.0
        assert engine.generate("What is 2+2?", GREEDY, mode=mode, budget=6, answer_max_tokens=6).text == dense.text
        engine.ff_keep = 0.5
        sparse = engine.generate("What is 2+2?", GREEDY, mode=mode, budget=6, answer_max_tokens=6)
        assert engine.last_cache.ff_selection is not None and sparse.token_ids
        # parallel answers share one prompt's selection; a batch of prompts keeps one per prompt, per row
        list(engine.parallel("What is 2+2?", GREEDY, n=3, mode=mode, budget=4, answer_max_tokens=4))
        assert set(engine.last_cache.ff_selection.rows) == {0}
        prompts = ["What is 2+2?", "Name three colours of the rainbow, please, in order."]
        batch = engine.generate_batch(prompts, GREEDY, mode=mode, budget=6, answer_max_tokens=6)
        for prompt, got in zip(prompts, batch, strict=True):
            assert got.token_ids == engine.generate(prompt, GREEDY, mode=mode, budget=6, answer_max_tokens=6).token_ids
    finally:
        engine.decode, engine.ff_keep = "dense", 0.5
