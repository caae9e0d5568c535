"""The one int4 grid (models/int4_grid.py): the convention w ≈ (q − 8)·scale + zero with codes rounded to
nearest, what both int4 kernels compute from it, and that every int4 weight Ponder makes lies on it (GPTQ, the
FPT calibration objective, folded Caprese branches and quanto's plain W4)."""
import torch

from models import gptq, int4_grid
from models.int4_kernel import int4_mm
from models.quantization import quantize_model, unpack_int4
from tests.tiny import make_model


def test_the_convention_codes_a_full_range_group_as_0_to_15():
    g = torch.linspace(-1.0, 2.0, 16).view(1, 16)  # min-max grid: scale 0.2, zero = -1 + 8 * 0.2 = 0.6
    scale, zero = int4_grid.minmax(g)
    q = int4_grid.codes(g, scale, zero)
    assert torch.equal(q, torch.arange(16.0).view(1, 16))
    assert torch.allclose(scale, torch.tensor([0.2])) and torch.allclose(zero, torch.tensor([0.6]))
    assert torch.allclose(int4_grid.dequantize(q, scale, zero), g, atol=1e-6)
    nudged = g + 0.09  # under half a step: the same codes; over it: the next code (rounding to nearest)
    assert torch.equal(int4_grid.codes(nudged[:, :15], scale, zero), q[:, :15])
    assert torch.equal(int4_grid.codes(g[:, :15] + 0.11, scale, zero), q[:, :15] + 1)


def test_every_weight_lands_within_half_a_step_and_bf16_grids_are_exact():
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(0))
    g = w.view(64, 2, 128)
    for bf16, clip in ((False, None), (True, None), (True, 0.9)):
        scale, zero = int4_grid.minmax(g, clip, bf16=bf16)
        back = int4_grid.dequantize(int4_grid.codes(g, scale, zero), scale, zero)
        inside = (g - back).abs() <= scale[..., None] / 2 + 1e-6
        assert inside.all() if clip is None else inside.float().mean() > 0.97  # clipping gives up the extremes
        if bf16:
            assert torch.equal(scale, scale.to(torch.bfloat16).float()) and torch.equal(zero, zero.to(torch.bfloat16).float())


def test_both_kernels_compute_the_grids_values_from_the_packed_codes():
    w = torch.randn(128, 256, generator=torch.Generator().manual_seed(1))
    packed, scales = int4_grid.quantize_packed(w, 64)
    g = w.view(128, 4, 64)
    scale, zero = int4_grid.minmax(g, bf16=True)
    expected = int4_grid.dequantize(int4_grid.codes(g, scale, zero), scale, zero).view(128, 256)
    eye = torch.eye(256, dtype=torch.bfloat16)
    for got in (int4_mm(eye, packed, 64, scales), torch._weight_int4pack_mm_for_cpu(eye, packed, 64, scales)):
        assert torch.equal(got.t().float(), expected.to(torch.bfloat16).float())


def test_gptq_and_plain_w4_weights_lie_on_the_grid():
    w = torch.randn(32, 128, generator=torch.Generator().manual_seed(2))
    scale, zero = gptq._grid(w, torch.ones(128))
    assert torch.equal(scale, scale.to(torch.bfloat16).float())  # the grid's bf16-exact min-max, clipped
    q = int4_grid.codes(w, scale, zero)
    assert q.min() >= 0 and q.max() <= 15
    model = quantize_model(make_model(448, hidden_size=256), 4, head_bits=4)
    proj = model.model.layers[0].mlp.down_proj
    dense = make_model(448, hidden_size=256).model.layers[0].mlp.down_proj.weight.detach().float()
    back = unpack_int4(proj).t().float()  # quanto's plain W4: round to nearest on the min-max grid
    groups = dense.view(dense.shape[0], -1, proj.weight._group_size)
    step = int4_grid.minmax(groups)[0].repeat_interleave(proj.weight._group_size, 1)
    assert ((back - dense).abs() <= step / 2 + 0.02 * dense.abs() + 1e-3).float().mean() > 0.999
