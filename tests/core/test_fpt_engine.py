"""W4-FPT end to end on the tiny model: quantized once with its transform saved beside it, restored with it;
adapters saved in the original basis load into the transformed model and are saved back in the original basis;
head features are mapped back to the original basis."""
import json

import pytest
import torch
from safetensors.torch import load_file

from core import adapters
from core.config import EngineConfig
from core.head_training import original_basis
from core.loading import load_model, load_plain, quantized_dir
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
