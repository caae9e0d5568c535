"""Trained FPTQuant° scales (models/fpt_training.py): the differentiable layer is the layer `merge_layer` ships,
training lowers held-out int4 error without changing the float function, and an interrupted run continues."""
import copy
import json

import pytest
import torch

from models.fpt import FptSpec, apply_fpt, merge_layer
from models.fpt_calibration import fake_int4
from models.fpt_training import TRAINED, fake_int4_ste, layer_context, layer_params, run_layer, train_transforms
from tests.models.test_fpt import float_model, random_spec, run


def calibration_texts(n=6, length=150, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 448, (length,), generator=gen) for _ in range(n)]


def test_straight_through_rounding_is_the_grids_rounding_with_a_gradient():
    w = torch.randn(8, 256, requires_grad=True)
    q = fake_int4_ste(w)
    assert torch.equal(q.detach(), fake_int4(w.detach(), 128))
    q.pow(2).sum().backward()
    assert w.grad is not None and w.grad.abs().sum() > 0


def test_trained_layer_is_the_merged_layer():
    model = float_model()
    spec = random_spec(model.config)
    spec.rotation = None
    ids = torch.randint(0, 448, (2, 24))
    x = model.model.embed_tokens(ids).detach()
    layer = model.model.layers[1]
    params = layer_params(layer, spec, model.config, 1, quantize=False)
    got = run_layer(layer, params, x, layer_context(model, x))
    merged = copy.deepcopy(model)
    merge_layer(merged, spec, 1)
    with torch.no_grad():
        want = run_layer(merged.model.layers[1], dict(merged.model.layers[1].named_parameters()), x,
                         layer_context(model, x))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for name, module in merged.model.layers[1].named_modules():
        if name.endswith("proj"):
            q = layer_params(layer, spec, model.config, 1, quantize=True)[f"{name}.weight"]
            assert torch.equal(q.detach(), fake_int4(module.weight.detach(), 128))


def test_training_lowers_held_out_int4_error_and_keeps_the_float_function(tmp_path):
    model = float_model()
    ids = torch.randint(0, 448, (1, 30))
    before = run(model, ids).logits
    state = tmp_path / "state"
    spec, log = train_transforms(float_model(), calibration_texts(), length=48, steps=12, lr=3e-2, state=state)
    assert len(log) == model.config.num_hidden_layers
    assert any(r["kept"] and r["held_loss_trained"] < r["held_loss_start"] for r in log)
    after = run(apply_fpt(model, spec), ids).logits  # the scales are an exact rewrite of the float model
    torch.testing.assert_close(after, before, atol=2e-4, rtol=1e-4)

    # an interrupted run (its last layer not saved) retrains that layer the same way
    record = json.loads((state / "log.json").read_text())
    (state / "log.json").write_text(json.dumps({**record, "layers": record["layers"][:-1]}))
    partial = FptSpec.load(state)
    for name in TRAINED:
        getattr(partial, name)[-1] = torch.ones_like(getattr(partial, name)[-1])
    partial.save(state)
    again, log2 = train_transforms(float_model(), calibration_texts(), length=48, steps=12, lr=3e-2, state=state)
    assert {k: v for k, v in log2[-1].items() if k != "seconds"} == \
        {k: v for k, v in record["layers"][-1].items() if k != "seconds"}
    for name in TRAINED:
        for a, b in zip(getattr(again, name), getattr(spec, name), strict=True):
            torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="other settings"):
        train_transforms(float_model(), calibration_texts(), length=48, steps=5, state=state)

