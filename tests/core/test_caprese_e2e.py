"""Caprese's end-to-end stage (core.sparse.caprese_e2e) on the tiny model: the training block is the inference block, a
full keep with zero branches is the dense model, and training lowers the KL to the dense model."""
import pytest
import torch

from core.data.sft import encode_example
from core.sparse import caprese, caprese_e2e
from core.sparse import cut as sparse_cut
from core.sparse import ff as sparse_ff
from tests.core.test_caprese import EXAMPLES
from tests.tiny import make_reasoning_engine


def _zero_branches(model, rank: int = 8) -> caprese.Branches:
    layers, hidden = model.config.num_hidden_layers, model.config.hidden_size
    return caprese.Branches([torch.randn(rank, hidden) * 0.1 for _ in range(layers)],
                            [torch.zeros(hidden, rank) for _ in range(layers)], {"rank": rank})


def test_the_masked_training_block_computes_the_cut_decode_block():
    engine = make_reasoning_engine()
    mlp = sparse_ff._layers(engine.model)[0].mlp
    torch.manual_seed(0)
    scores = torch.rand(mlp.intermediate_size)
    kept = sparse_cut.choose_neurons(scores, 128)
    mask = torch.zeros(mlp.intermediate_size)
    mask[kept] = 1
    hidden = mlp.hidden_size
    up, down = torch.randn(4, hidden) * 0.1, torch.randn(hidden, 4) * 0.1
    block = sparse_cut.cut_layer(mlp, kept)
    block.branch = lambda h: torch.nn.functional.linear(torch.nn.functional.linear(h.float(), up), down).to(h.dtype)
    x = torch.randn(2, 1, hidden, dtype=torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(caprese_e2e._sparse_mlp(mlp, up, down, mask=mask)(x), block(x), atol=2e-2, rtol=2e-2)


def test_full_keep_with_zero_branches_is_the_dense_model_and_forward_is_restored():
    engine = make_reasoning_engine()
    model = engine.model
    prompt, response = encode_example(engine.tokenizer, EXAMPLES[0])
    branches = _zero_branches(model)
    kl = caprese_e2e.sequence_kl(model, prompt, response, sparse_ff.SparsePlan("griffin", keep=1.0),
                                 branches.up, branches.down)
    assert abs(kl.item()) < 1e-6
    half = caprese_e2e.sequence_kl(model, prompt, response, sparse_ff.SparsePlan("griffin", keep=0.5),
                                   branches.up, branches.down)
    assert float(half) > 1e-4  # cutting half the neurons does change the distribution
    assert all("forward" not in layer.mlp.__dict__ for layer in sparse_ff._layers(model))


def test_end_to_end_training_lowers_the_kl_and_keeps_the_best_branches():
    engine = make_reasoning_engine()
    model = engine.model
    encoded = [encode_example(engine.tokenizer, ex) for ex in EXAMPLES]
    frozen = {name: p.detach().clone() for name, p in model.named_parameters()}
    plan = sparse_ff.SparsePlan("griffin", keep=0.5)
    kept, stats = caprese_e2e.train_e2e(model, encoded, encoded, _zero_branches(model), plan, steps=12, lr=1e-2,
                                        eval_every=4)
    assert stats["dev_kl_layerwise"] == stats["dev_kl_sparse"]  # zero branches: the sparse model
    assert stats["dev_kl_e2e"] < 0.9 * stats["dev_kl_sparse"] and stats["best_step"] > 0
    assert stats["steps_done"] == 12 and len(stats["log"]) == 12
    assert kept.up[0].dtype == torch.bfloat16 and kept.down[0].abs().sum() > 0
    assert kept.meta["e2e"]["best_step"] == stats["best_step"] and kept.meta["rank"] == 8
    for name, p in model.named_parameters():  # the model and its adapter are untouched
        assert torch.equal(p, frozen[name]), name


def test_end_to_end_trains_cats_branches_and_stops_when_asked():
    from core.sparse import cats

    engine = make_reasoning_engine()
    model = engine.model
    encoded = [encode_example(engine.tokenizer, ex) for ex in EXAMPLES]
    plan = sparse_ff.SparsePlan("cats", thresholds=tuple(cats.calibrate(engine, EXAMPLES, 0.5)))
    calls = []
    kept, stats = caprese_e2e.train_e2e(model, encoded, encoded[:1], _zero_branches(model), plan, steps=20, lr=1e-2,
                                        eval_every=2, should_stop=lambda: len(calls) >= 3, report=calls.append)
    assert stats["steps_done"] == 2 and stats["dev_kl_sparse"] > 0
    assert stats["dev_kl_e2e"] <= stats["dev_kl_layerwise"]


def test_train_caprese_command_runs_both_stages_and_saves_the_end_to_end_branches(tiny_store, tmp_path, capsys):
    import json

    from app.cli import run_cli

    data = tmp_path / "gsm8k.jsonl"
    rows = [{"question": f"Tom has {a} apples and buys {b} more. How many?", "answer": f"{a} + {b} = {a + b}.\n#### {a + b}"}
            for a, b in [(3, 4), (5, 2), (7, 1), (2, 2), (6, 3), (1, 8), (4, 4), (9, 0)]]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "caprese"
    argv = ["train", "caprese", "--model", "tiny-qwen2", "--precision", "w4", "--data", str(data), "--examples", "3",
            "--dev", "1", "--rank", "4", "--e2e-steps", "3", "--e2e-dev", "1", "--lr", "1e-3", "--out", str(out)]
    assert run_cli(argv) == 0
    printed = capsys.readouterr().out
    assert "Saved the layer-wise branches" in printed and "Training the branches end to end" in printed
    meta = json.loads((out / "caprese.json").read_text())
    assert meta["rank"] == 4 and meta["e2e"]["steps"] == 3 and "end to end" in meta["method"]
    assert [c.split("--stage ")[1] for c in meta["commands"]] == ["layer-wise", "e2e"]
    assert all(c.startswith("ponder train caprese --model tiny-qwen2") for c in meta["commands"])
    with pytest.raises(SystemExit) as refused:  # nothing to start from: a usage error
        run_cli(argv[:-2] + ["--out", str(tmp_path / "none"), "--stage", "e2e"])
    assert refused.value.code == 2
