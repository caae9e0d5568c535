"""Weight-only quantization (W4 / W8 with optimum-quanto); saving and restoring is models.quantized_files.

quanto does the quantizing. For decode speed
each frozen QLinear gets a direct call into torch's packed CPU kernels (`_weight_int4pack_mm_for_cpu`,
`_weight_int8pack_mm`) that skips quanto's autograd wrapper; with gradients enabled (adapter training)
the original quanto forward runs. The embedding stays bf16; the LM head is quantized at `head_bits`.
"""
from __future__ import annotations

import functools
import types

import torch
from torch import nn

from . import int4_grid, int4_kernel
from .int4_kernel import int4_mm

PRECISIONS = ("fp32", "bf16", "w8", "w4", "w4-fpt")
"""w4-fpt: int4 after the FPTQuant° transforms (models/fpt.py), merged into the weights before quantizing."""


def _qtype(bits: int):
    from optimum.quanto import qint4, qint8

    return {4: qint4, 8: qint8}[bits]


GROUP_SIZE = 128
"""int4 weights share one scale and zero point per this many inputs (torch's packed kernel takes 32–256)."""
GROUP_SIZES = (32, 64, 128, 256)


def packs_int4(module: nn.Module, group_size: int = GROUP_SIZE) -> bool:
    """torch's packed int4 CPU kernel needs whole groups: in_features a multiple of 128 (every Qwen2.5 linear)
    and of the group size.

    Other shapes would fall to quanto's generic int4 path, which JIT-compiles a C++ extension at first use;
    they are quantized to int8 instead."""
    return module.in_features > 128 and module.in_features % 128 == 0 and module.in_features % group_size == 0


def quantize_model(model: nn.Module, bits: int | None, head_bits: int | None = None,
                   group_size: int = GROUP_SIZE, int4_codes: dict | None = None) -> nn.Module:
    """Quantize every linear layer in place to `bits` (4 or 8; None = keep the layers bf16), the LM head to
    `head_bits` (None = keep bf16);
    int4 layers with one scale and zero point per `group_size` inputs. `int4_codes`: name -> (codes, scale,
    zero) already chosen (GPTQ) for int4 layers, packed as they are instead of rounding those layers to nearest
    first (quanto's rounding and packing of the 1.5B's layers took ~13 s that GPTQ's codes then replaced)."""
    from optimum.quanto import freeze, quantize
    from optimum.quanto.nn import QLinear

    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {GROUP_SIZES}")
    model.to(torch.bfloat16)
    _rebuild_nonpersistent_buffers(model)  # keep rotary frequencies in fp32, as a restored model has them
    plan: dict[int, list[str]] = {4: [], 8: []}
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        want = head_bits if name == "lm_head" else bits
        if want is None:
            continue
        plan[4 if want == 4 and packs_int4(module, group_size) else 8].append(name)
    for b, names in plan.items():
        if names:
            quantize(model, weights=_qtype(b), include=names)
    for name, module in model.named_modules():
        if isinstance(module, QLinear) and name in plan[4]:
            module.weight_group_size = group_size  # read by freeze() when it quantizes the weight
            if int4_codes and name in int4_codes:  # frozen already: freeze() leaves a QTensor weight as it is
                q, scale, zero = int4_codes[name]
                module.weight = _packed_weight(module, int4_grid.pack(q), int4_grid.scales_zeros(scale, zero))
    freeze(model)
    if group_size != 128:  # quanto packs for torch's int4 kernel only at group 128; the kernel itself takes 32-256
        _pack_for_cpu_kernel(model, plan[4])
    install_fast_kernels(model)
    return model


def _pack_for_cpu_kernel(model: nn.Module, names: list[str]) -> None:
    """Re-wrap int4 weights quanto left in its generic form into torch's packed CPU layout (same values)."""
    QLinear, TinyGemm = _qclasses()
    modules = dict(model.named_modules())
    for name in names:
        module = modules[name]
        w = module.weight
        if isinstance(w, TinyGemm):
            continue
        data = w._data.unpack() if hasattr(w._data, "unpack") else w._data
        packed = TinyGemm(w._qtype, w._axis, w._group_size, w.size(), w.stride(), data, (w._scale, w._shift))
        module.weight = nn.Parameter(packed, requires_grad=False)


def _qclasses():
    from optimum.quanto.nn import QLinear
    from optimum.quanto.tensor.weights.tinygemm import TinyGemmWeightQBitsTensor

    return QLinear, TinyGemmWeightQBitsTensor


def _packed_weight(module: nn.Module, packed: torch.Tensor, scale_shift: torch.Tensor) -> nn.Parameter:
    """A frozen int4 QLinear's weight from codes in torch's packed CPU layout and their (k / group, n, 2) grid."""
    from optimum.quanto.tensor.weights.tinygemm import TinyGemmPackedTensor

    _, TinyGemm = _qclasses()
    size, stride = (module.out_features, module.in_features), (module.in_features, 1)
    weight = TinyGemm(module.weight_qtype, 0, module.weight_group_size, size, stride,
                      TinyGemmPackedTensor(packed, size, stride), scale_shift)
    return nn.Parameter(weight, requires_grad=False)


def _rebuild_nonpersistent_buffers(model: nn.Module) -> None:
    """Buffers outside the state dict (rotary `inv_freq`) were built on meta; construct them again on CPU."""
    inner = getattr(model, "model", model)
    rotary = getattr(inner, "rotary_emb", None)
    if rotary is not None:
        inner.rotary_emb = type(rotary)(config=model.config)


def dense_weight(module: nn.Module) -> torch.Tensor:
    """The bf16 (out, in) weight a quantized linear computes with. int4: the packed kernel applied to the
    identity, which is exactly its own dequantization (quanto's unpack would JIT-compile a C++ extension)."""
    _, TinyGemm = _qclasses()
    w = module.weight
    if isinstance(w, TinyGemm):
        eye = torch.eye(module.in_features, dtype=torch.bfloat16)
        packed = int4_kernel.torch_layout(w._data._data)
        return torch._weight_int4pack_mm_for_cpu(eye, packed, w._group_size, w._scale_shift).t().contiguous()
    return w.dequantize().to(torch.bfloat16)


def dequantized_copy(model: nn.Module) -> nn.Module:
    """Replace every QLinear by a dense bf16 Linear holding exactly its dequantized (W4/W8 grid) weights.

    The function is the quantized model's, so an adapter trained on it is trained on the quantized base
    (QAMR) while forward and backward run on fast dense bf16 kernels instead of quanto's autograd path.
    """
    QLinear, _ = _qclasses()
    for name, module in list(model.named_modules()):
        if isinstance(module, QLinear):
            dense = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None,
                              dtype=torch.bfloat16, device="cpu")
            with torch.no_grad():
                dense.weight.copy_(dense_weight(module))
                if module.bias is not None:
                    dense.bias.copy_(module.bias)
            dense.requires_grad_(False)
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, dense)
    return model


PREFILL_ROWS = 768
"""From this many rows (a long prompt's prefill) an int4 layer unpacks its weight to bf16 for one dense GEMM:
the packed kernel is built for a few rows (26.6 ms against 10.6 ms for bf16 at 512 rows of a 4864×896 weight
on a 2-core EPYC; the unpacking costs ~10-15 ms and is paid once per call)."""
PREFILL_ROWS_PONDER = 48
"""The same where Ponder's C kernel unpacks (models.int4_kernel.unpack: one pass into a reused buffer, ~0.5 ms
for 4864×896 against ~12 ms for the tensor ops): on a 2-core EPYC the unpacked path wins from ~32 rows
(48 rows: 4.3 against 5.3 ms for 9728×896, 12.1 against 15.4 ms for the 1.5B's 17920×1536; 512 rows: 22.6
against 52.7 ms and 70.4 against 166 ms). Below it, up to 48 rows run on Ponder's kernel 16 rows at a time."""
PREFILL_ROWS_AMX = 128
"""The same on a CPU with AMX tiles, where oneDNN runs the bf16 GEMM on them: on a 2-core Xeon the unpacked
path wins from ~100 rows (0.5B prefill: 128 tokens 0.60 → 0.52 s, 512 tokens 2.37 → 0.76 s; 64 tokens 0.32
against 0.46 s, so short prompts stay packed)."""


@functools.cache
def _has_amx() -> bool:
    try:
        return bool(torch._C._cpu._init_amx())  # asks the kernel for AMX tile state; False without AMX
    except (AttributeError, RuntimeError):
        return False


NEVER = 1 << 62
"""Where the CPU has no bf16 arithmetic (no AVX512-BF16, no AMX), a bf16 GEMM is emulated in float32 and torch's
int4 kernel wins at every prompt length: on a 2-core Xeon without them the 0.5B's 512-token prompt took 6.61 s
unpacked and 3.33 s on torch's kernel, the 1.5B's 23.1 against 10.8 s (`bench/results/decode_subset_intel_nobf16*`)."""


def _native_bf16() -> bool:
    try:
        return bool(torch.cpu._is_avx512_bf16_supported()) or _has_amx()
    except (AttributeError, RuntimeError):  # an older torch: keep the thresholds measured with bf16
        return True


def prefill_rows() -> int:
    """Rows from which int4 layers compute on their unpacked bf16 weight, for this CPU (fixed per machine, so
    the same prompt always takes the same path)."""
    if _has_amx():
        return PREFILL_ROWS_AMX
    if not _native_bf16():
        return NEVER
    return PREFILL_ROWS_PONDER if int4_kernel.ENABLED and int4_kernel.UNPACKS else PREFILL_ROWS


def unpack_int4(module: nn.Module, scratch: bool = False) -> torch.Tensor:
    """The bf16 weight of a packed int4 layer, transposed: (in, out), unpacked with tensor ops. torch's CPU
    packing keeps blocks of 64 output rows, a byte per input column holding rows r (low nibble) and r + 32 (high
    nibble); w = (q - 8) · scale + zero per group of inputs, in float32 then rounded, as the kernel computes it.
    Ponder's C kernel (models.int4_kernel.unpack) does it in one pass where it runs; scratch: into the thread's
    reused buffer (valid until the next scratch unpack), which a forward pass consumes at once."""
    w = module.weight
    n, k, group = module.out_features, module.in_features, w._group_size
    packed = int4_kernel.torch_layout(w._data._data)
    fast = int4_kernel.unpack(packed, w._scale_shift, group, k, scratch)  # the same numbers, in one C pass
    if fast is not None:
        return fast
    v = packed.view(n // 64, k, 32)
    q = torch.cat((v & 0xF, v >> 4), -1).permute(1, 0, 2).reshape(k // group, group, n)
    scale_zero = w._scale_shift.float().unsqueeze(1)  # (k / group, 1, n, 2)
    wt = q.float().sub_(8).mul_(scale_zero[..., 0]).add_(scale_zero[..., 1])
    return wt.to(torch.bfloat16).view(k, n)


_UNPACK_CHECKED: dict[str, bool] = {}


def unpack_matches_kernel() -> bool:
    """Whether `unpack_int4` reads this CPU's packing right (checked once against the kernel itself)."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in _UNPACK_CHECKED:
        try:
            gen = torch.Generator().manual_seed(0)
            q = torch.randint(0, 16, (128, 256), dtype=torch.int32, generator=gen)
            scales = torch.rand(2, 128, 2, generator=gen).to(torch.bfloat16)
            probe = types.SimpleNamespace(out_features=128, in_features=256, weight=types.SimpleNamespace(
                _data=types.SimpleNamespace(_data=torch._convert_weight_to_int4pack_for_cpu(q, 1)),
                _scale_shift=scales, _group_size=128))
            eye = torch.eye(256, dtype=torch.bfloat16)
            reference = torch._weight_int4pack_mm_for_cpu(eye, probe.weight._data._data, 128, scales).t()
            _UNPACK_CHECKED[capability] = torch.equal(unpack_int4(probe).t(), reference)
        except (RuntimeError, ValueError):
            _UNPACK_CHECKED[capability] = False
    return _UNPACK_CHECKED[capability]


def _int4_forward(self, x: torch.Tensor) -> torch.Tensor:
    w = self.weight
    if torch.is_grad_enabled() or x.dtype != torch.bfloat16:
        return self._quanto_forward(x)
    x2d = x.reshape(-1, x.shape[-1]).contiguous()  # the packed kernels take contiguous rows only
    if x2d.shape[0] >= prefill_rows() and self.out_features % 64 == 0 and unpack_matches_kernel():
        out = torch.matmul(x2d, unpack_int4(self, scratch=True))
    else:
        out = int4_mm(x2d, w._data._data, w._group_size, w._scale_shift)
    out = out.view(*x.shape[:-1], out.shape[-1])
    return out if self.bias is None else out.add_(self.bias)


def _int8_forward(self, x: torch.Tensor) -> torch.Tensor:
    if torch.is_grad_enabled() or x.dtype != self._int8_scale.dtype:
        return self._quanto_forward(x)
    out = torch._weight_int8pack_mm(x.reshape(-1, x.shape[-1]).contiguous(), self.weight._data, self._int8_scale)
    out = out.view(*x.shape[:-1], out.shape[-1])
    return out if self.bias is None else out.add_(self.bias)


def _p32_reference_forward(self, x: torch.Tensor) -> torch.Tensor:
    """quanto's forward for a weight in p32, which quanto's kernel call cannot read: x @ the dequantized weight."""
    return nn.functional.linear(x, dense_weight(self).to(x.dtype), self.bias)


def _teach_quanto_p32() -> None:
    """quanto reads a packed int4 weight's codes through torch's kernel (`TinyGemmPackedTensor.unpack`: state_dict,
    dequantize), which cannot read p32: hand it torch's layout of the same codes."""
    from optimum.quanto.tensor.weights.tinygemm.packed import TinyGemmPackedTensor

    original = TinyGemmPackedTensor.unpack
    if getattr(original, "reads_p32", False):
        return

    def unpack(self):
        if self._data.dtype != torch.int8:
            return original(self)
        return original(TinyGemmPackedTensor(int4_kernel.torch_layout(self._data), self.size(), self.stride()))

    unpack.reads_p32 = True
    TinyGemmPackedTensor.unpack = unpack


def _dequant_forward(self, x: torch.Tensor) -> torch.Tensor:
    """Shapes the packed kernels do not take (tiny test models): dequantize on the fly."""
    if torch.is_grad_enabled():
        return self._quanto_forward(x)
    return nn.functional.linear(x, self.weight.dequantize().to(x.dtype), self.bias)


def install_fast_kernels(model: nn.Module) -> int:
    """Route inference through the packed CPU kernels; return how many layers got a fast path. On AVX2 the int4
    weights move into Ponder's own layout here, in place (models.int4_kernel.to_p32)."""
    from optimum.quanto.nn import QLinear
    from optimum.quanto.tensor.weights.qbytes import WeightQBytesTensor
    from optimum.quanto.tensor.weights.tinygemm import TinyGemmWeightQBitsTensor

    count = 0
    for module in model.modules():
        if not isinstance(module, QLinear) or "_quanto_forward" in module.__dict__:
            continue
        w = module.weight
        quanto_forward = module.forward
        if isinstance(w, TinyGemmWeightQBitsTensor) and w.device.type == "cpu":
            fast = _int4_forward
            data, n, k = w._data._data, module.out_features, module.in_features
            if (data.dtype == torch.uint8 and data._base is None and data.is_contiguous()  # not a view of a fused copy
                    and tuple(data.shape) == (n, k // 2) and int4_kernel.p32_fits(n, k, int(w._group_size))):
                _teach_quanto_p32()
                w._data._data = int4_kernel.to_p32(data, module.out_features, module.in_features)
                quanto_forward = types.MethodType(_p32_reference_forward, module)
        elif isinstance(w, WeightQBytesTensor) and w._data.dtype == torch.int8 and w.device.type == "cpu":
            module._int8_scale = w._scale.flatten().to(torch.bfloat16).contiguous()
            fast = _int8_forward
        else:
            fast = _dequant_forward
        module._quanto_forward = quanto_forward
        module.forward = types.MethodType(fast, module)
        count += 1
    return count
