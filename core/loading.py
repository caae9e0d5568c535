"""Loading an installed model at a precision into an Engine; the only code that knows weight formats.

bf16/fp32 load the store's safetensors folder directly. w4/w8 are quantized with optimum-quanto the first
time and saved next to it (`w4-h4/`, ...); later launches restore that folder without re-quantizing.
Always safetensors, always `trust_remote_code=False`.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import psutil
import torch

from core.adapters import lora as adapters
from core.adapters.cards import AdapterError
from core.adapters.library import AdapterLibrary
from core.config import EngineConfig
from core.decode.prompt_cache import PromptCache
from core.engine import Engine
from core.memory import settle_heap
from core.reasoning.router import Router
from core.reasoning.verifier import Verifier
from core.sparse import caprese, cats
from core.storage.model_store import InstalledModel, ModelStore
from core.storage.paths import resource_dir
from models.convert import AtomicDir
from models.errors import CorruptModelFile, DiskFull
from models.fpt import fpt_of, transform_head
from models.fpt_calibration import quantize_w4_fpt
from models.quantization import GROUP_SIZE, quantize_model
from models.quantized_files import load_quantized, quant_info, save_quantized

log = logging.getLogger(__name__)
Progress = Callable[[str, int, int], None]


def set_threads(threads: int | None) -> int:
    n = threads or psutil.cpu_count(logical=False) or 2
    torch.set_num_threads(n)
    return n


def load_tokenizer(hf_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=False)


def load_plain(hf_dir: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(
            hf_dir, dtype=dtype, trust_remote_code=False, use_safetensors=True, attn_implementation="sdpa"
        ).eval()
    except (OSError, ValueError, RuntimeError) as err:
        raise CorruptModelFile(f"Could not load the weights in {hf_dir} ({err}).") from err


def quantized_dir(model: InstalledModel, precision: str, head_bits: int, group_size: int = GROUP_SIZE) -> Path:
    """w4-h4, w8-h8, w4-fpt-h4, …; an int4 group size other than the default is part of the name (w4-h4-g32)."""
    suffix = f"-g{group_size}" if precision.startswith("w4") and group_size != GROUP_SIZE else ""
    return model.folder / f"{precision}-h{head_bits}{suffix}"


PRECISION_LABELS = {"fp32": "fp32", "bf16": "bf16", "w8": "W8", "w4": "W4", "w4-fpt": "W4-FPT"}
PRECISION_DETAILS = {
    "fp32": "full precision", "bf16": "16-bit weights, no quantization",
    "w8": "int8 weights, one scale per output channel",
    "w4": "int4 weights rounded to nearest (one scale and zero point per group of inputs)",
    "w4-fpt": "int4 weights after function-preserving transforms (FPTQuant°) and error-compensating (GPTQ) "
              "rounding: closer to bf16 than plain W4 at the same size and speed (bench/results/quant_*.md)",
}


def weights_status(model: InstalledModel, cfg: EngineConfig) -> tuple[str, str]:
    """(short label, one-line detail) of the weights `cfg` runs `model` on, and whether they are prepared."""
    label = PRECISION_LABELS[cfg.precision]
    if cfg.precision.startswith("w") and cfg.group_size != GROUP_SIZE:
        label += f" g{cfg.group_size}"
    detail = PRECISION_DETAILS[cfg.precision]
    if cfg.precision.startswith("w") and quant_info(quantized_dir(model, cfg.precision, cfg.head_bits,
                                                                  cfg.group_size)) is None:
        return f"{label} (prepared at first use)", detail + "; quantized once when the model is first loaded"
    return label, detail


def load_model(model: InstalledModel, cfg: EngineConfig, progress: Progress | None = None, rebuild: bool = False,
               warnings: list[str] | None = None):
    """The torch model for `cfg.precision`, quantizing and saving it the first time (or again with `rebuild`).
    With `warnings` (user-visible), a disk too full to save the prepared weights is not fatal: the quantized model
    is used from memory and a note is added; without it (`ponder quantize`), DiskFull is raised."""
    if cfg.precision in ("fp32", "bf16"):
        return load_plain(model.hf_dir, torch.float32 if cfg.precision == "fp32" else torch.bfloat16)
    bits = 8 if cfg.precision == "w8" else 4
    qdir = quantized_dir(model, cfg.precision, cfg.head_bits, cfg.group_size)
    if quant_info(qdir) is not None and not rebuild and cfg.precision == "w4-fpt" and _outdated_fpt(model, qdir):
        log.warning("%s was prepared with other transforms than the ones shipped now; preparing it again", qdir)
        rebuild = True
    if quant_info(qdir) is not None and not rebuild:
        try:
            return load_quantized(qdir)
        except Exception as err:  # a damaged cache is rebuilt from the bf16 weights, never fatal
            log.warning("quantized cache %s unreadable (%s); re-quantizing", qdir, err)
    if progress:
        progress("quantize", 0, 1)
    plain = load_plain(model.hf_dir, torch.bfloat16)
    if cfg.precision == "w4-fpt":
        qmodel = quantize_w4_fpt(plain, calibration_batches(model.hf_dir), cfg.head_bits, cfg.group_size,
                                 report=progress and (lambda done, total: progress("quantize", done, total)),
                                 spec=shipped_fpt_spec(model), gptq_tokens=GPTQ_TOKENS)
    else:
        qmodel = quantize_model(plain, bits, cfg.head_bits, cfg.group_size)
    try:
        with AtomicDir(qdir) as tmp:
            save_quantized(qmodel, tmp, bits, cfg.head_bits, cfg.group_size)
    except DiskFull as err:
        if warnings is None:
            raise
        log.warning("%s", err)
        warnings.append(f"The prepared {PRECISION_LABELS[cfg.precision]} weights could not be saved: the disk is "
                        "full. They are used from memory now and will be prepared again next time; free some disk "
                        "space to keep them.")
    if progress:
        progress("quantize", 1, 1)
    return qmodel


def _outdated_fpt(model: InstalledModel, qdir: Path) -> bool:
    """Whether the W4-FPT weights in `qdir` were made with other transforms than the spec shipped for this model
    (a release that ships better ones): they are prepared again, once. Weights calibrated here are kept."""
    from models.fpt import FptSpec

    shipped = shipped_fpt_spec(model)
    if shipped is None:
        return False
    try:
        cached = FptSpec.load(qdir)
    except Exception:  # unreadable: the load below rebuilds it anyway
        return False
    return cached is None or not shipped.same_transforms(cached)


def source_sha256(model: InstalledModel) -> str | None:
    """The sha256 of the file the installed weights were converted from (a pinned GGUF), if the store knows it."""
    import json

    try:
        return json.loads((model.folder / "manifest.json").read_text()).get("gguf_sha256")
    except (OSError, ValueError):
        return None


def shipped_fpt_spec(model: InstalledModel):
    """The FPTQuant° transforms fitted once for exactly these base weights and shipped in resources/fpt/<id>/
    (provenance in its `provenance.json`); None where the weights are others, so they are calibrated here."""
    import json

    from models.fpt import FptSpec

    folder = resource_dir() / "fpt" / model.id
    try:
        pinned = json.loads((folder / "provenance.json").read_text())["base_sha256"]
    except (OSError, ValueError, KeyError):
        return None
    if pinned != source_sha256(model):
        return None
    try:
        return FptSpec.load(folder)
    except Exception as err:  # a damaged resource: calibrate instead, never fatal
        log.warning("shipped FPTQuant spec in %s unreadable (%s); calibrating instead", folder, err)
        return None


CALIBRATION_FILE = "fpt_calibration.jsonl"
CALIBRATION_TOKENS = 512
GPTQ_TOKENS = 192
"""GPTQ's Hessians see the first 192 tokens of each of the 64 texts (11,140 tokens, 62% of them): on the 0.5B
that measured closer to the float model than all of each text (KL 0.0539 against 0.0578 nats, top-1 0.910
against 0.907, perplexity 5.395 against 5.378 on the held text of `ponder bench quant`), and first-launch
preparation pays for every token (README: Set up)."""


def calibration_batches(hf_dir: Path) -> list[torch.Tensor]:
    """Token ids of the shipped calibration texts (GSM8K and MATH *train* problems with their solutions, MIT),
    each cut at CALIBRATION_TOKENS: what the FPTQuant° scales are fitted on."""
    import json

    tokenizer = load_tokenizer(hf_dir)
    lines = (resource_dir() / "calibration" / CALIBRATION_FILE).read_text().splitlines()
    texts = [json.loads(line)["text"] for line in lines if line.strip()]
    return [torch.tensor(tokenizer(t)["input_ids"][:CALIBRATION_TOKENS]) for t in texts]


def component_dirs(installed: InstalledModel, kind: str) -> list[Path]:
    """Folders holding a component of this kind, best first: the user's (model folder), then the shipped one."""
    found = []
    for base in (installed.folder / "components", resource_dir() / "components" / installed.id):
        folder = base / kind
        if any((folder / f).is_file() for f in ("adapter_model.safetensors", "head.json", "caprese.safetensors",
                                                "cats.json")):
            found.append(folder)
    return found


def load_component(installed: InstalledModel, kind: str, load: Callable[[Path], object], warnings: list[str],
                   label: str | None = None):
    """The first of the component's folders that loads; a damaged or mismatched one is skipped with a warning in
    `warnings` (user-visible) and the log, falling back to the shipped one, else to none."""
    dirs = component_dirs(installed, kind)
    for i, folder in enumerate(dirs):
        try:
            return load(folder)
        except Exception as err:  # corrupt JSON/safetensors, wrong shapes, other base weights: never fatal
            label = label or kind
            fallback = "the shipped one" if i + 1 < len(dirs) else f"no {label}"
            msg = f"The {label} in {folder} could not be loaded ({type(err).__name__}: {err}); using {fallback}."
            log.warning("%s", msg)
            warnings.append(msg)
    return None


def _reasoning_cards(installed: InstalledModel, store: ModelStore, wanted: str | None, warnings: list[str]):
    """The reasoning adapters to try, best first: the library's `wanted` one, then the user's component folder,
    then the shipped one (the library lists both as built-in)."""
    library = AdapterLibrary(store=store)
    cards = [c for c in library.list(installed.id, kind="reasoning") if c.builtin]
    if wanted is None:
        return cards
    try:
        return [library.get(installed.id, wanted)] + [c for c in cards if c.name != wanted]
    except (AdapterError, OSError) as err:
        fallback = "the built-in one" if cards else "no reasoning adapter"
        msg = f"The reasoning adapter '{wanted}' could not be loaded ({err}); using {fallback}."
        log.warning("%s", msg)
        warnings.append(msg)
        return cards


def other_weights_note(label: str, trained_on: str | None, serving: str, validated=()) -> str | None:
    """A user-visible note when a component was trained on other weights than the model runs on: an adapter or
    head fits the hidden states of the weights it was trained on (W4 and W4-FPT states differ enough to matter).
    `validated`: weights it was measured on since and kept for (an adapter's `validated_on`), no note there."""
    if not trained_on or trained_on == serving or trained_on not in PRECISION_LABELS or serving in validated:
        return None
    return (f"The {label} was trained on {PRECISION_LABELS[trained_on]} weights and this model runs on "
            f"{PRECISION_LABELS[serving]}: it may work less well (retrain it on these weights, or run the model "
            f"with --precision {trained_on}).")


def attach_reasoning(engine: Engine, cards, warnings: list[str]) -> None:
    """Make the first of `cards` that loads the engine's reasoning adapter; a damaged or mismatched one is
    skipped with a warning (user-visible) and the log, falling back to the next, else to none."""
    for i, card in enumerate(cards):
        try:
            meta = adapters.adapter_meta(card.folder)  # a damaged card is a damaged adapter
            engine.use_reasoning_adapter(card)
            note = other_weights_note("reasoning adapter", meta.get("base_precision"), engine.precision,
                                      meta.get("validated_on") or {})
            if note:
                warnings.append(note)
            return
        except Exception as err:  # corrupt JSON/safetensors, wrong shapes, other base weights: never fatal
            rest = cards[i + 1:]
            fallback = ("no reasoning adapter" if not rest else "the shipped one"
                        if rest[0].builtin and rest[0].folder.is_relative_to(resource_dir()) else f"'{rest[0].name}'")
            msg = (f"The reasoning adapter in {card.folder} could not be loaded ({type(err).__name__}: {err}); "
                   f"using {fallback}.")
            log.warning("%s", msg)
            warnings.append(msg)


def attach_sparse_parts(engine: Engine, installed: InstalledModel, warnings: list[str]) -> None:
    """The model's CATS calibration and Caprese branches (per sparsity), when it has them."""
    layers = engine.model.config.num_hidden_layers
    engine.cats = load_component(installed, "cats", lambda folder: cats.load(folder, layers), warnings,
                                 "CATS calibration")
    for kind, folder_name in (("griffin", "caprese"), ("cats", "caprese-cats")):
        branches = load_component(installed, folder_name, lambda folder: caprese.load(folder, engine.model),
                                  warnings, "Caprese branches")
        if branches is not None:
            engine.caprese[kind] = branches
    for label, meta in [("CATS calibration", engine.cats)] + [
            ("Caprese branches", b.meta) for b in engine.caprese.values()]:
        note = other_weights_note(label, (meta or {}).get("precision"), engine.precision)
        if note:
            warnings.append(note)


def fit_head(engine: Engine, label: str, component) -> None:
    """Move a loaded head (saved in the untransformed basis) to the engine's weights, noting other precisions."""
    spec = fpt_of(engine.model)
    if spec is not None:
        transform_head(component.head, spec)
    note = other_weights_note(label, component.config.get("precision"), engine.precision)
    if note:  # in place: load_engine keeps appending to the same list
        if not hasattr(engine, "warnings"):
            engine.warnings = []
        engine.warnings.append(note)


def use_switcher(engine: Engine, folder: Path) -> None:
    """Route `auto` with the switcher in `folder` instead of the model's own (a candidate being measured)."""
    router = Router.load(Path(folder))
    if router.config.get("model") not in (None, engine.model_id):
        raise ValueError(f"the switcher in {folder} was trained for {router.config['model']}, not {engine.model_id}")
    fit_head(engine, "switcher", router)
    engine.router = router


def load_engine(cfg: EngineConfig | None = None, store: ModelStore | None = None,
                progress: Progress | None = None, reasoning: bool = True) -> Engine:
    """Everything needed to answer: check memory, load weights at the precision, wrap in an Engine, attach the
    reasoning adapter (`cfg.reasoning_adapter` from the library, else the user's or the shipped one), switcher
    and verifier when the model has them. `engine.warnings` lists what the user should be told (e.g. a damaged
    head that was skipped)."""
    cfg = cfg or EngineConfig()
    store = store or ModelStore()
    installed = store.get(cfg.model_id)
    # one row of KV cache a full context long, and the prompt cache's stored prompts (one row each)
    store.check_fits(installed.spec, cfg.precision, cfg.kv, cfg.context + max(0, cfg.prompt_cache_tokens))
    set_threads(cfg.threads)
    tokenizer = load_tokenizer(installed.hf_dir)
    warnings: list[str] = []
    model = load_model(installed, cfg, progress, warnings=warnings)
    engine = Engine(model, tokenizer, model_id=cfg.model_id, precision=cfg.precision, kv=cfg.kv, context=cfg.context,
                    decode=cfg.decode, ff_keep=cfg.ff_keep, ff_reselect=cfg.ff_reselect, ff_decay=cfg.ff_decay,
                    prompt_cache=PromptCache(cfg.prompt_cache_tokens) if cfg.prompt_cache_tokens > 0 else None)
    engine.base_fingerprint = adapters.base_fingerprint(installed.hf_dir)
    engine.warnings = warnings
    if reasoning:
        attach_reasoning(engine, _reasoning_cards(installed, store, cfg.reasoning_adapter, warnings), warnings)
        engine.router = load_component(installed, "switcher", Router.load, warnings)
        engine.verifier = load_component(installed, "verifier", Verifier.load, warnings)
        for label, component in (("switcher", engine.router), ("verifier", engine.verifier)):
            if component is not None:
                fit_head(engine, label, component)
    if reasoning or cfg.decode != "dense":
        attach_sparse_parts(engine, installed, warnings)
    note = engine.missing_for_decode()
    if note:
        warnings.append(note)
    settle_heap()  # loading temporaries go back to the OS; the model's objects leave the GC's full collections
    return engine
