"""Prepared (quantized) weights whose saved tensors disagree with the layers their config gives are refused when
restored, and prepared again: the int4 kernel (models/_int4.c) reads codes and scales through raw pointers, so
tensors too small for the layer were read past their end (NaN logits, or a crash), and int8 ones failed at the
first token instead."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from core.config import EngineConfig
from core.decode.cache import new_cache
from core.loading import load_model, quantized_dir
from models.quantization import quantize_model
from models.quantized_files import FORMAT, PACKED_DATA, QUANT_FILE, WEIGHTS_FILE, load_quantized, save_quantized
from tests.tiny import make_model


def saved(folder, bits: int):
    """A model whose linears take torch's packed int4 kernel (hidden 256), quantized and saved to `folder`."""
    save_quantized(quantize_model(make_model(448, hidden_size=256), bits, head_bits=bits), folder, bits, bits)
    return load_file(folder / WEIGHTS_FILE)


def rewrite(folder, state) -> None:
    save_file(state, str(folder / WEIGHTS_FILE), metadata={"format": FORMAT})


def test_int4_scales_for_another_group_size_are_refused(tmp_path):
    """The record says groups of 32, the scales were made for groups of 128: the kernel read 4x the scales held."""
    saved(tmp_path, 4)
    info = json.loads((tmp_path / QUANT_FILE).read_text())
    (tmp_path / QUANT_FILE).write_text(json.dumps({**info, "group_size": 32}))
    with pytest.raises(ValueError, match="shapes"):
        load_quantized(tmp_path)


def test_int4_codes_too_small_for_their_layer_are_refused(tmp_path):
    state = saved(tmp_path, 4)
    key = next(k for k in state if k.endswith(PACKED_DATA))
    state[key] = state[key][:, : state[key].shape[1] // 4].contiguous()
    rewrite(tmp_path, state)
    with pytest.raises(ValueError, match="shapes"):
        load_quantized(tmp_path)


def test_int8_weights_of_another_shape_are_refused(tmp_path):
    state = saved(tmp_path, 8)
    key = "model.layers.0.mlp.down_proj.weight._data"
    state[key] = state[key][:, :64].contiguous()
    rewrite(tmp_path, state)
    with pytest.raises(ValueError, match="shapes"):
        load_quantized(tmp_path)


def test_prepared_weights_of_another_shape_are_prepared_again(tiny_store):
    """Through the app's loader: the mismatched cache is rebuilt and the model answers (the old one restored it and
    failed at the first token: `_weight_int8pack_mm_cpu : expect B.size(1) == 256`)."""
    m = tiny_store.get("tiny-qwen2")
    cfg = EngineConfig(model_id="tiny-qwen2", precision="w8", kv="bf16", head_bits=8)
    load_model(m, cfg)
    qdir = quantized_dir(m, "w8", 8)
    state = load_file(qdir / WEIGHTS_FILE)
    key = "model.layers.0.self_attn.q_proj.weight._data"
    state[key] = state[key][:, :32].contiguous()
    rewrite(qdir, state)
    model = load_model(m, cfg)
    with torch.inference_mode():
        logits = model(input_ids=torch.randint(5, 300, (1, 4)), cache=new_cache(model.config, "bf16"),
                       use_cache=True).logits
    assert logits.float().isfinite().all()
    assert load_file(qdir / WEIGHTS_FILE)[key].shape[1] == m.spec.hidden_size  # saved again, whole
