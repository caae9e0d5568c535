"""GGUF files handed to the app by a user or an attacker: hostile counts, lengths, nesting and hyperparameters are
refused with CorruptModelFile at once (no hang, no recursion error, no allocation beyond the file), and a
consistent Qwen2 GGUF still converts. Every file is small and synthetic."""
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from models.errors import CorruptModelFile

ROOT = Path(__file__).resolve().parents[2]
ARRAY, STRING, UINT8, UINT32 = 9, 8, 0, 4


def gstr(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(data)) + data


def kv_string(key: str, value: str) -> bytes:
    return gstr(key) + struct.pack("<I", STRING) + gstr(value)


def gguf_bytes(kvs: list[bytes], tensors: bytes = b"", n_tensors: int = 0) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, len(kvs)) + b"".join(kvs) + tensors


ARCH = kv_string("general.architecture", "qwen2")
HOSTILE = {
    # an array of 2**63 bytes in a file of a few: gguf's reader appended empty items for ever (a hang, memory growing)
    "array_count_2_63": gguf_bytes([ARCH, gstr("x") + struct.pack("<IIQ", ARRAY, UINT8, 2**63) + b"\0" * 16]),
    # arrays of arrays 5,000 deep: RecursionError out of gguf's reader
    "nested_arrays": gguf_bytes([ARCH, gstr("x") + struct.pack("<I", ARRAY) + struct.pack("<IQ", ARRAY, 1) * 5000]),
    # a string of 2**63 bytes: read as "the rest of the file", and the file was accepted
    "string_length_2_63": gguf_bytes([ARCH, gstr("general.name") + struct.pack("<IQ", STRING, 2**63) + b"abc"]),
    # more items than a Qwen2 file holds (each costs gguf's reader ~1.3 kB and 20 µs): 700 MB for a 0.5 MB file
    "array_of_half_a_million_items": gguf_bytes([ARCH, gstr("x") + struct.pack("<IIQ", ARRAY, UINT8, (1 << 19) + 1)
                                                 + b"\0" * ((1 << 19) + 1)]),
    # already refused before (kept as guards): dims whose product wraps uint64, an unknown value type, data past EOF
    "dims_product_wraps": gguf_bytes([ARCH], gstr("w") + struct.pack("<IQQIQ", 2, 2**62 + 1, 4, 0, 0) + b"\0" * 64, 1),
    "unknown_value_type": gguf_bytes([ARCH, gstr("x") + struct.pack("<I", 77) + b"\0" * 8]),
    "tensor_offset_past_eof": gguf_bytes([ARCH], gstr("w") + struct.pack("<IQIQ", 1, 16, 0, 2**40) + b"\0" * 64, 1),
    "tensor_count_2_60": gguf_bytes([ARCH], b"\0" * 64, 2**60),
}
CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from models.errors import ModelError
from models.gguf_file import inspect_gguf
try:
    inspect_gguf(sys.argv[1])
    print("ACCEPTED")
except ModelError as err:
    print("REFUSED", type(err).__name__, err)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_AS bounds the child's memory")
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_gguf_headers_are_refused_at_once(tmp_path, case):
    """In a child process with 3 GB of address space and a minute: a regression hangs or dies there, not here."""
    path = tmp_path / f"{case}.gguf"
    path.write_bytes(HOSTILE[case])
    try:
        out = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, cwd=ROOT,
                             timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{case}: inspecting the file did not finish in a minute")
    assert out.stdout.startswith("REFUSED CorruptModelFile"), (out.stdout, out.stderr[-2000:])


def tiny_gguf(path: Path, *, hyper: dict | None = None, drop: tuple[str, ...] = ()) -> tuple[Path, object]:
    """The tiny random Qwen2 (tests/tiny.py) and its tokenizer as a GGUF file, as llama.cpp names its tensors;
    `hyper` overrides (or, None values, removes) the qwen2.* hyperparameters, `drop` leaves tensors out."""
    import gguf

    from tests.tiny import make_model, make_tokenizer

    tok = make_tokenizer()
    tokens = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    merges = [" ".join(m) for m in json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]]
    model = make_model(len(tokens))
    c = model.config
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name("tiny")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t.startswith("<|") else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_eos_token_id(tok.convert_tokens_to_ids("<|im_end|>"))
    w.add_bos_token_id(0)
    values = {"context_length": 512, "embedding_length": c.hidden_size, "block_count": c.num_hidden_layers,
              "feed_forward_length": c.intermediate_size, "attention.head_count": c.num_attention_heads,
              "attention.head_count_kv": c.num_key_value_heads} | (hyper or {})
    for key, value in values.items():
        if value is not None:
            w.add_uint32(f"qwen2.{key}", value)
    w.add_float32("qwen2.attention.layer_norm_rms_epsilon", c.rms_norm_eps)
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    for key, value in model.state_dict().items():
        if key.startswith("model.layers."):
            _, _, i, *rest = key.split(".")
            name = f"blk.{i}.{names['.'.join(rest[:-1])]}.{rest[-1]}"
        else:
            name = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                    "lm_head.weight": "output.weight"}[key]
        if name not in drop:
            w.add_tensor(name, value.float().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, model


def test_a_consistent_qwen2_gguf_converts_to_the_same_weights(tmp_path):
    import torch
    from safetensors.torch import load_file

    from models.convert import convert_gguf

    path, model = tiny_gguf(tmp_path / "tiny.gguf")
    out = convert_gguf(path, tmp_path / "hf")
    state = load_file(out / "model.safetensors")
    assert state.keys() == model.state_dict().keys()
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("hyper, drop, match", [
    ({"block_count": 64}, (), "describes"),  # 64 layers declared, 2 held: transformers allocated the other 62
    ({}, ("blk.1.ffn_up.weight",), "describes"),  # a tensor missing: initialized at random and kept
    ({key: None for key in ("embedding_length", "block_count", "feed_forward_length", "attention.head_count")}, (),
     "qwen2.embedding_length"),  # no hyperparameters: transformers filled in a 7B's (30 GB in float32)
])
def test_hyperparameters_describing_more_than_the_file_holds_are_refused_before_allocating(
        tmp_path, monkeypatch, hyper, drop, match):
    import transformers

    from models.convert import convert_gguf

    path, _ = tiny_gguf(tmp_path / "lying.gguf", hyper=hyper, drop=drop)
    built = []

    def from_pretrained(*args, **kwargs):
        built.append(kwargs)
        raise RuntimeError("the model was built")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    with pytest.raises(CorruptModelFile, match=match):
        convert_gguf(path, tmp_path / "hf")
    assert built == [] and not (tmp_path / "hf").exists()


def test_a_gguf_that_does_not_fit_on_the_disk_is_refused_before_converting(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    import transformers

    from models.convert import convert_gguf
    from models.errors import DiskFull

    path, _ = tiny_gguf(tmp_path / "tiny.gguf")
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**12, 10**12 - 10**6, 10**6))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("built"))
    with pytest.raises(DiskFull, match="GiB free"):
        convert_gguf(path, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("model_id, hidden, layers, heads, kv_heads, inter", [
    ("qwen2.5-coder-0.5b-instruct", 896, 24, 14, 2, 4864),
    ("qwen2.5-coder-1.5b-instruct", 1536, 28, 12, 2, 8960),
    ("qwen2.5-7b-instruct", 3584, 28, 28, 4, 18944),  # its own output head
])
def test_the_size_check_counts_real_qwen2_models_exactly(model_id, hidden, layers, heads, kv_heads, inter):
    """The parameters a header's hyperparameters declare are the registry's counts of the real models: a real GGUF,
    whose tensors hold exactly that many weights, passes."""
    from models.gguf_header import GgufHeader, TensorInfo, declared_params
    from models.registry import KNOWN_MODELS

    spec = KNOWN_MODELS[model_id]
    fields = {"qwen2.embedding_length": hidden, "qwen2.block_count": layers, "qwen2.attention.head_count": heads,
              "qwen2.attention.head_count_kv": kv_heads, "qwen2.feed_forward_length": inter,
              "tokenizer.ggml.tokens": spec.vocab_size}
    head = [TensorInfo("output.weight", (hidden, spec.vocab_size), 0, 0, 0, 0)] if "coder" not in model_id else []
    assert declared_params(GgufHeader(fields, head), "real.gguf") == spec.params
