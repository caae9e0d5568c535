"""FPTQuant° transforms: the transformed float model computes the original's function; LoRA factors and heads
follow the new basis; calibration picks scales that lower the int4 error it measures."""
import torch

from core.adapters import lora as adapters
from core.decode.cache import new_cache
from models.fpt import FptSpec, apply_fpt, random_rotation, transform_head, transform_lora_state
from models.fpt_calibration import calibrate, fake_int4
from models.heads import VerifierHead
from tests.tiny import make_model


def random_spec(config, seed=0) -> FptSpec:
    gen = torch.Generator().manual_seed(seed)
    spec = FptSpec.identity(config)
    spec.rotation = random_rotation(config.hidden_size, seed)

    def rand(t):
        return torch.exp(torch.randn(t.shape, generator=gen) * 0.5)

    spec.mlp_scale = [rand(t) for t in spec.mlp_scale]
    spec.value_scale = [rand(t) for t in spec.value_scale]
    spec.key_scale = [rand(t) for t in spec.key_scale]
    spec.attn_input_scale = [rand(t) for t in spec.attn_input_scale]
    spec.mlp_input_scale = [rand(t) for t in spec.mlp_input_scale]
    return spec


def float_model(seed=0):
    model = make_model(448, seed=seed).float()
    with torch.no_grad():  # non-trivial norm weights, so that folding them is tested
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand(p.shape) + 0.5)
    return model


def run(model, ids, hidden=False):
    with torch.no_grad():
        out = model(input_ids=ids, cache=new_cache(model.config, "bf16"), use_cache=True, output_hidden_states=hidden)
    return out


def test_rotation_is_orthogonal_for_non_power_of_two_widths():
    for d in (128, 896, 1536, 96):
        q = random_rotation(d, seed=3).double()
        assert torch.allclose(q @ q.t(), torch.eye(d, dtype=torch.float64), atol=1e-5)


def test_transformed_model_computes_the_same_logits():
    ids = torch.randint(5, 440, (1, 24))
    ref = run(float_model(), ids).logits
    model = apply_fpt(float_model(), random_spec(float_model().config))
    assert not model.config.tie_word_embeddings
    norm = model.model.layers[0].input_layernorm.weight  # γ folded into the readers, 1 / c left behind
    assert torch.allclose(norm * model.ponder_fpt.attn_input_scale[0], torch.ones_like(norm))
    got = run(model, ids).logits
    assert torch.allclose(got, ref, atol=2e-4, rtol=1e-4), (got - ref).abs().max()
    # and the weights really changed: this is not the identity
    assert not torch.allclose(model.model.layers[0].mlp.down_proj.weight, float_model().model.layers[0].mlp.down_proj.weight)


def test_lora_factors_follow_the_transform():
    ids = torch.randint(5, 440, (1, 20))
    original = adapters.attach_new(float_model(), rank=4)
    with torch.no_grad():
        for p in original.parameters():
            if p.requires_grad:
                p.normal_(0, 0.05)
    original.eval()
    ref = run(original, ids).logits
    state = {k: v for k, v in original.state_dict().items() if "lora_" in k}
    spec = random_spec(float_model().config, seed=1)
    moved = adapters.attach_new(apply_fpt(float_model(), spec), rank=4).eval()
    with torch.no_grad():
        params = dict(moved.named_parameters())
        for k, v in transform_lora_state(state, spec, moved.config).items():
            params[k].copy_(v)
    got = run(moved, ids).logits
    assert torch.allclose(got, ref, atol=3e-4, rtol=1e-4), (got - ref).abs().max()


def test_heads_read_the_transformed_hidden_state_unchanged():
    ids = torch.randint(5, 440, (1, 12))
    head = VerifierHead(128)
    with torch.no_grad():
        head.norm.mean.normal_(0, 1)
        head.norm.std.uniform_(0.5, 2)
        head.linear.weight.normal_(0, 0.3)
    hidden = run(float_model(), ids, hidden=True).hidden_states[-1][0]
    ref = head(hidden)
    spec = random_spec(float_model().config, seed=2)
    moved_hidden = run(apply_fpt(float_model(), spec), ids, hidden=True).hidden_states[-1][0]
    got = transform_head(head, spec)(moved_hidden)
    assert torch.allclose(got, ref, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(moved_hidden, hidden, atol=1e-2)  # the basis did change


def test_spec_round_trips_through_its_file(tmp_path):
    spec = random_spec(float_model().config)
    model = apply_fpt(float_model(), spec)
    spec.save(tmp_path)
    again = FptSpec.load(tmp_path)
    assert torch.equal(again.rotation, spec.rotation)
    assert all(torch.equal(a, b) for a, b in zip(again.gamma_mlp, spec.gamma_mlp, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(again.key_scale, model.ponder_fpt.key_scale, strict=True))
    assert FptSpec.load(tmp_path / "missing") is None


def salient_model():
    """The float model with 8 of each layer's down_proj inputs 8× larger than the rest (up_proj rows scaled), the
    few salient channels real LLM activations have and AWQ-style scaling is for."""
    model = float_model()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.up_proj.weight[:8] *= 8
    return model


def test_calibrated_scales_cut_the_int4_error_of_salient_channels():
    """α = 0 (no scaling) is among the candidates, so the pick is never worse than none by construction; with
    salient channels the search must find a clearly better α. Measured: the MLP scale leaves 0.68 and 0.70 of the
    unscaled int4 output error of the two layers; a search that measures the wrong error (inputs multiplied by
    the column scale instead of divided) or only tries α = 0 leaves 1.0, the largest-error pick 1.7 to 1.8."""
    model = salient_model()
    batches = [torch.randint(5, 440, (64,)) for _ in range(4)]
    spec = calibrate(model, batches, group=32, rotate=False)
    from models.fpt_calibration import collect

    stats = collect(model, batches)
    for i, layer in enumerate(model.model.layers):
        x, w = stats[i]["down"], layer.mlp.down_proj.weight.float()
        ref = x @ w.t()
        plain = float(((x @ fake_int4(w, 32).t()) - ref).pow(2).sum())
        col = 1.0 / spec.mlp_scale[i]
        scaled = float((((x / col) @ fake_int4(w * col, 32).t()) - ref).pow(2).sum())
        assert scaled < 0.85 * plain, (i, scaled / plain)
    ids = torch.randint(5, 440, (1, 16))
    ref = run(salient_model(), ids).logits
    assert torch.allclose(run(apply_fpt(salient_model(), spec), ids).logits, ref, atol=2e-4, rtol=1e-4)


def test_inverse_transform_returns_the_original_lora_factors():
    spec = random_spec(float_model().config, seed=4)
    apply_fpt(float_model(), spec)  # fills the folded norm weights
    model = adapters.attach_new(float_model(), rank=4)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.normal_(0, 0.05)
    state = {k: v.clone() for k, v in model.state_dict().items() if "lora_" in k}
    back = transform_lora_state(transform_lora_state(state, spec, model.config), spec, model.config, inverse=True)
    assert all(torch.allclose(back[k], state[k], atol=1e-5) for k in state)


def test_head_input_scale_is_exact_in_float_and_its_alpha_comes_from_the_grid():
    """bench.fpt_ablation's LM-head input scale (final norm ÷ c, head columns × c) keeps the float model's logits;
    its α is chosen by the rounded head's KL on the states it was fitted on, and α = 0 (no scale) is a candidate."""
    from bench.fpt_ablation import head_scale, scale_head_input

    ids = torch.randint(5, 440, (1, 24))
    model = float_model()
    ref = run(model, ids).logits
    batches = [torch.randint(5, 440, (40,)) for _ in range(3)]
    c, alpha = head_scale(model, batches, group=32, tokens=100)
    assert c.shape == (model.config.hidden_size,) and abs(float(c.log().mean())) < 1e-5
    scale_head_input(model, torch.exp(torch.randn(model.config.hidden_size) * 0.5))
    assert torch.allclose(run(model, ids).logits, ref, atol=2e-4, rtol=1e-4)
    assert alpha in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8)
