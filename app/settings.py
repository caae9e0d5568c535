"""The user's preferences (defaults for new messages, sampling, threads, theme, model) and their persistence
in the chat store's settings table. No Qt: the settings dialog edits an `AppSettings`, the window applies it.

Values read back are validated field by field: a bad or unknown stored value falls back to its default
rather than stopping the app from starting.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace

from core.config import DECODE_MODES, SamplingConfig
from models.errors import InvalidModelId
from models.registry import DEFAULT_MODEL_ID, default_budget, validate_model_id

MODES = ("auto", "reason", "base")
THEMES = ("system", "light", "dark")
BUDGET_CHOICES = (0, 128, 256, 512, 1024, None)
"""0: the loaded model's own default budget (models.registry.default_budget, chosen on dev)."""
FONT_SIZES = (8, 32)
"""Smallest and largest transcript/composer font size, in points."""
SETTINGS_KEY = "app_settings"
DECODE_MEASURED = {  # `ponder bench sparse` on the embedded 0.5B (README: Efficient decode), one run on a 2-core AMD EPYC:
    # decode tok/s as a multiple of dense, and GSM8K test accuracy in Reason mode (budget 256, n = 300)
    "dense": (1.00, 0.273),
    "griffin": (1.34, 0.023),
    "griffin+caprese": (1.02, 0.030),
    "cats": (0.96, 0.153),
    "cats+caprese": (0.85, 0.167),
}
REASONING_MEASURED = {  # GSM8K test in Reason mode, greedy, each model's shipped adapter (README: Reasoning results):
    # model -> {thinking budget: (accuracy, share of traces cut at the budget, questions)}
    "qwen2.5-coder-0.5b-instruct": {512: (0.293, 0.037, 300)},  # distilled from the 1.5B since 2026-12-04
    "qwen2.5-coder-1.5b-instruct": {512: (0.570, 0.02, 300)},  # on W4-FPT, its weights since 2026-12-04
}


def composer_budget(settings: AppSettings, model_id: str) -> int | None:
    """The budget a new message starts with on `model_id`: the preference, or the model's own when it is 0."""
    return default_budget(model_id) if settings.budget == 0 else settings.budget


def budget_note(model_id: str) -> str:
    """What each thinking budget measured with `model_id`'s shipped reasoning adapter; "" when nothing was."""
    measured = REASONING_MEASURED.get(model_id)
    if not measured:
        return ""
    parts = ", ".join(f"{budget} → {accuracy:.1%} ({cut:.0%} cut)"
                      for budget, (accuracy, cut, _) in sorted(measured.items()))
    n = max(n for _, _, n in measured.values())
    return f"Measured with this model's shipped adapter (GSM8K test, greedy, n = {n}): {parts}."


_DECODE_TEXT = {  # setting -> (label, what it does)
    "dense": ("Dense (every neuron; recommended)", "Every feed-forward neuron on every token: the reference, and the "
              "best trade-off on the embedded model."),
    "griffin": ("GRIFFIN (half the feed-forward)",
                "Each prompt picks the half of each layer's feed-forward neurons it uses most; answers then read "
                "less memory per token, but a short prompt does not predict what a math answer needs. On the 1.5B "
                "at 70% kept: 1.25× dense decode speed, GSM8K dev 12.5% against dense 62.5% (25.0% re-picking the "
                "neurons every 8 tokens; 53.1% even when they are picked with hindsight), so dense stays the "
                "default."),
    "griffin+caprese": ("GRIFFIN + Caprese",
                        "GRIFFIN plus small low-rank branches trained to give back what the cut drops (folded into "
                        "the cut weights)."),
    "cats": ("CATS (threshold weak activations)",
             "Zeroes each token's weakest feed-forward activations. No faster here (the CPU kernels read every "
             "weight): offered to compare accuracy."),
    "cats+caprese": ("CATS + Caprese", "CATS plus low-rank branches trained to give back what it drops."),
}


def decode_note(mode: str) -> str:
    """The settings dialog's line for a decode mode: what it does and what it measured on the embedded model."""
    speed, accuracy = DECODE_MEASURED[mode]
    if mode == "dense":
        return f"{_DECODE_TEXT[mode][1]} Embedded 0.5B: GSM8K {accuracy:.1%} in Reason mode."
    dense = DECODE_MEASURED["dense"][1]
    return (f"{_DECODE_TEXT[mode][1]} Embedded 0.5B: {speed:.2f}× dense decode speed, GSM8K {accuracy:.1%} "
            f"(dense {dense:.1%}).")


DECODE_CHOICES = {mode: (label, decode_note(mode)) for mode, (label, _) in _DECODE_TEXT.items()}
"""setting -> (label, the explanation with measured figures that the settings dialog shows)"""


@dataclass(frozen=True)
class AppSettings:
    mode: str = "auto"
    """Reasoning mode a new message starts with: auto (the switcher decides), reason or base ("Fast")."""
    budget: int | None = 0
    """Default thinking budget in tokens (None = unlimited, 0 = the loaded model's own, chosen on dev)."""
    parallel: int = 1
    """Default number of parallel answers (1-8)."""
    temperature: float = 0.3
    """Sampling temperature for a single answer (0 = greedy)."""
    parallel_temperature: float = 0.7
    """Sampling temperature when several answers are sampled and voted on (diversity matters there)."""
    top_p: float = 0.9
    top_k: int = 40
    repetition_penalty: float = 1.05
    answer_max_tokens: int = 512
    """Cap on the answer after the thinking trace (and on direct answers)."""
    threads: int = 0
    """Compute threads for the model (0 = automatic: the physical cores)."""
    theme: str = "system"
    """'system' follows the OS light/dark setting; 'light' or 'dark' force one."""
    model_id: str = DEFAULT_MODEL_ID
    """The model loaded at start."""
    serve: bool = False
    """Serve the OpenAI API on 127.0.0.1:`serve_port` while the window is open (sharing its engine)."""
    serve_port: int = 8080
    reasoning_adapters: dict[str, str] = field(default_factory=dict)
    """Model id -> name of the adapter-library adapter it reasons with (a model not listed uses its own
    reasoning component, the shipped one, or none)."""
    font_size: int = 11
    """Point size of the transcript and the composer (View ▸ Bigger / Smaller text, Ctrl+= / Ctrl+− / Ctrl+0)."""
    enter_sends: bool = False
    """Enter sends the message (Shift+Enter: a new line); off: Enter is a new line. Ctrl+Enter always sends."""
    decode: str = "dense"
    """Efficient decode: 'dense', 'griffin' (each prompt keeps half the feed-forward neurons) or
    'griffin+caprese' (plus the model's low-rank recovery branches); core.sparse.ff, core.sparse.caprese."""

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        if self.budget not in BUDGET_CHOICES:
            raise ValueError(f"budget must be one of {BUDGET_CHOICES}")
        if not 1 <= self.parallel <= 8:
            raise ValueError("parallel answers must be between 1 and 8")
        if self.theme not in THEMES:
            raise ValueError(f"theme must be one of {THEMES}")
        if not 0 <= self.threads <= 256:
            raise ValueError("threads must be between 0 (automatic) and 256")
        if not isinstance(self.serve, bool):
            raise ValueError("serve must be true or false")
        if self.decode not in DECODE_MODES:
            raise ValueError(f"decode must be one of {DECODE_MODES}")
        if not isinstance(self.enter_sends, bool):
            raise ValueError("enter_sends must be true or false")
        if (isinstance(self.font_size, bool) or not isinstance(self.font_size, int)
                or not FONT_SIZES[0] <= self.font_size <= FONT_SIZES[1]):
            raise ValueError(f"the font size must be between {FONT_SIZES[0]} and {FONT_SIZES[1]} points")
        if isinstance(self.serve_port, bool) or not isinstance(self.serve_port, int) or not 1024 <= self.serve_port <= 65535:
            raise ValueError("the server port must be between 1024 and 65535")
        if not 16 <= self.answer_max_tokens <= 8192:
            raise ValueError("the answer cap must be between 16 and 8192 tokens")
        for t in (self.temperature, self.parallel_temperature):
            if not 0 <= t <= 2:
                raise ValueError("temperature must be between 0 and 2")
        if not isinstance(self.reasoning_adapters, dict):
            raise ValueError("reasoning adapters must be a mapping of model id to adapter name")
        for model_id, name in self.reasoning_adapters.items():
            _checked_name(model_id)
            _checked_name(name)  # adapter names follow the model id rules
        self.sampling(1)  # top_p / top_k / repetition penalty checked by SamplingConfig itself

    def sampling(self, parallel: int) -> SamplingConfig:
        """The sampling settings for a request with `parallel` answers."""
        return SamplingConfig(temperature=self.parallel_temperature if parallel > 1 else self.temperature,
                              top_p=self.top_p, top_k=self.top_k, repetition_penalty=self.repetition_penalty,
                              max_tokens=self.answer_max_tokens)


def from_dict(data: dict | None) -> AppSettings:
    """Stored values that are valid, defaults for the rest."""
    settings = AppSettings()
    if not isinstance(data, dict):
        return settings
    known = {f.name for f in fields(AppSettings)}
    for key, value in data.items():
        if key not in known:
            continue
        if key == "reasoning_adapters":
            value = valid_adapters(value)
        try:
            settings = replace(settings, **{key: value})
        except (TypeError, ValueError):
            continue
    return settings


def valid_adapters(value) -> dict[str, str]:
    """The entries of a stored model -> reasoning adapter mapping that are valid (bad ones dropped)."""
    out: dict[str, str] = {}
    for model_id, name in (value.items() if isinstance(value, dict) else ()):
        try:
            out[_checked_name(model_id)] = _checked_name(name)
        except ValueError:
            continue
    return out


def _checked_name(name) -> str:
    try:
        return validate_model_id(name)
    except InvalidModelId as err:
        raise ValueError(str(err)) from None


def with_reasoning_adapter(settings: AppSettings, model_id: str, name: str | None) -> AppSettings:
    """`settings` with `model_id` reasoning with adapter `name` (None: back to the model's own)."""
    chosen = {k: v for k, v in settings.reasoning_adapters.items() if k != model_id}
    if name is not None:
        chosen[model_id] = name
    return replace(settings, reasoning_adapters=chosen)


def load_settings(store) -> AppSettings:
    return from_dict(store.get_setting(SETTINGS_KEY))


def save_settings(store, settings: AppSettings) -> None:
    store.set_setting(SETTINGS_KEY, asdict(settings))


CHAT_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "repetition_penalty", "answer_max_tokens")
"""What a chat may override of the global sampling settings (its other requests follow the preferences)."""


def chat_sampling(values: dict | None, *, strict: bool = True) -> dict:
    """A chat's sampling overrides, each checked as the preferences are (temperature 0-2, top_p in (0, 1], ...).

    strict: a bad or unknown entry raises ValueError (what the chat settings dialog shows); otherwise it is
    dropped (values read back from the store)."""
    out: dict = {}
    for key, value in (values or {}).items():
        try:
            if key not in CHAT_SAMPLING_KEYS:
                raise ValueError(f"{key!r} is not a per-chat sampling setting ({', '.join(CHAT_SAMPLING_KEYS)})")
            whole = key in ("top_k", "answer_max_tokens")
            if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)):
                raise ValueError(f"{key} must be a {'whole ' if whole else ''}number")
            value = value if whole else float(value)
            replace(AppSettings(), **{key: value})  # the preferences' own checks
            out[key] = value
        except ValueError:
            if strict:
                raise
    return out
