"""W4/W8 quantization: quantize once, save, restore without re-quantizing, same outputs; fast kernels match quanto."""
from pathlib import Path

import pytest
import torch

from core.config import EngineConfig
from core.decode.cache import new_cache
from core.loading import load_model, quantized_dir
from models.quantization import install_fast_kernels, quantize_model
from models.quantized_files import load_quantized
from tests.tiny import make_model


def logits_of(model, ids):
    with torch.inference_mode():
        return model(input_ids=ids, cache=new_cache(model.config, "bf16"), use_cache=True).logits.float()


def test_w4_and_w8_close_to_bf16():
    ids = torch.randint(5, 300, (1, 16))
    ref = logits_of(make_model(448), ids)
    errors = {}
    for bits in (8, 4):
        q = quantize_model(make_model(448), bits, head_bits=bits)
        got = logits_of(q, ids)
        errors[bits] = ((got - ref).norm() / ref.norm()).item()
        assert type(q.model.layers[0].mlp.up_proj).__name__ == "QLinear"
    # random gaussian weights are the worst case for 4 bits; real weights do far better (see model tests)
    assert errors[8] < 0.05 and errors[4] < 0.5 and errors[8] < errors[4]


def test_fast_kernel_equals_quanto_forward():
    q = quantize_model(make_model(448), 4, head_bits=4)
    layer = q.model.layers[0].mlp.down_proj
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    with torch.inference_mode():
        fast = layer(x)
        slow = layer._quanto_forward(x)
    assert torch.allclose(fast.float(), slow.float(), atol=1e-2, rtol=1e-2)
    strided = torch.randn(256, 3, dtype=torch.bfloat16).t()  # non-contiguous rows, as logits_to_keep slices give
    with torch.inference_mode():
        assert torch.allclose(layer(strided).float(), layer(strided.contiguous()).float())
    assert install_fast_kernels(q) == 0  # already installed: idempotent


def test_long_prompts_run_on_the_unpacked_weight_it_equals_the_kernels_own(monkeypatch):
    from models import quantization

    q = quantize_model(make_model(448), 4, head_bits=4)
    layer = q.model.layers[0].mlp.down_proj  # 256 inputs: packed int4
    assert layer.out_features % 64 == 0  # whole blocks of 64 output rows: the unpacked path applies
    assert quantization.unpack_matches_kernel()  # the packing read right on this CPU
    assert torch.equal(quantization.unpack_int4(layer).t(), quantization.dense_weight(layer))
    assert quantization.prefill_rows() in (quantization.PREFILL_ROWS, quantization.PREFILL_ROWS_PONDER,
                                           quantization.PREFILL_ROWS_AMX, quantization.NEVER)
    rows = quantization.PREFILL_ROWS_PONDER
    x = torch.randn(rows, 256, dtype=torch.bfloat16)
    monkeypatch.setattr(quantization, "prefill_rows", lambda: rows)  # also where this CPU never unpacks (no bf16)
    with torch.inference_mode():
        unpacked = layer(x)  # as many rows as a long prompt: one bf16 GEMM
        monkeypatch.setattr(quantization, "prefill_rows", lambda: 1 << 30)
        packed = layer(x)
    torch.testing.assert_close(unpacked.float(), packed.float(), atol=2e-2, rtol=2e-2)


def test_quantized_once_then_restored(tiny_store):
    m = tiny_store.get("tiny-qwen2")
    cfg = EngineConfig(model_id="tiny-qwen2", precision="w4", kv="int8")
    first = load_model(m, cfg)
    qdir = quantized_dir(m, "w4", 4)
    assert (qdir / "model.safetensors").is_file() and (qdir / "quantization_map.json").is_file()
    stamp = (qdir / "model.safetensors").stat().st_mtime_ns
    again = load_model(m, cfg)
    assert (qdir / "model.safetensors").stat().st_mtime_ns == stamp  # not re-quantized
    ids = torch.randint(5, 300, (1, 10))
    assert torch.allclose(logits_of(first, ids), logits_of(again, ids), atol=1e-3)


def test_damaged_quantized_cache_is_rebuilt(tiny_store):
    m = tiny_store.get("tiny-qwen2")
    cfg = EngineConfig(model_id="tiny-qwen2", precision="w8", kv="bf16", head_bits=8)
    load_model(m, cfg)
    qdir = quantized_dir(m, "w8", 8)
    (qdir / "model.safetensors").write_bytes(b"garbage")
    model = load_model(m, cfg)
    assert logits_of(model, torch.randint(5, 300, (1, 4))).isfinite().all()
    assert load_quantized(qdir) is not None
    from core.loading import weights_status
    from models.quantized_files import QUANT_FILE, quant_info

    for damaged in ("", "[1, 2]", '{"cut sh'):  # the record cut short by a crash or a full disk: prepared again
        (qdir / QUANT_FILE).write_text(damaged)
        assert quant_info(qdir) is None and "prepared at first use" in weights_status(m, cfg)[0]
        assert logits_of(load_model(m, cfg), torch.randint(5, 300, (1, 4))).isfinite().all()
        assert quant_info(qdir) is not None


def test_dense_copy_computes_what_the_quantized_model_computes():
    from models.quantization import dequantized_copy

    q = quantize_model(make_model(448), 4, head_bits=4)
    ids = torch.randint(5, 300, (1, 12))
    before = logits_of(q, ids)
    dense = dequantized_copy(q)
    assert not any(type(m).__name__ == "QLinear" for m in dense.modules())
    assert torch.allclose(logits_of(dense, ids), before, atol=0.05, rtol=0.02)


def test_weights_packed_for_kernels_whose_packing_is_unknown_are_requantized(tiny_store):
    """int4 weights packed for kernels whose packing Ponder cannot read (an ARM build's, say) would compute garbage:
    such a cache is re-quantized, not trusted."""
    import json

    m = tiny_store.get("tiny-qwen2")
    cfg = EngineConfig(model_id="tiny-qwen2", precision="w4", kv="int8")
    load_model(m, cfg)
    qdir = quantized_dir(m, "w4", 4)
    info = json.loads((qdir / "ponder_quant.json").read_text())
    assert info["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    (qdir / "ponder_quant.json").write_text(json.dumps({**info, "cpu_capability": "SOME_OTHER_ISA"}))
    with pytest.raises(ValueError, match="packed for"):
        load_quantized(qdir)
    load_model(m, cfg)  # re-quantized for this CPU and saved again
    assert json.loads((qdir / "ponder_quant.json").read_text())["cpu_capability"] == info["cpu_capability"]


CHILD_SAVE = """
import sys
from pathlib import Path
from safetensors.torch import save_file
from models import int4_grid
from models.gptq import codes_fingerprint
from models.int4_kernel import torch_layout
from models.quantization import dense_weight, quantize_model
from models.quantized_files import cpu_capability, save_quantized
from tests.tiny import make_model
out = Path(sys.argv[1])
q = quantize_model(make_model(448), 4, head_bits=4)
codes = {}
for name, module in q.named_modules():
    w = getattr(module, "weight", None)
    if hasattr(w, "_scale_shift"):
        ss = w._scale_shift
        codes[name] = (int4_grid.unpack(torch_layout(w._data._data), ss.shape[1], ss.shape[0] * 128, cpu_capability()),
                       ss[..., 0].t(), ss[..., 1].t())
q.ponder_codes = codes_fingerprint(codes)
save_quantized(q, out, 4, 4)
save_file({n: dense_weight(q.get_submodule(n)).contiguous() for n in codes}, str(out / "dense.safetensors"))
print(cpu_capability())
"""


def test_weights_packed_for_another_known_packing_are_converted_not_requantized(tmp_path):
    """A cache saved under another CPU capability whose int4 packing Ponder knows (AVX2 here, or the plain build
    on an AVX2 machine) loads with its codes moved into this CPU's packing: every int4 matrix dequantizes to the
    numbers the other kernels computed, and the codes are checked against the fingerprint saved with them."""
    import json
    import os
    import subprocess
    import sys

    from safetensors.torch import load_file

    from models import int4_grid
    from models.quantization import dense_weight

    here = torch.backends.cpu.get_cpu_capability()
    if here not in ("AVX512", "AVX2") or not int4_grid.packings_known():
        pytest.skip(f"needs a build whose packings Ponder reads and a capability above another ({here})")
    other = "avx2" if here == "AVX512" else "default"
    env = dict(os.environ, ATEN_CPU_CAPABILITY=other)
    run = subprocess.run([sys.executable, "-c", CHILD_SAVE, str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert run.returncode == 0, run.stderr[-2000:]
    info = json.loads((tmp_path / "ponder_quant.json").read_text())
    assert info["cpu_capability"] == run.stdout.split()[-1] != here
    restored = load_quantized(tmp_path)
    dense = load_file(str(tmp_path / "dense.safetensors"))
    assert dense
    for name, expected in dense.items():
        assert torch.equal(dense_weight(restored.get_submodule(name)), expected), name
    (tmp_path / "ponder_quant.json").write_text(json.dumps({**info, "codes_sha256": "0" * 64}))
    with pytest.raises(ValueError, match="differ from the ones saved"):
        load_quantized(tmp_path)


@pytest.mark.parametrize("n", [16, 48, 80, 128, 208, 1152])
def test_unpack_reads_what_torch_packs_here_shorter_last_blocks_too(n):
    from models import int4_grid

    if not int4_grid.packings_known():
        pytest.skip("torch's int4 packing in this build is not the one Ponder reads")
    q = torch.randint(0, 16, (n, 256), dtype=torch.int32, generator=torch.Generator().manual_seed(n))
    packed = int4_grid.pack(q)
    assert torch.equal(int4_grid.unpack(packed, n, 256, torch.backends.cpu.get_cpu_capability()).int(), q)


def test_repack_checks_the_fingerprint_gptq_saved():
    """The codes read back are fingerprinted exactly as W4-FPT's GPTQ fingerprinted them, row slices or not."""
    from models.fpt_calibration import quantize_w4_fpt
    from models.quantized_files import PACKED_DATA, cpu_capability, packed_state_dict, repack

    model = make_model(448, hidden_size=256)
    batches = [torch.randint(5, 440, (n,)) for n in (32, 20)]
    quantized = quantize_w4_fpt(model, batches, head_bits=4, group=32)
    state = packed_state_dict(quantized)
    before = {k: v.clone() for k, v in state.items() if k.endswith(PACKED_DATA)}
    repack(state, cpu_capability(), 32, quantized.ponder_codes, rows=64)  # this packing to itself, 64 rows a slice
    assert all(torch.equal(state[k], v) for k, v in before.items())
    with pytest.raises(ValueError, match="differ"):
        repack(state, cpu_capability(), 32, "0" * 64)


def test_smaller_int4_groups_are_closer_and_survive_save_and_restore(tmp_path):
    """Group size is a real setting: smaller groups quantize closer to bf16, the packed kernel runs them, and a
    saved model restores with its own group size (not the default)."""
    from models.quantization import dense_weight
    from models.quantized_files import save_quantized

    ref = make_model(448).model.layers[0].mlp.down_proj.weight.float()  # in_features 256: packed int4
    errors, models = {}, {}
    for g in (32, 128):
        q = quantize_model(make_model(448), 4, head_bits=4, group_size=g)
        layer = q.model.layers[0].mlp.down_proj
        assert layer.weight_group_size == g and layer.weight._group_size == g
        errors[g] = ((dense_weight(layer).float() - ref).norm() / ref.norm()).item()
        models[g] = q
    assert errors[32] < 0.8 * errors[128]
    save_quantized(models[32], tmp_path, 4, 4, group_size=32)
    restored = load_quantized(tmp_path)
    assert restored.model.layers[0].mlp.down_proj.weight._group_size == 32
    ids = torch.randint(5, 300, (1, 10))
    assert torch.equal(logits_of(models[32], ids), logits_of(restored, ids))
    with pytest.raises(ValueError, match="group_size"):
        quantize_model(make_model(448), 4, group_size=48)


def test_engine_config_group_size_gets_its_own_folder(tiny_store):
    m = tiny_store.get("tiny-qwen2")
    model = load_model(m, EngineConfig(model_id="tiny-qwen2", precision="w4", kv="int8", group_size=32))
    assert quantized_dir(m, "w4", 4, 32).name == "w4-h4-g32" and quantized_dir(m, "w4", 4).name == "w4-h4"
    assert (quantized_dir(m, "w4", 4, 32) / "model.safetensors").is_file()
    assert model.model.layers[0].mlp.down_proj.weight._group_size == 32
    with pytest.raises(ValueError, match="group_size"):
        EngineConfig(group_size=48)


def mapped_file(tensor: torch.Tensor) -> str | None:
    """The file whose mapping holds `tensor`'s data ("" for anonymous memory), from /proc/self/maps."""
    ptr = tensor.data_ptr()
    for line in open("/proc/self/maps"):
        fields = line.split()
        low, high = (int(x, 16) for x in fields[0].split("-"))
        if low <= ptr < high:
            return fields[5] if len(fields) > 5 else ""
    return None


def test_restored_weights_copy_the_packed_tensors_and_map_the_embedding(tmp_path):
    """The packed int4 tensors are aligned copies of their own; the embedding stays on the file's mapping, so only
    the rows of the tokens seen are ever read in (the window's resident memory, issue #12)."""
    from models.quantized_files import PACKED_DATA, read_weights, save_quantized

    save_quantized(quantize_model(make_model(448), 4, head_bits=4), tmp_path, 4, 4)
    path = tmp_path / "model.safetensors"
    state = read_weights(path)
    assert mapped_file(state["model.embed_tokens.weight"]) == str(path)
    packed = [k for k in state if k.endswith(PACKED_DATA)]
    assert packed
    for key in packed:
        assert mapped_file(state[key]) != str(path) and state[key].data_ptr() % 64 == 0
    restored = load_quantized(tmp_path)
    assert mapped_file(restored.model.embed_tokens.weight) == str(path)


def test_without_bf16_arithmetic_prompts_stay_on_the_int4_kernel(monkeypatch):
    """A bf16 GEMM without AVX512-BF16 or AMX is emulated in float32: on such CPUs a prompt never unpacks (a 2-core
    Xeon without them took 6.61 s for the 0.5B's 512-token prompt unpacked, 3.33 s on torch's int4 kernel)."""
    from models import quantization

    monkeypatch.setattr(quantization, "_has_amx", lambda: False)
    monkeypatch.setattr(quantization, "_native_bf16", lambda: False)
    assert quantization.prefill_rows() == quantization.NEVER
    monkeypatch.setattr(quantization, "_native_bf16", lambda: True)
    assert quantization.prefill_rows() in (quantization.PREFILL_ROWS, quantization.PREFILL_ROWS_PONDER)


def test_a_full_disk_when_saving_keeps_the_quantized_model_with_a_warning(tiny_store, monkeypatch, tmp_path):
    """Quantized fine, then the disk fills up while saving: the engine runs on the model in memory and tells the
    user the weights were not kept; `ponder quantize` (no warnings list) still fails with DiskFull."""
    import errno

    import core.loading
    from core.loading import load_engine
    from models.errors import DiskFull

    def full(model, folder, *args, **kwargs):
        (Path(folder) / "model.safetensors").write_bytes(b"x" * 1000)  # half written
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(core.loading, "save_quantized", full)
    monkeypatch.setattr(core.loading, "resource_dir", lambda: tmp_path / "no-resources")
    m = tiny_store.get("tiny-qwen2")
    cfg = EngineConfig(model_id="tiny-qwen2", precision="w4", kv="int8", context=256)
    engine = load_engine(cfg, tiny_store, reasoning=False)
    assert type(engine.model.model.layers[0].mlp.up_proj).__name__ == "QLinear"
    assert logits_of(engine.model, torch.randint(5, 300, (1, 4))).isfinite().all()
    assert len(engine.warnings) == 1 and "could not be saved" in engine.warnings[0]
    assert "prepared again next time" in engine.warnings[0]
    assert sorted(p.name for p in m.folder.iterdir() if "w4" in p.name) == []  # nothing half-written kept
    with pytest.raises(DiskFull):
        load_model(m, cfg)
