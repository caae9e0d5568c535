"""Caprese branches (core.sparse.caprese): the closed-form fit, the FPT basis, and the engine decoding with them."""
import copy

import torch

from core.config import SamplingConfig
from core.data.sft import SftExample
from core.sparse import caprese
from core.sparse import cut as sparse_cut
from core.sparse import ff as sparse_ff
from models.fpt import apply_fpt
from tests.models.test_fpt import float_model, random_spec, run
from tests.tiny import make_reasoning_engine

GREEDY = SamplingConfig(temperature=0, repetition_penalty=1.0, max_tokens=8)
EXAMPLES = [SftExample("What is 17*23?", "17*23 = 17*20 + 17*3 = 340 + 51 = 391.", "The answer is \\boxed{391}.",
                       "391"),
            SftExample("Tom has 3 apples and buys 4 more. How many?", "3 + 4 = 7.", "The answer is \\boxed{7}.", "7"),
            SftExample("What is 2+2?", "2 + 2 = 4.", "The answer is \\boxed{4}.", "4")]


def test_fit_recovers_a_low_rank_map_and_never_adds_error():
    torch.manual_seed(0)
    hidden, rank = 32, 4
    w = torch.randn(hidden, rank) @ torch.randn(rank, hidden)
    x = torch.randn(500, hidden)
    m = caprese.Moments(hidden)
    m.add(x, x @ w.t(), torch.randn(500, hidden))
    r, low = caprese.fit(m, rank, ridge=0)
    torch.testing.assert_close(low @ r, w, atol=1e-3, rtol=1e-3)
    assert m.error(low @ r) < 1e-8 < m.error(None)
    noisy = caprese.Moments(hidden)
    noisy.add(x, x @ w.t() + torch.randn(500, hidden), x)
    r, low = caprese.fit(noisy, 2)  # a lower rank than the map's: still no worse than no branch
    assert noisy.error(low @ r) < noisy.error(None)


def test_a_zero_branch_is_the_sparse_block_exactly():
    engine = make_reasoning_engine()
    mlp = sparse_ff._layers(engine.model)[0].mlp
    block = sparse_cut.cut_layer(mlp, torch.arange(0, 256, 3))
    x = torch.randn(2, 1, 128, dtype=torch.bfloat16)
    hidden = 128
    zero = caprese.Branches([torch.randn(8, hidden).bfloat16()], [torch.zeros(hidden, 8).bfloat16()])
    with torch.inference_mode():
        plain = block(x)
        block.branch = lambda h: zero(0, h)
        assert torch.equal(block(x), plain)


def test_a_folded_branch_equals_the_branch_beside_the_block():
    engine = make_reasoning_engine()
    mlp = sparse_ff._layers(engine.model)[1].mlp
    kept = torch.arange(0, mlp.intermediate_size, 2)
    torch.manual_seed(0)
    hidden = mlp.hidden_size
    branches = caprese.Branches([torch.randn(8, hidden).bfloat16() / 8], [torch.randn(hidden, 8).bfloat16() / 8])
    beside, folded = sparse_cut.cut_layer(mlp, kept), sparse_cut.cut_layer(mlp, kept)
    beside.branch = lambda h: branches(0, h)
    assert sparse_cut.fold_branch(folded, branches.up[0], branches.down[0]) and folded.folded == 8
    x = torch.randn(3, 1, hidden, dtype=torch.bfloat16)
    with torch.inference_mode():
        for scope in (engine.slots.using(engine.slots.reasoning), engine._base()):  # the adapter on, then off
            with scope:
                want = beside(x)
                torch.testing.assert_close(folded(x), want, atol=2e-2, rtol=2e-2)
                assert not torch.allclose(want, beside.down(beside.act(beside.gate(x)) * beside.up(x)), atol=1e-3)


def _with_branches(model, branches):
    layers = sparse_ff._layers(model)
    return [layer.mlp.register_forward_hook(lambda m, a, o, i=i: o + branches(i, a[0]).to(o.dtype))
            for i, layer in enumerate(layers)]


def test_branches_move_between_the_original_and_the_fpt_basis(tmp_path):
    original = float_model()
    transformed = apply_fpt(copy.deepcopy(original), random_spec(original.config))
    torch.manual_seed(3)
    layers, hidden = original.config.num_hidden_layers, original.config.hidden_size
    branches = caprese.Branches([torch.randn(8, hidden) * 0.1 for _ in range(layers)],
                                [torch.randn(hidden, 8) * 0.1 for _ in range(layers)], {"rank": 8})
    caprese.save(branches, original, tmp_path / "orig")
    moved = caprese.load(tmp_path / "orig", transformed)
    moved = caprese.Branches([u.float() for u in moved.up], [d.float() for d in moved.down])
    ids = torch.randint(5, 440, (1, 12))
    hooks = _with_branches(original, caprese.Branches([u.bfloat16().float() for u in branches.up],
                                                      [d.bfloat16().float() for d in branches.down]))
    want = run(original, ids).logits
    for h in hooks:
        h.remove()
    hooks = _with_branches(transformed, moved)
    got = run(transformed, ids).logits
    for h in hooks:
        h.remove()
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    assert not torch.allclose(want, run(original, ids).logits, atol=1e-3)  # the branches do change the output
    caprese.save(moved, transformed, tmp_path / "back")  # saved from the transformed model: the original basis
    back = caprese.load(tmp_path / "back", original)
    torch.testing.assert_close(back.up[1].float(), branches.up[1], atol=2e-3, rtol=2e-2)


def test_trained_branches_cut_the_sparse_error_and_the_engine_decodes_with_them(tmp_path):
    engine = make_reasoning_engine()
    branches, meta = caprese.train(engine, EXAMPLES[:2], EXAMPLES[2:], rank=16, plan=sparse_ff.SparsePlan("griffin"),
                                   report=lambda _: None)
    assert meta["rank"] == 16 and meta["ff_keep"] == 0.5 and meta["train_tokens"] > 0 and meta["dev_tokens"] > 0
    assert meta["mean_train_error_caprese"] < meta["mean_train_error_sparse"]
    caprese.save(branches, engine.model, tmp_path / "caprese")
    engine.caprese = {"griffin": caprese.load(tmp_path / "caprese", engine.model)}
    try:
        engine.decode = "griffin+caprese"
        answer = engine.generate("What is 2+2?", GREEDY, mode="reason", budget=4, answer_max_tokens=4)
        blocks = engine.last_cache.ff_selection.blocks[0]
        assert answer.token_ids and all(b is not None and b.folded == 16 for b in blocks)  # bf16: folded in
        engine.decode = "griffin"
        engine.generate("What is 2+2?", GREEDY, mode="reason", budget=4, answer_max_tokens=4)
        assert all(b.branch is None and not b.folded for b in engine.last_cache.ff_selection.blocks[0])
    finally:
        engine.decode, engine.caprese = "dense", {}


def test_cats_thresholds_hit_the_target_sparsity_and_zero_is_dense():
    from core.sparse import cats

    torch.manual_seed(0)
    samples = [torch.rand(10000), torch.rand(10000) * 4]
    t = cats.thresholds_for(samples, 0.5)
    assert abs(t[0] - 0.5) < 0.02 and abs(t[1] - 2.0) < 0.08
    assert cats.thresholds_for(samples, 0) == [0.0, 0.0]
    engine = make_reasoning_engine()
    mlp = sparse_ff._layers(engine.model)[0].mlp
    x = torch.randn(2, 1, 128, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(sparse_ff.CatsBlock(mlp, 0.0)(x), mlp(x))
        h = mlp.act_fn(mlp.gate_proj(x)).abs().float()
        half = float(h.flatten().kthvalue(h.numel() // 2).values)
        block = sparse_ff.CatsBlock(mlp, half)
        kept = mlp.act_fn(mlp.gate_proj(x)).masked_fill(h < half, 0)
        assert abs((kept == 0).float().mean().item() - 0.5) < 0.02
        torch.testing.assert_close(block(x), mlp.down_proj(kept * mlp.up_proj(x)))


def test_cats_calibrated_and_recovered_in_the_engine(tmp_path):
    from core.sparse import cats

    engine = make_reasoning_engine()
    thresholds = cats.calibrate(engine, EXAMPLES, 0.5)
    assert len(thresholds) == 2 and all(t > 0 for t in thresholds)
    cats.save(tmp_path / "cats", thresholds, {"sparsity": 0.5})
    engine.cats = cats.load(tmp_path / "cats", 2)
    plan = sparse_ff.SparsePlan("cats", thresholds=tuple(thresholds))
    branches, meta = caprese.train(engine, EXAMPLES[:2], [], rank=8, plan=plan, report=lambda _: None)
    assert meta["sparse"] == "cats" and meta["mean_train_error_caprese"] < meta["mean_train_error_sparse"]
    engine.caprese = {"cats": branches}
    try:
        for decode, with_branch in (("cats", False), ("cats+caprese", True)):
            engine.decode = decode
            answer = engine.generate("What is 2+2?", GREEDY, mode="reason", budget=4, answer_max_tokens=4)
            blocks = engine.last_cache.ff_selection.blocks[0]
            assert answer.token_ids and all(isinstance(b, sparse_ff.CatsBlock) for b in blocks)
            assert all((b.branch is not None) == with_branch for b in blocks)
        list(engine.parallel("What is 2+2?", GREEDY, n=2, mode="reason", budget=3, answer_max_tokens=3))
        engine.cats = None
        assert engine.sparse_plan() is None and "no CATS calibration" in engine.missing_for_decode()
    finally:
        engine.decode, engine.caprese, engine.cats = "dense", {}, None
