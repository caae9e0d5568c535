"""GPTQ rounding: lower output error than round-to-nearest on the same grid family; the codes written into a
packed int4 layer are what its kernel computes with."""
import torch

from models.gptq import dequantize, gptq_int4, gptq_layers, upper_factor
from models.gram import add_gram
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


def test_codes_packed_into_a_layer_are_what_it_computes():
    name = "model.layers.0.mlp.down_proj"  # 256 inputs: packed int4
    layer = make_model(448).get_submodule(name)
    w = torch.randn(layer.out_features, layer.in_features)
    x = torch.randn(128, layer.in_features)
    codes, scale, zero = gptq_int4(w, x.t() @ x, 64)
    expected = dequantize(codes, scale, zero, 64).to(torch.bfloat16).float()
    built = quantize_model(make_model(448), 4, head_bits=4, group_size=64, int4_codes={name: (codes, scale, zero)})
    assert torch.equal(dense_weight(built.get_submodule(name)).float(), expected)
    plain = quantize_model(make_model(448), 4, head_bits=4, group_size=64)  # the rest as quanto rounds them
    other = "model.layers.1.mlp.down_proj"
    assert type(built.get_submodule(other).weight) is type(plain.get_submodule(other).weight)
    assert torch.equal(dense_weight(built.get_submodule(other)), dense_weight(plain.get_submodule(other)))


def test_upper_factor_is_the_reversed_cholesky_factor():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(300, 96, generator=gen, dtype=torch.float64)
    h = x.t() @ x + torch.eye(96, dtype=torch.float64)
    t = upper_factor(h.clone())
    assert torch.equal(t, t.triu())
    assert torch.allclose(t @ t.t(), h, atol=1e-9 * h.abs().max().item())
    u = torch.linalg.solve_triangular(t, torch.eye(96, dtype=torch.float64), upper=True)  # GPTQ's H⁻¹ factor
    assert torch.allclose(u, torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True),
                          atol=1e-10)


def test_blocked_gram_equals_the_full_product(monkeypatch):
    import models.gram as gram

    monkeypatch.setattr(gram, "GRAM_BLOCK", 48)  # 200 columns: blocks of 48, 48, 48, 48, 8
    x = torch.randn(64, 200)
    for flag, tolerance in (("0", 1e-4), ("1", 1e-2)):  # float32; int8 digits (~1e-5 of a column's largest)
        monkeypatch.setenv("PONDER_GPTQ_INT8", flag)
        gram.int8_gram_exact.cache_clear()
        acc = torch.ones(200, 200)
        add_gram(acc, x)
        assert torch.allclose(acc, 1 + x.t() @ x, atol=tolerance), flag
        assert torch.equal(acc, acc.t()), flag
    gram.int8_gram_exact.cache_clear()


def reference_hessians(model, batches, names):
    """XᵀX of each named linear's inputs from one full-model forward per batch (how GPTQ was calibrated before)."""
    modules = dict(model.named_modules())
    acc = {n: torch.zeros(modules[n].in_features, modules[n].in_features, dtype=torch.float64) for n in names}

    def hook(module, args, output, name):
        x = args[0].reshape(-1, args[0].shape[-1]).double()
        acc[name].add_(x.t() @ x)

    hooks = [modules[n].register_forward_hook(lambda m, a, o, n=n: hook(m, a, o, n)) for n in names]
    with torch.no_grad():
        for ids in batches:
            model(input_ids=ids.view(1, -1), use_cache=False)
    for h in hooks:
        h.remove()
    return acc


def test_layer_by_layer_calibration_sees_the_full_forward_inputs(monkeypatch):
    """gptq_layers runs the decoder a layer at a time (no logits); each linear must be rounded on the Hessian a
    full forward gives, and the layers reading one input share it (q/k/v, gate/up)."""
    import models.gptq as gptq

    model = make_model(448).float()
    batches = [torch.randint(5, 440, (n,)) for n in (32, 20, 41)]
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m.in_features % 32 == 0]
    seen = {}
    real = gptq.gptq_int4

    def spy(w, hessian, group, **kwargs):
        seen[w.shape[0], hessian.shape[0], len(seen)] = hessian.clone()
        return real(w, hessian, group, **kwargs)

    monkeypatch.setattr(gptq, "gptq_int4", spy)
    steps = []
    out = gptq_layers(model, batches, names, 32, lambda d, t: steps.append((d, t)), dtype=torch.float32)
    assert set(out) == set(names)
    layers = model.config.num_hidden_layers
    total = 5 * layers + 1  # per layer its forward and four input sites (q/k/v, o, gate/up, down), then the head
    assert steps == [(i + 1, total) for i in range(total)]
    ref = reference_hessians(model, batches, names)
    sites = [n for n in names if not n.endswith(("k_proj", "v_proj", "up_proj"))]
    assert len(seen) == len(sites)
    for (_, _, i), hessian in seen.items():
        expected = ref[sites[i]]
        assert torch.allclose(hessian.double(), expected, rtol=1e-4, atol=1e-3 * expected.abs().max().item())
    for name, (codes, scale, zero) in out.items():
        w = model.get_submodule(name).weight
        assert codes.shape == w.shape and scale.shape == zero.shape == (w.shape[0], w.shape[1] // 32)


def test_bf16_calibration_gives_the_float32_hessians_to_bf16_precision_and_rounds_as_well(monkeypatch):
    """Where the CPU multiplies bf16 natively the calibration forward and the Gram products run in bf16 (summed
    in float32): each Hessian must stay within bf16's precision of the float32 one, and the rounded layers'
    output error on the calibration inputs must be as small."""
    import models.gptq as gptq

    model = make_model(448).float()
    batches = [torch.randint(5, 440, (n,)) for n in (32, 20, 41)]
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m.in_features % 32 == 0]
    seen = {torch.float32: [], torch.bfloat16: []}
    real = gptq.gptq_int4
    for dtype, got in seen.items():
        monkeypatch.setattr(gptq, "gptq_int4", lambda w, h, g, got=got, **kw: got.append(h.clone()) or real(w, h, g, **kw))
        gptq_layers(model, batches, names, 32, dtype=dtype)
    assert len(seen[torch.float32]) == len(seen[torch.bfloat16]) > 0
    for ref, got in zip(seen[torch.float32], seen[torch.bfloat16], strict=True):
        assert got.dtype == torch.float32
        assert (got - ref).abs().max() < 0.05 * ref.abs().max()  # bf16 inputs keep 8 bits
        assert not torch.equal(got, ref)  # the bf16 path really ran


def test_the_gram_product_is_float32_exact_on_either_path_and_the_c_digits_are_torchs(monkeypatch):
    """XᵀX from two int8 digits per value (where int8 products are exact) or in float32 must match float64 to a
    few parts in 10⁵ of its largest entry, with a column dominated by one outlier token (whose other values are
    small against their column's scale: the case that needs q₂ᵀq₂). The C digits equal the torch ones."""
    import models.gram as gram

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3000, 1100, generator=gen) * torch.linspace(0.01, 3, 1100)
    x[7] *= 60
    ref = x.double().t() @ x.double()
    for flag in ("1", "0"):
        monkeypatch.setenv("PONDER_GPTQ_INT8", flag)
        gram.int8_gram_exact.cache_clear()
        acc = torch.zeros(1100, 1100)
        add_gram(acc, x)
        assert (acc.double() - ref).abs().max() < 1e-4 * ref.abs().max(), flag
        assert (acc.double().diagonal() - ref.diagonal()).abs().div(ref.diagonal()).max() < 1e-3, flag
        assert torch.equal(acc, acc.t())
    gram.int8_gram_exact.cache_clear()
    if gram._gptq is not None:
        for t in (x, x.bfloat16()):
            fast = gram.int8_digits(t)
            monkeypatch.setattr(gram, "_gptq", None)
            slow = gram.int8_digits(t)
            monkeypatch.undo()
            assert all(torch.equal(a, b) for a, b in zip(fast, slow, strict=True))


def test_the_c_column_loop_rounds_as_the_python_one(monkeypatch):
    """models/_gptq.c runs GPTQ's column loop; the tensor-op loop is the fallback without a compiler. Both take
    the same steps in float32, so they agree code for code but where a float sum lands on a rounding tie."""
    import shutil

    import models.gptq as gptq

    if gptq._gptq is None:
        assert shutil.which("gcc") is None and shutil.which("cc") is None, "a compiler is here: build models._gptq"
        return
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(700, 384, generator=gen) * torch.linspace(0.1, 2, 384)
    w = torch.randn(300, 384, generator=gen)
    fast = gptq_int4(w, x.t() @ x, 128)
    monkeypatch.setattr(gptq, "_gptq", None)
    slow = gptq_int4(w, x.t() @ x, 128)
    assert torch.equal(fast[1], slow[1]) and torch.equal(fast[2], slow[2])  # the first group's grid: no feedback yet
    assert (fast[0] == slow[0]).float().mean() > 0.999
    ref = x @ w.t()
    errs = [(x @ dequantize(*out, 128).t() - ref).pow(2).sum() for out in (fast, slow)]
    assert abs(errs[0] - errs[1]) < 0.01 * errs[1]


def test_the_c_grid_is_the_python_grid():
    import models.gptq as gptq

    if gptq._gptq is None:
        return  # no compiler here: test_the_c_column_loop_rounds_as_the_python_one says whether one should be
    gen = torch.Generator().manual_seed(5)
    block = (torch.randn(128, 1000, generator=gen) * torch.rand(1, 1000, generator=gen)).contiguous()
    importance = torch.rand(128, generator=gen) + 0.1
    scale, zero = torch.empty(1000), torch.empty(1000)
    gptq._gptq.group_grid(block.data_ptr(), importance.data_ptr(), scale.data_ptr(), zero.data_ptr(), 1000, 128)
    ref_scale, ref_zero = gptq._grid(block.t(), importance)
    same = (scale == ref_scale) & (zero == ref_zero)
    assert same.float().mean() > 0.995  # all but near-ties of two clip ratios' summed errors
    assert torch.equal(scale, scale.to(torch.bfloat16).float()) and torch.equal(zero, zero.to(torch.bfloat16).float())


def test_w4_fpt_merged_a_layer_at_a_time_rounds_as_the_whole_float32_model(monkeypatch):
    """W4-FPT preparation keeps the model in bf16 and takes one layer at a time to float32 (merge, calibrate,
    round): the codes must be exactly those of merging the whole model in float32 first, on either calibration
    path, so the shipped adapters keep the codes they were trained on."""
    import copy

    import models.gptq as gptq
    from models.fpt import apply_fpt
    from models.fpt_calibration import calibrate, quantize_w4_fpt
    from models.gptq import codes_fingerprint
    from models.quantization import packs_int4

    model = make_model(448, hidden_size=256)
    batches = [torch.randint(5, 440, (n,)) for n in (32, 20, 41)]
    spec = calibrate(copy.deepcopy(model).float(), batches, group=32, rotate=False)
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and packs_int4(m, 32)]
    assert len(names) == 7 * model.config.num_hidden_layers + 1
    for dtype in (torch.float32, torch.bfloat16):
        monkeypatch.setattr(gptq, "calibration_dtype", lambda dtype=dtype: dtype)
        whole = apply_fpt(copy.deepcopy(model).float(), spec)
        expected = codes_fingerprint(gptq_layers(whole, batches, names, 32))
        for layer_by_layer in (True, False):
            steps = []
            quantized = quantize_w4_fpt(copy.deepcopy(model), batches, head_bits=4, group=32, spec=spec,
                                        report=lambda d, t, steps=steps: steps.append(d), layer_by_layer=layer_by_layer)
            assert quantized.ponder_codes == expected
            assert steps[-1] == 5 * model.config.num_hidden_layers + 1


def reference_gptq(w, hessian, group):
    """GPTQ as the paper's code runs it (arXiv 2210.17323, Algorithm 1, float64): H⁻¹'s upper Cholesky factor U,
    each group's grid fitted when the loop reaches it, errors fed forward through U's rows."""
    from models.gptq import _grid, _prepared_hessian

    h, dead = _prepared_hessian(hessian)
    u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h.double())), upper=True)
    v = w.double().clone()
    v[:, dead] = 0
    codes = torch.empty(w.shape, dtype=torch.uint8)
    scales, zeros = [], []
    for i1 in range(0, w.shape[1], group):
        scale, zero = _grid(v[:, i1:i1 + group].float(), torch.diagonal(h)[i1:i1 + group])
        scales.append(scale)
        zeros.append(zero)
        s, z = scale.double(), zero.double()
        for i in range(i1, i1 + group):
            q = ((v[:, i] - z) / s + 8).round().clamp(0, 15)
            codes[:, i] = q.to(torch.uint8)
            err = (v[:, i] - ((q - 8) * s + z)) / u[i, i]
            v[:, i + 1:] -= err[:, None] * u[i, i + 1:][None, :]
    return codes, torch.stack(scales, 1).to(torch.bfloat16), torch.stack(zeros, 1).to(torch.bfloat16)


def test_errors_carried_through_the_cholesky_factor_give_the_reference_gptq_codes():
    """gptq_int4 never forms H⁻¹'s factor (only its diagonal blocks): the same rounding, up to float sums."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(900, 512, generator=gen) * torch.linspace(0.1, 3, 512)
    x[:, 100:200] += torch.randn(900, 1, generator=gen)  # correlated inputs: errors travel far
    w = torch.randn(96, 512, generator=gen) * 0.05
    ours, ref = gptq_int4(w, x.t() @ x, 128), reference_gptq(w, x.t() @ x, 128)
    assert (ours[0] == ref[0]).float().mean() > 0.995
    assert (ours[1] == ref[1]).float().mean() > 0.98
    errs = [(x @ (dequantize(*out, 128) - w).t()).pow(2).sum() for out in (ours, ref)]
    assert abs(errs[0] - errs[1]) < 0.002 * errs[1]
