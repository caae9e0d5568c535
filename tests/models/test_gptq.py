"""GPTQ rounding: lower output error than round-to-nearest on the same grid family; the codes written into a
packed int4 layer are what its kernel computes with."""
import torch

from models.gptq import dequantize, gptq_int4, gptq_round, set_int4
from models.quantization import dense_weight, quantize_model
from tests.tiny import make_model


def rtn(w, group):
    g = w.reshape(w.shape[0], -1, group)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    scale = (hi - lo) / 15
    return (((g - lo) / scale).round().clamp(0, 15) * scale + lo).reshape(w.shape)


def test_gptq_output_error_is_below_round_to_nearest():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(512, 256, generator=gen) * torch.linspace(0.2, 3, 256)  # uneven input channels
    x[:, :64] += torch.randn(512, 64, generator=gen)[:, :1]  # and correlated ones
    w = torch.randn(64, 256, generator=gen)
    codes, scale, zero = gptq_int4(w, x.t() @ x, 64)
    assert codes.min() >= 0 and codes.max() <= 15 and scale.dtype == torch.bfloat16
    ref = x @ w.t()
    err_gptq = (x @ dequantize(codes, scale, zero, 64).t() - ref).pow(2).sum()
    err_rtn = (x @ rtn(w, 64).t() - ref).pow(2).sum()
    assert err_gptq < 0.8 * err_rtn


def test_codes_written_into_a_packed_layer_are_what_it_computes():
    model = quantize_model(make_model(448), 4, head_bits=4, group_size=64)
    layer = model.model.layers[0].mlp.down_proj  # 256 inputs: packed int4
    w = torch.randn(layer.out_features, layer.in_features)
    x = torch.randn(128, layer.in_features)
    codes, scale, zero = gptq_int4(w, x.t() @ x, 64)
    set_int4(layer, codes, scale, zero)
    assert torch.equal(dense_weight(layer).float(), dequantize(codes, scale, zero, 64).to(torch.bfloat16).float())


def test_gptq_round_covers_every_named_layer_sharing_hessians():
    model = make_model(448).float()
    names = ["model.layers.0.mlp.down_proj", "model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.k_proj"]
    out = gptq_round(model, [torch.randint(5, 440, (32,)) for _ in range(3)], names, 32)
    assert set(out) == set(names)
    for name, (codes, scale, zero) in out.items():
        assert zero.shape == scale.shape
        w = model.get_submodule(name).weight
        assert codes.shape == w.shape and scale.shape == (w.shape[0], w.shape[1] // 32)
