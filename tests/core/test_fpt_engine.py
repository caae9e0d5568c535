"""W4-FPT end to end on the tiny model: quantized once with its transform saved beside it, restored with it;
adapters saved in the original basis load into the transformed model and are saved back in the original basis;
head features are mapped back to the original basis."""
import json

import pytest
import torch
from safetensors.torch import load_file

from core.adapters import lora as adapters
from core.config import EngineConfig
from core.loading import load_model, load_plain, quantized_dir
from core.training.heads import original_basis
from models.fpt import FptSpec, apply_fpt
from tests.models.test_fpt import float_model, random_spec, run


def test_w4_fpt_is_quantized_once_and_restored_with_its_transform(tiny_store, tiny_hf_dir):
    m = tiny_store.get("tiny-qwen2")
    cfg = EngineConfig(model_id="tiny-qwen2", precision="w4-fpt", kv="int8")
    first = load_model(m, cfg)
    qdir = quantized_dir(m, "w4-fpt", 4)
    assert qdir.name == "w4-fpt-h4"
    assert json.loads((qdir / "ponder_quant.json").read_text())["method"] == "w4-fpt"
    assert FptSpec.load(qdir) is not None and first.ponder_fpt is not None
    stamp = (qdir / "model.safetensors").stat().st_mtime_ns
    again = load_model(m, cfg)
    assert (qdir / "model.safetensors").stat().st_mtime_ns == stamp  # restored, not re-quantized
    assert again.ponder_fpt is not None
    ids = torch.randint(5, 300, (1, 12))
    got, restored = run(first, ids).logits.float(), run(again, ids).logits.float()
    assert torch.allclose(got, restored, atol=1e-3)
    ref = run(load_plain(tiny_hf_dir, torch.bfloat16), ids).logits.float()
    assert ((got - ref).norm() / ref.norm()).item() < 0.5  # the bf16 model's function, up to int4 rounding
    rebuilt = load_model(m, cfg, rebuild=True)  # `ponder quantize --force`
    assert (qdir / "model.safetensors").stat().st_mtime_ns != stamp and rebuilt.ponder_fpt is not None


def _adapter_on(model):
    peft_model = adapters.attach_new(model, rank=4)
    with torch.no_grad():
        for p in peft_model.parameters():
            if p.requires_grad:
                p.normal_(0, 0.05)
    return peft_model.eval()


def test_adapters_load_into_and_save_from_the_transformed_basis(tmp_path):
    ids = torch.randint(5, 440, (1, 16))
    original = _adapter_on(float_model())
    ref = run(original, ids).logits
    adapters.save_adapter(original, tmp_path / "orig", {"kind": "reasoning"})
    saved = load_file(str(tmp_path / "orig" / "adapter_model.safetensors"))
    spec = random_spec(float_model().config, seed=5)
    moved = adapters.load_adapter(apply_fpt(float_model(), spec), tmp_path / "orig")
    got = run(moved, ids).logits
    # the saved factors are bf16: compare against the original run on the same rounded factors' scale
    assert ((got - ref).norm() / ref.norm()).item() < 2e-3
    adapters.save_adapter(moved, tmp_path / "back", {"kind": "reasoning"})
    back = load_file(str(tmp_path / "back" / "adapter_model.safetensors"))
    assert set(back) == set(saved)
    for key in saved:
        assert torch.allclose(back[key].float(), saved[key].float(), atol=2e-3, rtol=2e-2), key


def test_head_features_of_a_transformed_model_are_the_original_ones():
    ids = torch.randint(5, 440, (1, 10))
    hidden = run(float_model(), ids, hidden=True).hidden_states[-1][0]
    model = apply_fpt(float_model(), random_spec(float_model().config, seed=6))
    moved = run(model, ids, hidden=True).hidden_states[-1][0]
    assert torch.allclose(original_basis(model, moved), hidden, atol=1e-4)
    assert original_basis(float_model(), hidden) is hidden  # untransformed: untouched


def test_quantize_command_prepares_w4_fpt(tiny_store, capsys):
    from app.cli import run_cli

    assert run_cli(["quantize", "--model", "tiny-qwen2", "--method", "w4-fpt", "--group", "64"]) == 0
    out = capsys.readouterr().out
    folder = quantized_dir(tiny_store.get("tiny-qwen2"), "w4-fpt", 4, 64)
    assert folder.name == "w4-fpt-h4-g64" and str(folder) in out and "MB" in out
    assert FptSpec.load(folder) is not None
    assert run_cli(["quantize", "--model", "tiny-qwen2", "--method", "w4-fpt", "--group", "64"]) == 0
    assert "already prepared" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:  # not a group size the kernel takes: a usage error
        run_cli(["quantize", "--model", "tiny-qwen2", "--method", "w4", "--group", "512"])
    assert refused.value.code == 2


def test_a_shipped_spec_is_used_only_for_the_weights_it_was_fitted_on(tiny_store, tmp_path, monkeypatch):
    """resources/fpt/<id>/ is pinned to the source file's sha256: matching weights merge it instead of calibrating
    (the first launch's saving), other weights are calibrated here as before."""
    from core import loading
    from models import fpt_calibration

    m = tiny_store.get("tiny-qwen2")
    manifest = json.loads((m.folder / "manifest.json").read_text())
    (m.folder / "manifest.json").write_text(json.dumps({**manifest, "gguf_sha256": "ab" * 32}))
    spec = random_spec(load_plain(m.hf_dir, torch.bfloat16).config)
    folder = tmp_path / "fpt" / "tiny-qwen2"
    folder.mkdir(parents=True)
    spec.save(folder)
    (folder / "provenance.json").write_text(json.dumps({"base_sha256": "ab" * 32}))
    (tmp_path / "calibration").symlink_to(loading.resource_dir() / "calibration")
    monkeypatch.setattr(loading, "resource_dir", lambda: tmp_path)
    calibrated = []
    real = fpt_calibration.calibrate
    monkeypatch.setattr(fpt_calibration, "calibrate", lambda *a, **k: calibrated.append(1) or real(*a, **k))
    model = load_model(m, EngineConfig(model_id="tiny-qwen2", precision="w4-fpt"))
    assert calibrated == [] and torch.equal(model.ponder_fpt.mlp_scale[0], spec.mlp_scale[0])
    qdir = quantized_dir(m, "w4-fpt", 4)
    info = json.loads((qdir / "ponder_quant.json").read_text())
    assert len(info["codes_sha256"]) == 64
    stamp = (qdir / "model.safetensors").stat().st_mtime_ns
    load_model(m, EngineConfig(model_id="tiny-qwen2", precision="w4-fpt"))
    assert (qdir / "model.safetensors").stat().st_mtime_ns == stamp  # the same spec: restored as it is
    better = random_spec(load_plain(m.hf_dir, torch.bfloat16).config, seed=9)  # a release ships other transforms
    better.save(folder)
    model = load_model(m, EngineConfig(model_id="tiny-qwen2", precision="w4-fpt"))
    assert (qdir / "model.safetensors").stat().st_mtime_ns != stamp and calibrated == []
    assert torch.equal(model.ponder_fpt.mlp_scale[0], better.mlp_scale[0])
    assert FptSpec.load(qdir).same_transforms(better) and not better.same_transforms(spec)
    (folder / "provenance.json").write_text(json.dumps({"base_sha256": "cd" * 32}))  # other weights
    assert loading.shipped_fpt_spec(m) is None
    load_model(m, EngineConfig(model_id="tiny-qwen2", precision="w4-fpt"), rebuild=True)
    assert calibrated == [1]


def test_codes_fingerprint_names_the_exact_codes():
    from models.gptq import codes_fingerprint

    q = torch.randint(0, 16, (8, 32), dtype=torch.int32)
    s, z = torch.rand(8, 1).to(torch.bfloat16), torch.rand(8, 1).to(torch.bfloat16)
    base = codes_fingerprint({"a": (q, s, z)})
    assert codes_fingerprint({"a": (q.clone(), s.clone(), z.clone())}) == base
    q2 = q.clone()
    q2[3, 7] = (q2[3, 7] + 1) % 16
    assert codes_fingerprint({"a": (q2, s, z)}) != base
    assert codes_fingerprint({"b": (q, s, z)}) != base
