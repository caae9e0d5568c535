"""Configuration dataclasses: one docstring per field, validation in `__post_init__`."""
from __future__ import annotations

from dataclasses import dataclass, field

from models.quantization import GROUP_SIZE, GROUP_SIZES, PRECISIONS
from models.registry import DEFAULT_MODEL_ID, default_precision

KV_FORMATS = ("bf16", "int8")
DECODE_MODES = ("dense", "griffin", "griffin+caprese", "cats", "cats+caprese")
"""Decode-step feed-forward: dense; GRIFFIN's per-prompt neuron selection (core.sparse.ff); CATS's per-layer
activation threshold (core.sparse.cats); either with Caprese's low-rank branches (core.sparse.caprese) giving back what the
sparsity drops."""


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is picked and when generation stops."""

    temperature: float = 0.7
    """0 means greedy (argmax), deterministic."""
    top_p: float = 0.9
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p (1 = off)."""
    top_k: int = 40
    """Keep only the k most likely tokens (0 = off)."""
    repetition_penalty: float = 1.05
    """>1 discourages tokens already in the prompt or output (1 = off)."""
    max_tokens: int = 512
    """Upper bound on generated tokens."""
    seed: int | None = None
    """Seed for this request's own torch.Generator; None draws a fresh one."""
    stop: tuple[str, ...] = field(default_factory=tuple)
    """Strings that end the answer; the matched text is not part of it."""
    ignore_eos: bool = False
    """Keep going past end-of-turn tokens (benchmarks only)."""

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")
        if self.repetition_penalty <= 0:
            raise ValueError("repetition_penalty must be > 0")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        object.__setattr__(self, "stop", tuple(s for s in self.stop if s))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class EngineConfig:
    """Which model the engine loads and how."""

    model_id: str = DEFAULT_MODEL_ID
    """Store name of the model (see `ponder models`)."""
    precision: str | None = None
    """Weights: fp32, bf16, w8 (int8), w4 (int4, group 128, rounded to nearest) or w4-fpt (int4 after the
    FPTQuant° transforms and GPTQ rounding: same size and kernels as w4, closer to bf16); activations are bf16
    except fp32. None = the model's default (`models.registry.default_precision`: w4-fpt for the embedded 0.5B)."""
    kv: str = "int8"
    """KV cache: bf16, or int8 with one scale per token and head."""
    head_bits: int = 4
    """Bits of the quantized LM head (4 or 8) when precision is w4/w8."""
    group_size: int = GROUP_SIZE
    """Inputs sharing one int4 scale and zero point (32, 64, 128 or 256): smaller is closer to bf16, a little
    slower (see bench.quant_fidelity)."""
    threads: int | None = None
    """Torch CPU threads; None = number of physical cores."""
    context: int = 8192
    """Maximum tokens of prompt plus answer."""
    reasoning_adapter: str | None = None
    """Name of the reasoning adapter in the adapter library; None = the user's component or the shipped one."""
    decode: str = "dense"
    """Feed-forward of decode steps: 'dense'; 'griffin' (GRIFFIN: the prompt picks the `ff_keep` share of each
    layer's neurons with the strongest activations, and decoding runs only those; core.sparse.ff); 'cats' (the
    model's calibrated thresholds zero weak activations; core.sparse.cats); '…+caprese' (plus the model's Caprese
    branches for that sparsity, at the share they were fitted for; core.sparse.caprese)."""
    ff_keep: float = 0.5
    """Share of feed-forward neurons GRIFFIN keeps (0 < ff_keep <= 1)."""
    ff_reselect: int = 0
    """GRIFFIN: every this many decode steps one runs dense and the answer's activations re-pick the neurons
    (0: the prompt's choice holds; core.sparse.reselect)."""
    ff_decay: float = 1.0
    """GRIFFIN reselection: the factor on the earlier scores at each reselection (0 < ff_decay <= 1)."""
    prompt_cache_tokens: int = 4096
    """Prompt tokens whose keys and values are kept for prompts that start the same (core.decode.prompt_cache);
    0 turns prompt caching off (benchmarks that repeat one prompt)."""

    def __post_init__(self):
        if self.precision is None:
            object.__setattr__(self, "precision", default_precision(self.model_id))
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}")
        if self.kv not in KV_FORMATS:
            raise ValueError(f"kv must be one of {KV_FORMATS}")
        if self.head_bits not in (4, 8):
            raise ValueError("head_bits must be 4 or 8")
        if self.group_size not in GROUP_SIZES:
            raise ValueError(f"group_size must be one of {GROUP_SIZES}")
        if self.decode not in DECODE_MODES:
            raise ValueError(f"decode must be one of {DECODE_MODES}")
        if not 0 < self.ff_keep <= 1:
            raise ValueError("ff_keep must be in (0, 1]")
        if self.ff_reselect < 0 or self.ff_reselect == 1:
            raise ValueError("ff_reselect must be 0 (off) or 2 or more")
        if not 0 < self.ff_decay <= 1:
            raise ValueError("ff_decay must be in (0, 1]")
        if self.precision == "fp32" and self.kv == "int8":
            object.__setattr__(self, "kv", "bf16")


@dataclass(frozen=True)
class SftArgs:
    """Adapter SFT (two-pass masked LoRA on the quantized base): reasoning or skill adapters."""

    data: tuple[str, ...] = ()
    """Training files: GSM8K/MATH/trace JSONL (reasoning), or any `core.data.train` format (skill)."""
    out: str = ""
    """Folder the adapter is saved to (peft safetensors + ponder_adapter.json + train_log.jsonl)."""
    name: str = ""
    """Save into the adapter library under this name (after a before/after evaluation) instead of `out`."""
    kind: str = "reasoning"
    """'reasoning' (thinking trace then a boxed answer) or 'skill' (the reply to a chat)."""
    preset: str = ""
    """'quick', 'balanced' or 'thorough' (SFT_PRESETS): defaults for steps, rank, lr, max tokens."""
    held_out: float = 0.0
    """Fraction of the records kept out of training for the before/after evaluation."""
    max_tokens: int = 1024
    """Longest record (prompt + response tokens) the validated data may hold."""
    csv_columns: tuple[str, str] | None = None
    """CSV column names (prompt, response); default 'prompt' and 'response'."""
    eval_examples: int = 8
    eval_tokens: int = 64
    """Held-out records evaluated, and the greedy answer length each gets."""
    checkpoint_every: int = 8
    """Steps between resumable checkpoints in the run folder."""
    model_id: str = DEFAULT_MODEL_ID
    precision: str | None = None
    """Base the adapter is trained on and served with (QAMR: train on the quantized base); None = the model's
    default weights, the ones the app serves it on."""
    examples: int = 256
    """How many training examples to draw (shuffled, short traces first kept)."""
    steps: int = 32
    """Optimizer steps."""
    grad_accum: int = 8
    """Examples per optimizer step."""
    rank: int = 16
    alpha: int = 32
    dropout: float = 0.05
    lr: float = 2e-4
    warmup_ratio: float = 0.1
    max_response_tokens: int = 320
    max_thinking_chars: int = 900
    """`--out` runs on GSM8K/MATH trace rows: traces longer than this many characters are skipped before
    drawing (900, about 240 tokens, suits the 0.5B; the 1.5B's own right traces at budget 512 run longer)."""
    seed: int = 0
    threads: int | None = None
    init_adapter: str | None = None
    """Continue training this saved adapter (same base) instead of starting from a fresh one."""

    def __post_init__(self):
        if not self.data:
            raise ValueError("give at least one training file")
        if self.steps < 1 or self.grad_accum < 1 or self.examples < 1:
            raise ValueError("steps, grad_accum and examples must be >= 1")
        if self.precision is None:
            object.__setattr__(self, "precision", default_precision(self.model_id))
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}")
        if not 0 < self.lr < 1:
            raise ValueError("lr must be in (0, 1)")
        if self.kind not in ("reasoning", "skill"):
            raise ValueError("kind must be 'reasoning' or 'skill'")
        if self.preset and self.preset not in SFT_PRESETS:
            raise ValueError(f"preset must be one of {tuple(SFT_PRESETS)}")
        if not 0 <= self.held_out < 1:
            raise ValueError("held_out must be in [0, 1)")
        if self.max_tokens < 8 or self.checkpoint_every < 1:
            raise ValueError("max_tokens must be >= 8 and checkpoint_every >= 1")


SFT_PRESETS: dict[str, dict] = {
    # Quick: a few minutes of training for the 0.5B on 2 cores (80 examples of <= 256 tokens: about 2–3 s each
    # on an idle 2-core EPYC); 24 single-example steps at 3e-4 left a skill barely visible in the answers.
    "quick": {"steps": 40, "grad_accum": 2, "rank": 8, "alpha": 16, "lr": 5e-4, "max_tokens": 256,
              "eval_examples": 4, "eval_tokens": 96, "checkpoint_every": 8},
    "balanced": {"steps": 80, "grad_accum": 4, "rank": 16, "alpha": 32, "lr": 2e-4, "max_tokens": 512,
                 "eval_examples": 8, "eval_tokens": 96, "checkpoint_every": 10},
    "thorough": {"steps": 150, "grad_accum": 4, "rank": 16, "alpha": 32, "lr": 1e-4, "max_tokens": 1024,
                 "eval_examples": 16, "eval_tokens": 160, "checkpoint_every": 10},
}
"""Recipe presets: values an explicit flag does not override."""
