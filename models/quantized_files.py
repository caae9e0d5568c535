"""Quantized models on disk: saved once (safetensors, int4 kept in torch's packed CPU layout, quanto's map and a
small record of how they were made), restored at launch without re-quantizing or a dense copy.

A record names the CPU kernel family the int4 codes were packed for; restored under another family whose packing
Ponder reads (models.int4_grid.PACKINGS) the codes are moved into this CPU's packing and checked against their
fingerprint.
"""
from __future__ import annotations

import json
import logging
import platform
import sys
from pathlib import Path

import torch
from torch import nn

from . import int4_grid, int4_kernel
from .fpt import FptSpec
from .quantization import GROUP_SIZE, _packed_weight, _qclasses, _rebuild_nonpersistent_buffers, install_fast_kernels

log = logging.getLogger(__name__)

QUANT_FILE = "ponder_quant.json"
WEIGHTS_FILE = "model.safetensors"
QMAP_FILE = "quantization_map.json"
PACKED_DATA, PACKED_SCALES = ".__int4pack", ".__int4scale_shift"


FORMAT = "ponder-packed-v1"


def packed_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's tensors with int4 weights kept in torch's CPU-packed layout (no unpack/repack round trip);
    other quantized weights in quanto's own flattened form."""
    QLinear, TinyGemm = _qclasses()
    state, handled = {}, set()
    for name, module in model.named_modules():
        if not isinstance(module, QLinear):
            continue
        w = module.weight
        if isinstance(w, TinyGemm):
            state[name + ".weight" + PACKED_DATA] = int4_kernel.torch_layout(w._data._data)  # files hold torch's
            state[name + ".weight" + PACKED_SCALES] = w._scale_shift
        else:
            w.save_to_state_dict(state, name + ".weight.", False)
        handled.add(name + ".weight")
    for key, value in [*model.named_parameters(), *model.named_buffers()]:
        if key not in handled:
            state[key] = value.detach()
    return {k: v.contiguous() for k, v in state.items()}


def cpu_capability() -> str:
    """The CPU kernel family torch dispatches to (e.g. AVX2, AVX512): int4 weights are packed for one of them."""
    return torch.backends.cpu.get_cpu_capability()


def save_quantized(model: nn.Module, folder: Path, bits: int, head_bits: int | None,
                   group_size: int = GROUP_SIZE) -> None:
    """Write the quantized weights (safetensors, int4 in packed CPU layout), quanto's map and the config."""
    from optimum.quanto import quantization_map
    from safetensors.torch import save_file

    folder = Path(folder)
    save_file(packed_state_dict(model), str(folder / WEIGHTS_FILE), metadata={"format": FORMAT})
    (folder / QMAP_FILE).write_text(json.dumps(quantization_map(model)))
    spec = getattr(model, "ponder_fpt", None)
    if spec is not None:  # adapters and heads trained on the original basis are moved into the transformed one
        spec.save(folder)
    (folder / QUANT_FILE).write_text(json.dumps({"bits": bits, "head_bits": head_bits, "backend": "optimum-quanto",
                                                 "method": "w4-fpt" if spec is not None else f"w{bits}",
                                                 "format": FORMAT, "torch": torch.__version__,
                                                 "cpu_capability": cpu_capability(), "group_size": group_size,
                                                 "codes_sha256": getattr(model, "ponder_codes", None),
                                                 "platform": build_platform()}))
    model.config.save_pretrained(folder)


COPIED_SUFFIXES = ("._data", "._scale", PACKED_DATA, PACKED_SCALES)


def read_weights(path: Path, group: int = 16) -> dict[str, torch.Tensor]:
    """The saved tensors: quantized ones copied into fresh, aligned buffers (the packed CPU kernels can fault on
    unaligned data), the rest (embedding, norms, biases) left on a file mapping of their own.

    A page read through a mapping stays resident while the mapping lives. Copying through the mapping that also
    backs the embedding kept every copied page twice (~255 MB for the 0.5B), and copying through one mapping
    peaks at twice the copied bytes; so copies go through short-lived mappings of `group` tensors each, and
    the embedding's mapping reads in only the rows of the tokens seen, the way llama.cpp maps its GGUF."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        keys = list(f.keys())
    copied = [k for k in keys if k.endswith(COPIED_SUFFIXES)]
    state = {}
    for start in range(0, len(copied), group):
        with safe_open(str(path), framework="pt") as f:
            state.update({k: f.get_tensor(k).clone() for k in copied[start:start + group]})
    with safe_open(str(path), framework="pt") as f:
        state.update({k: f.get_tensor(k) for k in keys if not k.endswith(COPIED_SUFFIXES)})
    return state


def build_platform() -> str:
    """The OS and machine torch packed int4 on: its packing per CPU capability differs between builds."""
    return f"{sys.platform}-{platform.machine().lower()}"


def load_quantized(folder: Path) -> nn.Module:
    """Rebuild a Qwen2 model on `meta` and adopt the saved tensors: no re-quantizing, no dense copy. int4 codes
    packed for another CPU capability of this build are moved into this CPU's packing (`repack`)."""
    from optimum.quanto.quantize import _quantize_submodule
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(folder)
    info = quant_info(folder) or {}
    if info.get("format") != FORMAT or info.get("torch") != torch.__version__:
        raise ValueError(f"quantized weights in {folder} were written by another format or torch version")
    packed_for = info.get("cpu_capability")
    same_build = info.get("platform", build_platform()) == build_platform()  # records before it: this machine's
    if not same_build or (packed_for != cpu_capability() and not (
            packed_for in int4_grid.PACKINGS and int4_grid.packings_known())):
        raise ValueError(f"quantized weights in {folder} were packed for {packed_for!r} kernels, "
                         f"this CPU runs {cpu_capability()!r}")
    config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, trust_remote_code=False)
    qmap = json.loads((folder / QMAP_FILE).read_text())
    for name, module in list(model.named_modules()):  # swap in quantized modules, still on meta
        if name in qmap:
            _quantize_submodule(model, name, module, weights=qmap[name]["weights"])
    state = read_weights(folder / WEIGHTS_FILE)
    if packed_for != cpu_capability():
        repack(state, packed_for, int(info.get("group_size", GROUP_SIZE)), info.get("codes_sha256"))
        log.info("%s: int4 weights packed for %s kernels, repacked for %s", folder, packed_for, cpu_capability())
    packed = {k[: -len(PACKED_DATA)] for k in state if k.endswith(PACKED_DATA)}
    plain = {k: v for k, v in state.items() if not k.endswith((PACKED_DATA, PACKED_SCALES))}
    model.load_state_dict(plain, strict=False, assign=True)
    modules = dict(model.named_modules())
    for key in packed:
        module = modules[key[: -len(".weight")]]
        module.weight_group_size = int(info.get("group_size", GROUP_SIZE))
        module.weight = _packed_weight(module, state[key + PACKED_DATA], state[key + PACKED_SCALES])
    del state, plain
    check_quantized_shapes(model)
    _rebuild_nonpersistent_buffers(model)
    tensors = list(model.named_parameters()) + list(model.named_buffers())
    missing = [k for k, v in tensors if v.device.type == "meta"]
    if missing:
        raise ValueError(f"quantized checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")
    model.eval()
    spec = FptSpec.load(folder)
    if spec is not None:
        model.ponder_fpt = spec
    model.ponder_codes = info.get("codes_sha256")  # which rounding of the weights this is (W4-FPT's GPTQ)
    install_fast_kernels(model)
    return model


def check_quantized_shapes(model: nn.Module) -> None:
    """Refuse (ValueError) quantized weights whose saved tensors do not have the shapes their layer's config gives:
    the int4 kernels read them through raw pointers (models/_int4.c), so codes or scales too small for the layer
    would be read past their end, and int8 ones would fail at the first token instead of here."""
    from optimum.quanto.tensor.weights.qbytes import WeightQBytesTensor

    QLinear, TinyGemm = _qclasses()
    for name, module in model.named_modules():
        if not isinstance(module, QLinear):
            continue
        w, n, k = module.weight, module.out_features, module.in_features
        if isinstance(w, TinyGemm):
            data, scales, group = w._data._data, w._scale_shift, int(w._group_size)
            fits = (group > 0 and k % group == 0 and data.dtype == torch.uint8 and tuple(data.shape) == (n, k // 2)
                    and scales.dtype == torch.bfloat16 and tuple(scales.shape) == (k // group, n, 2))
        elif isinstance(w, WeightQBytesTensor):
            fits = tuple(w._data.shape) == (n, k) and w._scale.numel() == n
        else:
            continue
        if not fits:
            raise ValueError(f"the quantized weights of {name} do not have the shapes of its {n}x{k} layer")


def repack(state: dict[str, torch.Tensor], packed_for: str, group: int, fingerprint: str | None,
           rows: int = 4096) -> None:
    """Move the saved int4 codes from `packed_for`'s packing into this CPU's, in place and `rows` outputs at a time
    (a few MB of codes alive at once), and check them against the fingerprint saved with them (W4-FPT's). Seconds at
    each load (5.6 s for the 0.5B, 10 s for the 1.5B), where preparing again would take minutes once and round some
    weights differently: a prepared model follows the machine's kernels (`ATEN_CPU_CAPABILITY`, a data folder or a
    virtual machine moved to another CPU) with the same numbers."""
    import hashlib

    from .gptq import add_to_fingerprint

    digest = hashlib.sha256()
    for key in sorted(k for k in state if k.endswith(PACKED_DATA)):  # name order, as the fingerprint reads them
        name = key[: -len(".weight" + PACKED_DATA)]
        scale_shift = state[name + ".weight" + PACKED_SCALES]
        n, k = scale_shift.shape[1], scale_shift.shape[0] * group
        source, out = state[key].reshape(-1), torch.empty_like(state[key])
        flat = out.view(-1)

        def slices(source=source, flat=flat, n=n, k=k):
            for start in range(0, n, rows):  # rows: a multiple of every packing's block
                end = min(n, start + rows)
                codes = int4_grid.unpack(source[start * k // 2: end * k // 2], end - start, k, packed_for)
                flat[start * k // 2: end * k // 2] = int4_grid.pack(codes).view(-1)
                yield codes

        add_to_fingerprint(digest, name, slices(), scale_shift[..., 0].t(), scale_shift[..., 1].t())
        state[key] = out
    if fingerprint is not None and digest.hexdigest() != fingerprint:
        raise ValueError(f"int4 codes read from the {packed_for} packing differ from the ones saved")


def quant_info(folder: Path) -> dict | None:
    """The prepared weights' record, None when there is none or it cannot be read (then they are prepared again:
    a record cut short by a crash or a full disk is never fatal)."""
    path = Path(folder) / QUANT_FILE
    if not path.is_file():
        return None
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None
