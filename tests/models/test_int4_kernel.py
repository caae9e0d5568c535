"""Ponder's int4 decode kernel (models/_int4.c) reads torch's packed layout, matches a float64 reference as
closely as torch's own kernel does, gives each row the same result whatever the batch, and hands every shape
it does not take to torch's kernel. Every path runs here: AVX2 in a child process with torch's AVX2 packing, as
on a laptop."""
import os
import shutil
import subprocess
import sys
import types

import pytest
import torch

from models import int4_kernel
from models.int4_kernel import int4_mm

needs_kernel = pytest.mark.skipif(not int4_kernel.ENABLED, reason="needs the built kernel on a CPU it has a path for")
needs_unpack = pytest.mark.skipif(not int4_kernel.UNPACKS, reason="unpack runs on the AVX-512 paths")


def random_int4(n: int, k: int, group: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=gen)
    scales = torch.stack([torch.rand(k // group, n, generator=gen) * 0.02 + 0.001,
                          (torch.rand(k // group, n, generator=gen) - 0.5) * 0.02], -1).to(torch.bfloat16)
    exact = (q.double() - 8) * scales[..., 0].double().repeat_interleave(group, 0).t() \
        + scales[..., 1].double().repeat_interleave(group, 0).t()
    return torch._convert_weight_to_int4pack_for_cpu(q, 1), scales.contiguous(), exact


def test_the_extension_is_built_wherever_a_c_compiler_is():
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("no C compiler on this machine: torch's kernel runs everything")
    assert int4_kernel._int4 is not None, "models._int4 did not build at install (see pip's build log)"


def test_torch_packs_int4_in_the_layout_the_kernel_reads():
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in int4_kernel.PATHS:
        pytest.skip(f"torch packs for {capability}: the kernel has no path for it")
    block = 64 if capability == "AVX512" else 32  # outputs per block; a byte holds outputs j and j + block / 2
    n, k = 128, 256
    zero = torch._convert_weight_to_int4pack_for_cpu(torch.zeros(n, k, dtype=torch.int32), 1).flatten()
    for row, col in [(0, 0), (5, 0), (20, 3), (37, 0), (63, 9), (64, 0), (100, 255)]:
        q = torch.zeros(n, k, dtype=torch.int32)
        q[row, col] = 3
        packed = torch._convert_weight_to_int4pack_for_cpu(q, 1).flatten()
        changed = (packed != zero).nonzero().flatten().tolist()
        index, within = divmod(row, block)
        assert changed == [index * k * block // 2 + col * block // 2 + within % (block // 2)]
        assert int(packed[changed[0]]) == (3 << 4 if within >= block // 2 else 3)


@needs_kernel
@pytest.mark.parametrize(("rows", "n", "k", "group"), [
    (1, 1152, 896, 128), (1, 896, 4864, 128), (2, 512, 512, 64), (3, 256, 768, 32), (8, 640, 1024, 256),
    (16, 128, 256, 128)])
def test_kernel_matches_a_float64_reference_as_closely_as_torch(rows, n, k, group):
    packed, scales, weight = random_int4(n, k, group)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    exact = x.double() @ weight.t()
    mine = int4_mm(x, packed, group, scales)
    theirs = torch._weight_int4pack_mm_for_cpu(x, packed, group, scales)
    assert mine.shape == (rows, n) and mine.dtype == torch.bfloat16
    # both round the fp32 sum to bf16 once; the kernel's fp32 sum is at least as close as torch's
    assert (mine.double() - exact).abs().max() <= (theirs.double() - exact).abs().max() * 1.05 + 1e-6
    assert (mine.double() - exact).abs().max() <= exact.abs().max() * 2 ** -7


@needs_kernel
def test_each_row_gets_the_same_result_alone_or_in_a_batch():
    packed, scales, _ = random_int4(384, 512, 128)
    x = torch.randn(41, 512, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    for rows in (11, min(41, int4_kernel.CHUNKED_ROWS)):  # one call, and a short prompt's rows 16 at a time
        # (prompts past CHUNKED_ROWS run on torch's kernel, a different one)
        batched = int4_mm(x[:rows], packed, 128, scales)
        alone = torch.cat([int4_mm(x[i:i + 1].contiguous(), packed, 128, scales) for i in range(rows)])
        assert torch.equal(batched, alone)


@needs_kernel
def test_the_kernel_reads_row_slices_of_a_concatenated_matrix():
    packed, scales, _ = random_int4(256, 256, 128)
    x = torch.randn(1, 256, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    whole = int4_mm(x, packed, 128, scales)
    part = int4_mm(x, packed[128:], 128, scales[:, 128:].contiguous())
    assert torch.equal(part, whole[:, 128:])


def test_shapes_the_kernel_does_not_take_go_to_torch():
    packed, scales, _ = random_int4(128, 256, 128)
    gen = torch.Generator().manual_seed(4)
    many = torch.randn(int4_kernel.CHUNKED_ROWS + 1, 256, generator=gen).to(torch.bfloat16)
    assert torch.equal(int4_mm(many, packed, 128, scales), torch._weight_int4pack_mm_for_cpu(many, packed, 128, scales))
    packed48, scales48, _ = random_int4(48, 256, 128)  # 48 outputs: not whole 64-output blocks
    x = torch.randn(1, 256, generator=gen).to(torch.bfloat16)
    assert torch.equal(int4_mm(x, packed48, 128, scales48),
                       torch._weight_int4pack_mm_for_cpu(x, packed48, 128, scales48))


def test_the_kernel_can_be_switched_off(monkeypatch):
    monkeypatch.setattr(int4_kernel, "ENABLED", False)
    assert not int4_kernel.runs_rows(1, 128, 128)
    assert int4_kernel.kernel_name().startswith("torch")
    packed, scales, _ = random_int4(128, 256, 128)
    x = torch.randn(1, 256, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    assert torch.equal(int4_mm(x, packed, 128, scales), torch._weight_int4pack_mm_for_cpu(x, packed, 128, scales))


@needs_kernel
def test_bad_shapes_raise_instead_of_reading_out_of_bounds():
    packed, scales, _ = random_int4(128, 256, 128)
    y = torch.empty(1, 128, dtype=torch.bfloat16)
    x = torch.randn(1, 256).to(torch.bfloat16)
    args = packed.data_ptr(), scales.data_ptr(), x.data_ptr(), y.data_ptr()
    with pytest.raises(ValueError, match="shape"):
        int4_kernel._int4.mm(*args, 1, 100, 256, 128, int4_kernel.ISA)
    with pytest.raises(ValueError, match="shape"):
        int4_kernel._int4.mm(*args, 0, 128, 256, 128, int4_kernel.ISA)
    with pytest.raises(ValueError, match="instruction set"):  # an unknown path is refused, never jumped to
        int4_kernel._int4.mm(*args, 1, 128, 256, 128, 255)


@needs_kernel
def test_the_kernel_is_off_where_torch_packs_another_layout(monkeypatch):
    """Where the kernel's output disagrees with torch's kernel on what torch packed (here torch's kernel is replaced
    by one that reads another layout), the load-time check turns the kernel off instead of decoding garbage."""
    assert int4_kernel._reads_this_torch_layout(int4_kernel.ISA)
    monkeypatch.setattr(torch, "_weight_int4pack_mm_for_cpu",
                        lambda x, packed, group, scales: torch.zeros(x.shape[0], packed.shape[0], dtype=x.dtype) + 9)
    assert not int4_kernel._reads_this_torch_layout(int4_kernel.ISA)


@needs_kernel
@needs_unpack
@pytest.mark.parametrize(("n", "k", "group"), [(128, 256, 128), (384, 512, 64), (192, 96, 32)])
def test_unpack_gives_the_tensor_ops_bf16_weight_bit_for_bit(monkeypatch, n, k, group):
    from models import quantization

    packed, scales, _ = random_int4(n, k, group)
    layer = types.SimpleNamespace(out_features=n, in_features=k, weight=types.SimpleNamespace(
        _data=types.SimpleNamespace(_data=packed), _scale_shift=scales, _group_size=group))
    mine = quantization.unpack_int4(layer)
    again = quantization.unpack_int4(layer, scratch=True)
    monkeypatch.setattr(int4_kernel, "ENABLED", False)
    theirs = quantization.unpack_int4(layer)
    assert mine.shape == (k, n) and torch.equal(mine, theirs) and torch.equal(again, theirs)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    assert torch.allclose(x.float() @ mine.float(), torch._weight_int4pack_mm_for_cpu(x, packed, group, scales).float(),
                          atol=0.1, rtol=0.02)


@needs_kernel
@needs_unpack
def test_scratch_unpacks_reuse_one_buffer_per_thread():
    packed, scales, _ = random_int4(128, 256, 128)
    first = int4_kernel.unpack(packed, scales, 128, 256, scratch=True)
    second = int4_kernel.unpack(packed, scales, 128, 256, scratch=True)
    assert first.data_ptr() == second.data_ptr()
    assert int4_kernel.unpack(packed, scales, 128, 256).data_ptr() != first.data_ptr()


def test_every_path_this_cpu_runs_agrees_with_the_others():
    """On torch's packing here (AVX-512, or AVX2 in the child process below), every path of that layout this CPU
    has (BF16, VNNI, plain AVX-512; AVX-VNNI, AVX2 + FMA) gives each row within one bf16 rounding of the exact
    product."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in int4_kernel.PATHS or int4_kernel._int4 is None:
        pytest.skip("needs a packing the kernel reads and the built kernel")
    codes = [getattr(int4_kernel._int4, int4_kernel._CODES[name]) for name in int4_kernel.PATHS[capability]]
    codes = [c for c in codes if int4_kernel._int4.features() >> c & 1]
    if not codes:
        pytest.skip(f"this CPU has no {capability} path")
    packed, scales, weight = random_int4(640, 1024, 128)
    x = torch.randn(5, 1024, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    exact = x.double() @ weight.t()
    for code in codes:
        y = torch.empty(5, 640, dtype=torch.bfloat16)
        int4_kernel._int4.mm(packed.data_ptr(), scales.data_ptr(), x.data_ptr(), y.data_ptr(), 5, 640, 1024, 128, code)
        assert (y.double() - exact).abs().max() <= exact.abs().max() * 2 ** -7


def test_p32_holds_each_nibble_where_its_layout_says_and_moves_back_byte_for_byte():
    """Ponder's AVX2 layout (models/_int4_p32.c): for each 8 inputs of a block of 32 outputs, 4 lines of 8 dwords, dword
    j of line l output 8l + j, nibble s input 2s and nibble s + 4 input 2s + 1. Plain C: runs on every x86-64 CPU."""
    if int4_kernel._int4 is None:
        pytest.skip("needs the built kernel")
    import numpy as np

    n, k = 96, 64
    data = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    moved = data.clone()
    int4_kernel._int4.p32(moved.data_ptr(), n, k, 1)
    src, dst = data.numpy().reshape(-1), moved.numpy().reshape(-1)
    for out in range(n):
        b, j = divmod(out, 32)
        for i in range(k):
            byte = int(src[b * k * 16 + i * 16 + j % 16])
            torch_nibble = byte & 15 if j < 16 else byte >> 4
            at = b * k * 16 + (i // 8) * 128 + (j // 8) * 32 + (j % 8) * 4
            dword = int(np.frombuffer(dst[at:at + 4].tobytes(), dtype="<u4")[0])
            assert dword >> (4 * (i % 8 // 2) + 16 * (i % 2)) & 15 == torch_nibble, (out, i)
    int4_kernel._int4.p32(moved.data_ptr(), n, k, 0)
    assert torch.equal(moved, data)
    for bad_n, bad_k in ((48, 64), (96, 12)):
        with pytest.raises(ValueError, match="outside the layout"):
            int4_kernel._int4.p32(moved.data_ptr(), bad_n, bad_k, 1)


needs_p32 = pytest.mark.skipif(not int4_kernel.P32, reason="p32 is the int16 AVX2 paths' layout: checked in the AVX2 "
                                                            "child processes below")


def avx2_packing(q: torch.Tensor) -> torch.Tensor:
    """Codes (n, k) in torch's AVX2 layout, whatever this process packs: blocks of 32 outputs, 16 bytes an input."""
    n, k = q.shape
    blocks = q.to(torch.uint8).view(n // 32, 2, 16, k)  # (block, half, output within the half, input)
    return (blocks[:, 0] | blocks[:, 1] << 4).transpose(1, 2).contiguous().view(n, k // 2)


@pytest.mark.parametrize(("n", "k", "group"), [(1152, 896, 128), (128, 512, 32), (96, 256, 64), (64, 4096, 2048)])
def test_p32_gives_every_row_the_bits_of_torchs_avx2_layout_whatever_the_rows(n, k, group):
    """The same exact int32 sums on either layout: on p32 each int16 AVX2 path gives every row the bits it gives on
    torch's AVX2 layout, for any number of rows (p32 never falls back to torch's kernel, which cannot read it).
    Only AVX2 instructions: runs on every CPU with AVX2 + FMA (AVX-VNNI for its path)."""
    lib = int4_kernel._int4
    if lib is None or not lib.features() >> lib.ISA_P32I16 & 1:
        pytest.skip("needs the built kernel on a CPU with AVX2 + FMA")
    gen = torch.Generator().manual_seed(n + k)
    q = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=gen)
    _, scales, _ = random_int4(n, k, group)
    weight = ((q.double() - 8) * scales[..., 0].double().repeat_interleave(group, 0).t()
              + scales[..., 1].double().repeat_interleave(group, 0).t())
    packed = avx2_packing(q)
    if torch.backends.cpu.get_cpu_capability() == "AVX2":  # the AVX2 child processes: torch's own packing
        assert torch.equal(packed, torch._convert_weight_to_int4pack_for_cpu(q, 1))
    p32 = packed.clone()
    lib.p32(p32.data_ptr(), n, k, 1)
    p32 = p32.view(torch.int8)
    assert torch.equal(int4_kernel.torch_layout(p32), packed)
    pairs = [(lib.ISA_P32I16, lib.ISA_AVX2I16)]
    if lib.features() >> lib.ISA_P32VNNI & 1:
        pairs.append((lib.ISA_P32VNNI, lib.ISA_AVXVNNI))
    for p32_isa, torch_isa in pairs:
        for rows in (1, 2, 5, 16, 17, 70):
            x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)).to(torch.bfloat16)
            got = int4_kernel._rows(x, p32, group, scales, p32_isa)
            exact = x.double() @ weight.t()
            assert (got.double() - exact).abs().max() <= exact.abs().max() * 2 ** -7
            if n % 64 == 0:  # torch's layout: the kernel takes whole blocks of 64 outputs
                assert torch.equal(got, int4_kernel._rows(x, packed, group, scales, torch_isa))
            assert torch.equal(got[:1], int4_kernel._rows(x[:1].contiguous(), p32, group, scales, p32_isa))


@pytest.mark.parametrize(("group", "k"), [(256, 4096), (2048, 4096), (384, 3072)])
def test_p32_one_row_sums_stay_exact_at_the_largest_codes_and_inputs(group, k):
    """The one-row p32 step (models/_int4_p32.c) sums half the nibbles as 16 q in an int32 accumulator of its own: with
    every code 15 and every input at the int16 limit, of either sign, a group's sums still come out exact."""
    lib = int4_kernel._int4
    if lib is None or not lib.features() >> lib.ISA_P32I16 & 1:
        pytest.skip("needs the built kernel on a CPU with AVX2 + FMA")
    n = 64
    q = torch.full((n, k), 15, dtype=torch.int32)
    scales = torch.stack([torch.full((k // group, n), 2.0 ** -12), torch.zeros(k // group, n)], -1).to(torch.bfloat16)
    packed = avx2_packing(q)
    p32 = packed.clone()
    lib.p32(p32.data_ptr(), n, k, 1)
    p32 = p32.view(torch.int8)
    for sign in (1.0, -1.0):
        x = torch.full((1, k), sign * 3.0, dtype=torch.bfloat16)
        got = int4_kernel._rows(x, p32, group, scales, lib.ISA_P32I16)
        assert torch.equal(got, int4_kernel._rows(x, packed, group, scales, lib.ISA_AVX2I16))
        assert torch.equal(got, torch.full((1, n), sign * 7 * 3 * k * 2.0 ** -12, dtype=torch.bfloat16))


@needs_p32
def test_a_model_on_p32_answers_saves_and_restores_as_on_torchs_layout(tmp_path, monkeypatch):
    """install_fast_kernels moves int4 weights into p32; logits, the dense copy, quanto's autograd path, the state
    dict and the saved files (torch's layout, read back into p32) all see the weights of a model left on torch's
    layout."""
    from core.decode.cache import new_cache
    from models import quantization
    from models.quantized_files import load_quantized, save_quantized
    from tests.tiny import make_model

    ids = torch.randint(5, 300, (1, 12), generator=torch.Generator().manual_seed(0))

    def logits(model):
        with torch.inference_mode():
            return model(input_ids=ids, cache=new_cache(model.config, "bf16"), use_cache=True).logits

    moved = quantization.quantize_model(make_model(448), 4, head_bits=4)
    layer = moved.model.layers[0].mlp.down_proj
    assert layer.weight._data._data.dtype == torch.int8
    with monkeypatch.context() as m:
        m.setattr(int4_kernel, "P32", False)
        kept = quantization.quantize_model(make_model(448), 4, head_bits=4)
    assert kept.model.layers[0].mlp.down_proj.weight._data._data.dtype == torch.uint8
    assert torch.equal(logits(moved), logits(kept))
    assert torch.equal(quantization.dense_weight(layer), quantization.dense_weight(kept.model.layers[0].mlp.down_proj))
    x = torch.randn(3, 256, dtype=torch.float32, requires_grad=True)
    layer(x).sum().backward()  # float, with grad: the dequantized weight, not quanto's reader of torch's bytes
    assert x.grad is not None and torch.isfinite(x.grad).all()
    ours, theirs = moved.state_dict(), kept.state_dict()  # what peft's adapter saving and loading walk through
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[key], theirs[key]) for key in theirs)
    save_quantized(moved, tmp_path, 4, 4)
    restored = load_quantized(tmp_path)
    assert restored.model.layers[0].mlp.down_proj.weight._data._data.dtype == torch.int8
    assert torch.equal(logits(restored), logits(kept))


@pytest.mark.parametrize("path", ["avx2", "avx2-int16", "avx2-vnni"])
def test_the_avx2_paths_pass_these_tests_on_torchs_avx2_packing(path):
    """A laptop without AVX-512: torch packs its AVX2 layout, and each AVX2 path (with AVX-VNNI, or FMA only) runs
    every test above."""
    code = getattr(int4_kernel._int4, int4_kernel._CODES[path], None) if int4_kernel._int4 is not None else None
    if code is None or not int4_kernel._int4.features() >> code & 1:
        pytest.skip(f"needs the built kernel and a CPU with the {path} path")
    env = dict(os.environ, ATEN_CPU_CAPABILITY="avx2", PONDER_INT4_KERNEL=path)
    probe = subprocess.run([sys.executable, "-c", "from models import int4_kernel; print(int4_kernel.kernel_name())"],
                           env=env, capture_output=True, text=True, timeout=120)
    assert probe.stdout.strip() == f"ponder {path}", probe.stderr
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                          "not avx2_paths_pass"], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:]


def int8_rounded(x: torch.Tensor, block: int) -> torch.Tensor:
    """x rounded to int8 per row and block as the int8 paths round it (scale max |x| / 127, in fp32)."""
    xf = x.float().view(x.shape[0], -1, block)
    amax = xf.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, torch.tensor(127.0) / amax, torch.zeros_like(amax))
    return (torch.round(xf * inv).double() * (amax / 127.0).double()).view(x.shape)


INT8_PATHS = {"AVX512": ("avx512-a8", 128), "AVX2": ("avx2-a8", 32)}
"""The opt-in int8-activation path of each packing, and how many inputs share one activation scale."""


def int8_path() -> tuple[str, int, int]:
    """(path, ISA code, activation block) of this packing's int8 path; skips where this CPU or build lacks it."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in INT8_PATHS or int4_kernel._int4 is None:
        pytest.skip("needs the built kernel and a packing it reads")
    path, block = INT8_PATHS[capability]
    code = getattr(int4_kernel._int4, int4_kernel._CODES[path], None)
    if code is None or not int4_kernel._int4.features() >> code & 1:
        pytest.skip(f"this CPU lacks the {path} path")
    return path, code, block


def test_the_int8_activation_paths_compute_w_times_the_rounded_activations():
    """`avx512-a8` and `avx2-a8` (opt-in; the latter in the AVX2 child processes) round each row's activations to
    int8 (per group, and per 32 inputs as llama.cpp's Q8_0) and then multiply exactly: within one bf16 rounding of
    the float64 product with the rounded x, the same for a row alone or in a batch, and within 2% of the largest
    exact output (the price of 8-bit activations, measured on the model before use)."""
    _, code, block = int8_path()
    packed, scales, weight = random_int4(640, 1024, 128)
    x = torch.randn(7, 1024, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)

    def run(rows: torch.Tensor) -> torch.Tensor:
        y = torch.empty(rows.shape[0], 640, dtype=torch.bfloat16)
        int4_kernel._int4.mm(packed.data_ptr(), scales.data_ptr(), rows.data_ptr(), y.data_ptr(), rows.shape[0], 640,
                             1024, 128, code)
        return y
    y = run(x)
    rounded = int8_rounded(x, block) @ weight.t()
    assert (y.double() - rounded).abs().max() <= rounded.abs().max() * 2 ** -7
    assert torch.equal(y, torch.cat([run(x[i:i + 1].clone()) for i in range(7)]))
    exact = x.double() @ weight.t()
    assert (y.double() - exact).abs().max() <= exact.abs().max() * 0.02


def test_int8_activations_are_opt_in():
    """The default path never rounds activations; `PONDER_INT4_KERNEL=<the int8 path>` chooses it where the CPU
    has it."""
    assert int4_kernel.PATH not in ("avx512-a8", "avx2-a8") or os.environ.get("PONDER_INT4_KERNEL") == int4_kernel.PATH
    path, _, _ = int8_path()
    env = dict(os.environ, PONDER_INT4_KERNEL=path)
    probe = subprocess.run([sys.executable, "-c", "from models import int4_kernel; print(int4_kernel.kernel_name())"],
                           env=env, capture_output=True, text=True, timeout=120)
    assert probe.stdout.strip() == f"ponder {path}", probe.stderr
