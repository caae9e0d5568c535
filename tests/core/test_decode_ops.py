"""core.decode.ops: the C decode attention over the int8 cache against its torch twin and a float64 reference."""
from __future__ import annotations

import copy
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from core.decode import ops as decode_ops
from core.decode.cache import Int8KVLayer, quantize_int8

needs_kernel = pytest.mark.skipif(decode_ops._decode_ops is None, reason="C extension not built here")


def _layer(rows: int, kv_heads: int, dim: int, tokens: int, gen: torch.Generator) -> Int8KVLayer:
    """An int8 layer holding `tokens` random keys/values, as a prefill leaves it."""
    layer = Int8KVLayer(float_decode=True)
    kv = torch.randn(2, rows, kv_heads, tokens, dim, generator=gen).to(torch.bfloat16)
    layer.update(kv[0], kv[1])
    return layer


def _inputs(rows, heads, kv_heads, dim, gen, pos):
    q = torch.randn(rows, heads * dim, generator=gen).to(torch.bfloat16)
    k = torch.randn(rows, kv_heads * dim, generator=gen).to(torch.bfloat16)
    v = torch.randn(rows, kv_heads * dim, generator=gen).to(torch.bfloat16)
    angles = pos * (10000.0 ** (-torch.arange(0, dim, 2).float() / dim))
    angles = torch.cat((angles, angles))
    return q, k, v, angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)


def _torch_path(monkeypatch, layer, *args):
    monkeypatch.setattr(decode_ops, "ENABLED", False)
    try:
        return decode_ops.decode_step(layer, *args)
    finally:
        monkeypatch.undo()


def _reference(layer: Int8KVLayer, q, heads, kv_heads, dim, cos, sin, scaling) -> torch.Tensor:
    """float64 attention over the layer's stored (dequantized) keys and values, rotary applied in float64."""
    rows = q.shape[0]
    half = dim // 2
    x = q.double().view(rows, heads, dim)
    x = x * cos.double() + torch.cat((-x[..., half:], x[..., :half]), -1) * sin.double()
    stored = layer.q[..., : layer.length, :].double() * layer.s[..., : layer.length, :].double()
    keys = stored[0].repeat_interleave(heads // kv_heads, 1)
    values = stored[1].repeat_interleave(heads // kv_heads, 1)
    scores = torch.einsum("bhd,bhtd->bht", x, keys) * scaling
    return torch.einsum("bht,bhtd->bhd", scores.softmax(-1), values).reshape(rows, heads * dim)


@needs_kernel
@pytest.mark.parametrize(("rows", "heads", "kv_heads", "dim", "tokens"),
                         [(1, 14, 2, 64, 40), (3, 14, 2, 64, 300), (2, 12, 2, 128, 17), (1, 4, 4, 32, 1)])
def test_kernel_matches_the_torch_step_and_writes_the_same_cache(monkeypatch, rows, heads, kv_heads, dim, tokens):
    gen = torch.Generator().manual_seed(rows * 100 + tokens)
    layer = _layer(rows, kv_heads, dim, tokens, gen)
    args = (*_inputs(rows, heads, kv_heads, dim, gen, tokens), heads, kv_heads, dim ** -0.5)
    theirs = copy.deepcopy(layer)
    ref_out = _torch_path(monkeypatch, theirs, *args)
    out = decode_ops.decode_step(layer, *args)
    assert layer.length == theirs.length == tokens + 1
    assert torch.equal(layer.s[..., : tokens + 1, :], theirs.s[..., : tokens + 1, :])
    assert (layer.q[..., : tokens + 1, :].int() - theirs.q[..., : tokens + 1, :].int()).abs().max() <= 1
    assert out.dtype == torch.bfloat16 and out.shape == (rows, heads * dim)
    torch.testing.assert_close(out.float(), ref_out.float(), atol=2e-2, rtol=2e-2)


@needs_kernel
def test_kernel_error_against_float64_is_no_worse_than_torch(monkeypatch):
    gen = torch.Generator().manual_seed(7)
    rows, heads, kv_heads, dim, tokens = 2, 14, 2, 64, 700
    layer = _layer(rows, kv_heads, dim, tokens, gen)
    q, k, v, cos, sin = _inputs(rows, heads, kv_heads, dim, gen, tokens)
    args = (q, k, v, cos, sin, heads, kv_heads, dim ** -0.5)
    theirs = copy.deepcopy(layer)
    torch_out = _torch_path(monkeypatch, theirs, *args)
    out = decode_ops.decode_step(layer, *args)
    reference = _reference(layer, q, heads, kv_heads, dim, cos, sin, dim ** -0.5)
    mine, torchs = (out.double() - reference).abs().max(), (torch_out.double() - reference).abs().max()
    assert mine <= torchs * 1.5 + 1e-3, (mine, torchs)


@needs_kernel
def test_strided_views_rows_and_per_row_rotary_agree():
    """q/k/v as column slices of one fused projection, each row alone or in a batch, cos/sin shared or per row."""
    gen = torch.Generator().manual_seed(3)
    rows, heads, kv_heads, dim, tokens = 3, 14, 2, 64, 90
    layer = _layer(rows, kv_heads, dim, tokens, gen)
    q, k, v, cos, sin = _inputs(rows, heads, kv_heads, dim, gen, tokens)
    fused = torch.cat((q, k, v), 1)
    views = (fused[:, : heads * dim], fused[:, heads * dim:(heads + kv_heads) * dim], fused[:, (heads + kv_heads) * dim:])
    batched = decode_ops.decode_step(copy.deepcopy(layer), *views, cos, sin, heads, kv_heads, 0.125)
    per_row = decode_ops.decode_step(copy.deepcopy(layer), q, k, v, cos.expand(rows, dim), sin.expand(rows, dim),
                                       heads, kv_heads, 0.125)
    assert torch.equal(batched, per_row)
    for r in range(rows):
        alone = copy.deepcopy(layer)
        alone.batch_select_indices(torch.tensor([r]))
        out = decode_ops.decode_step(alone, q[r:r + 1], k[r:r + 1], v[r:r + 1], cos, sin, heads, kv_heads, 0.125)
        assert torch.equal(out[0], batched[r])


@needs_kernel
def test_the_layer_grows_when_full_and_the_new_token_is_stored_as_quantize_int8_does():
    gen = torch.Generator().manual_seed(5)
    rows, heads, kv_heads, dim = 1, 2, 1, 16
    layer = _layer(rows, kv_heads, dim, 4, gen)
    layer.q, layer.s = layer.q[..., :4, :].contiguous(), layer.s[..., :4, :].contiguous()  # full
    q, k, v, cos, sin = _inputs(rows, heads, kv_heads, dim, gen, 4)
    decode_ops.decode_step(layer, q, k, v, torch.ones(dim, dtype=torch.bfloat16),
                             torch.zeros(dim, dtype=torch.bfloat16), heads, kv_heads, 0.25)
    assert layer.length == 5 and layer.q.shape[-2] > 4
    expected_q, expected_s = quantize_int8(torch.stack((k, v)).view(2, rows, kv_heads, 1, dim))  # no rotation
    assert torch.equal(layer.q[..., 4:5, :], expected_q) and torch.equal(layer.s[..., 4:5, :], expected_s)


@needs_kernel
def test_one_token_attends_to_itself_only():
    """A fresh layer of one stored token: the softmax is 1, so the output is that token's dequantized value."""
    gen = torch.Generator().manual_seed(9)
    layer = _layer(1, 1, 32, 1, gen)
    layer.length = 0  # the first slot is overwritten by the step's own token
    q, k, v, cos, sin = _inputs(1, 3, 1, 32, gen, 0)
    out = decode_ops.decode_step(layer, q, k, v, cos, sin, 3, 1, 32 ** -0.5)
    value = (layer.q[1, 0, 0, 0].float() * layer.s[1, 0, 0, 0].float()).to(torch.bfloat16)
    for head in range(3):
        assert torch.equal(out[0, head * 32:(head + 1) * 32], value)
    assert math.isclose(float(layer.s[0, 0, 0, 0]), float(k.float().abs().max() / 127), rel_tol=1e-2)


@needs_kernel
def test_shapes_outside_the_kernel_raise():
    step = decode_ops._decode_ops.attend
    with pytest.raises(ValueError):
        step(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 1, 3, 2, 64, 16, 0, 0.1)  # heads not a multiple of kv heads
    with pytest.raises(ValueError):
        step(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 1, 2, 2, 64, 16, 16, 0.1)  # position past the capacity
    with pytest.raises(TypeError):
        step(0, 0, 0)


def test_kernel_name_says_what_runs(monkeypatch):
    """Each of the three states has its own name, and the name follows the switch that decides what runs."""
    built = object()
    for module, enabled, name in ((built, True, "ponder"), (built, False, "torch"),
                                  (None, False, "torch (ponder kernel not built)")):
        monkeypatch.setattr(decode_ops, "_decode_ops", module)
        monkeypatch.setattr(decode_ops, "ENABLED", enabled)
        assert decode_ops.kernel_name() == name
    monkeypatch.undo()
    if decode_ops._decode_ops is not None:  # PONDER_DECODE_OPS=torch (any case) turns a built kernel off
        code = "from core.decode import ops; print(ops.ENABLED, ops.kernel_name())"
        for value, shown in (("Torch", "False torch"), ("", "True ponder")):
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                                 cwd=Path(__file__).parents[2], env={**os.environ, "PONDER_DECODE_OPS": value})
            assert out.stdout.strip().splitlines()[-1:] == [shown], out.stderr


@needs_kernel
def test_rms_norm_and_swiglu_match_the_torch_ops(monkeypatch):
    gen = torch.Generator().manual_seed(11)
    x = (torch.randn(5, 1, 896, generator=gen) * 3).to(torch.bfloat16)
    weight = (torch.randn(896, generator=gen) * 0.5 + 1).to(torch.bfloat16)
    gate_up = (torch.randn(4, 2 * 640, generator=gen) * 4).to(torch.bfloat16)
    mine = decode_ops.rms_norm(x, weight, 1e-6), decode_ops.silu_mul(gate_up[:, :640], gate_up[:, 640:])
    monkeypatch.setattr(decode_ops, "ENABLED", False)
    theirs = decode_ops.rms_norm(x, weight, 1e-6), decode_ops.silu_mul(gate_up[:, :640], gate_up[:, 640:])
    for a, b in zip(mine, theirs, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype == torch.bfloat16
        # the float32 sums differ in order only: at most one bf16 step apart, on a few elements
        torch.testing.assert_close(a.float(), b.float(), atol=0, rtol=2 ** -7)
        assert (a != b).float().mean() < 1e-3


def test_the_small_ops_take_what_the_kernels_do_not(monkeypatch):
    """float32 rows and non-contiguous inputs fall back to the torch ops rather than misread memory."""
    x = torch.randn(3, 64)
    weight = torch.ones(64)
    torch.testing.assert_close(decode_ops.rms_norm(x, weight, 1e-6),
                               torch.nn.functional.rms_norm(x, (64,), eps=1e-6))
    g = torch.randn(64, 3).to(torch.bfloat16).t()  # column stride 3
    assert torch.equal(decode_ops.silu_mul(g, g), torch.nn.functional.silu(g) * g)


@needs_kernel
@pytest.mark.parametrize("dim", [64, 128, 48])
def test_the_portable_attention_loops_match_the_torch_step(monkeypatch, dim):
    """CPUs without AVX-512 (and head sizes other than 64 / 128) take the portable C loops."""
    gen = torch.Generator().manual_seed(dim)
    rows, heads, kv_heads, tokens = 2, 12, 2, 70
    layer = _layer(rows, kv_heads, dim, tokens, gen)
    args = (*_inputs(rows, heads, kv_heads, dim, gen, tokens), heads, kv_heads, dim ** -0.5)
    theirs = copy.deepcopy(layer)
    ref_out = _torch_path(monkeypatch, theirs, *args)
    previous = decode_ops._decode_ops.use_avx512(False)
    try:
        out = decode_ops.decode_step(copy.deepcopy(layer), *args)
    finally:
        decode_ops._decode_ops.use_avx512(previous)
    torch.testing.assert_close(out.float(), ref_out.float(), atol=2e-2, rtol=2e-2)
    tiled = decode_ops.decode_step(copy.deepcopy(layer), *args)
    torch.testing.assert_close(out.float(), tiled.float(), atol=2e-2, rtol=2e-2)
