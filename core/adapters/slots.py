"""The LoRA adapters loaded into one engine's model, which of them reasons, and the context decode runs under.

Several adapters live side by side in one peft model (`PeftModel.load_adapter` under its own adapter name);
choosing one is `set_adapter` on weights already in memory, so switching the reasoning adapter or answering
with a skill adapter never reloads the base model. A model without any adapter is wrapped by peft the first
time one is loaded. The prompt is always encoded with adapters off (`adapters.base`). A few adapters are kept
loaded; the least recently used skill is dropped beyond that (the reasoning adapter is never dropped).
"""
from __future__ import annotations

import contextlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from core.adapters import lora as adapters
from core.adapters import lora_fast

MAX_LOADED = 4
"""Adapters kept in memory at once (a rank-16 adapter of the 0.5B model is ~35 MB in float32)."""


@dataclass(frozen=True)
class Loaded:
    """One adapter loaded into the model."""

    peft_name: str
    """Its name inside the peft model."""
    name: str
    """Its name for the user (the library card's name)."""
    key: tuple | None = None
    """(folder, mtime, size) of its weights: the same files are loaded once."""


def _key(folder: Path) -> tuple:
    weights = Path(folder).resolve() / "adapter_model.safetensors"
    st = weights.stat()
    return str(weights), st.st_mtime_ns, st.st_size


def _config(folder: Path):
    from peft import LoraConfig

    config = LoraConfig.from_pretrained(str(folder))
    config.inference_mode = True
    return config


def _wrap(model, folder: Path, peft_name: str):
    """`model` wrapped by peft with the adapter in `folder`; on failure the model is left unwrapped, as it was."""
    from peft import PeftModel

    config = _config(folder)
    wrapped = PeftModel(model, config, adapter_name=peft_name)
    try:
        adapters.copy_adapter_weights(wrapped, folder, peft_name)
    except Exception:
        wrapped.unload()  # puts the original layers back
        raise
    return wrapped


class AdapterSlots:
    """The engine's adapters: `reasoning` (or None), `skills` by name, and `using(item)` to run under one."""

    def __init__(self, model, reasoning_name: str | None = None):
        self.model = model
        self._loaded: OrderedDict[str, Loaded] = OrderedDict()
        self.reasoning: Loaded | None = None
        self.skills: dict[str, Loaded] = {}
        self._count = 0
        self._layers: list = []
        """The LoRA layers (none until an adapter is loaded: then the base model is the model itself)."""
        self._peft_base = False
        """Adapters with extra trained modules: the base model only through peft's `disable_adapter()`."""
        if reasoning_name is not None and adapters.is_adapted(model):  # the adapter the model came with
            self.reasoning = Loaded(model.active_adapter, reasoning_name)
            self._loaded[self.reasoning.peft_name] = self.reasoning
        if adapters.is_adapted(model):
            self._find_layers()

    def load(self, folder: Path, name: str) -> Loaded:
        """Load the adapter in `folder` (once per set of files) and return it; raises ValueError when it is
        damaged or does not fit this model, leaving the loaded adapters as they were."""
        folder = Path(folder)
        try:
            key = _key(folder)
        except OSError:
            adapters.check_adapter(folder)  # raises the user-facing ValueError ("it is damaged (...)")
            raise
        for item in self._loaded.values():
            if item.key == key:  # these files are loaded already: no re-read per request
                self._loaded.move_to_end(item.peft_name)
                return Loaded(item.peft_name, name, key)
        adapters.check_adapter(folder)
        self._count += 1
        peft_name = f"ponder{self._count}"
        try:
            if adapters.is_adapted(self.model):
                try:
                    self.model.add_adapter(peft_name, _config(folder))
                    adapters.copy_adapter_weights(self.model, folder, peft_name)
                except Exception:
                    if peft_name in self.model.peft_config and len(self.model.peft_config) > 1:
                        self.model.delete_adapter(peft_name)
                        self._restore_active()
                    raise
            else:
                self.model = _wrap(self.model, folder, peft_name)
        except Exception as err:  # shapes of another model, unknown config keys, ...: leave no half adapter
            raise ValueError(f"it does not fit this model ({type(err).__name__}: {err})") from err
        self.model.eval()
        self._find_layers()  # another adapter may wrap other layers
        self._restore_active()
        item = Loaded(peft_name, name, key)
        self._loaded[peft_name] = item
        self._evict()
        return item

    def _restore_active(self) -> None:
        """Keep the reasoning adapter the active one between requests (code outside the engine expects it)."""
        if self.reasoning is not None and self.model.active_adapter != self.reasoning.peft_name:
            self.model.set_adapter(self.reasoning.peft_name, inference_mode=True)

    def _evict(self) -> None:
        while len(self._loaded) > MAX_LOADED:
            keep = {self.reasoning.peft_name} if self.reasoning is not None else set()
            victim = next((n for n in self._loaded if n not in keep), None)
            if victim is None:
                return
            del self._loaded[victim]
            self.skills = {k: v for k, v in self.skills.items() if v.peft_name != victim}
            self.model.delete_adapter(victim)
            self._find_layers()
            self._restore_active()

    def add_skill(self, folder: Path, name: str) -> Loaded:
        self.skills[name] = item = self.load(folder, name)
        return item

    def skill(self, name: str) -> Loaded:
        try:
            return self.skills[name]
        except KeyError:
            raise ValueError(f"The skill adapter '{name}' is not loaded.") from None

    def _find_layers(self) -> None:
        """Find the model's LoRA layers (once per set of loaded adapters) and give them the fast inference path."""
        from peft.tuners.tuners_utils import BaseTunerLayer

        self._layers = [m for m in self.model.modules() if isinstance(m, BaseTunerLayer)]
        lora_fast.install(self._layers)
        config = getattr(self.model, "peft_config", {})
        self._peft_base = any(getattr(c, "modules_to_save", None) for c in config.values())

    @contextlib.contextmanager
    def using(self, item: Loaded | None):
        """Run under adapter `item` (None: the base model, every adapter off).

        The base model runs every decode step of a Fast answer and every prompt, so adapters are switched off by
        the flag each LoRA layer's forward reads (`disable_adapters`) on layers found once: peft's
        `disable_adapter()` walks every module of the model and resets requires_grad on the way, ~29 ms a call
        on the 0.5B (more than the step itself). Adapters with extra trained modules take peft's own path."""
        if item is None:
            if self._peft_base:
                with adapters.base(self.model):
                    yield
                return
            layers = self._layers
            before = [layer._disable_adapters for layer in layers]
            try:
                for layer in layers:
                    layer._disable_adapters = True
                yield
            finally:
                for layer, was in zip(layers, before, strict=True):
                    layer._disable_adapters = was
            return
        if self.model.active_adapter != item.peft_name:
            self.model.set_adapter(item.peft_name, inference_mode=True)
        yield

    @property
    def trains_extra_modules(self) -> bool:
        """Some adapter replaces whole modules (peft's modules_to_save), which run only through peft."""
        return self._peft_base

    def names(self) -> dict:
        return {"reasoning": self.reasoning.name if self.reasoning else None, "skills": sorted(self.skills)}


class AdapterChoice:
    """The Engine's adapter choices, on top of its `slots`, `model_id`, `base_fingerprint` and kept traces."""

    @property
    def model(self):
        return self.slots.model

    @property
    def adapter_name(self) -> str | None:
        """The reasoning adapter's name, None when there is none."""
        return self.slots.reasoning.name if self.slots.reasoning else None

    @property
    def can_reason(self) -> bool:
        return self.slots.reasoning is not None

    def _fits(self, card, kind: str) -> None:
        if card.kind != kind:
            raise ValueError(f"'{card.name}' is a {card.kind} adapter, not a {kind} adapter.")
        if card.base_model != self.model_id:
            raise ValueError(f"'{card.name}' was trained for {card.base_model}, not {self.model_id}.")
        if None not in (card.base_fingerprint, self.base_fingerprint) and card.base_fingerprint != self.base_fingerprint:
            raise ValueError(f"'{card.name}' was trained on other base weights than the loaded {self.model_id}.")

    def use_reasoning_adapter(self, card) -> None:
        """Make the library adapter `card` (an AdapterCard) the reasoning adapter, loading it once; None = no
        reasoning adapter. The model is not reloaded; traces kept for think longer are dropped."""
        if card is not None:
            self._fits(card, "reasoning")
            self.slots.reasoning = self.slots.load(card.folder, card.name)
        else:
            self.slots.reasoning = None
        self._traces.clear()

    def load_skill(self, card) -> str:
        """Load the skill adapter `card` (cached by its name and files); returns the name `skill=` takes."""
        self._fits(card, "skill")
        return self.slots.add_skill(card.folder, card.name).name

    def adapter_names(self) -> dict:
        """{"reasoning": name or None, "skills": [loaded skill names]}."""
        return self.slots.names()

    def _skill(self, skill) -> Loaded | None:
        if skill is None:
            return None
        return self.slots.skill(skill if isinstance(skill, str) else self.load_skill(skill))

    def _answered_by(self, reasoning: bool, skill: Loaded | None) -> str | None:
        return self.adapter_name if reasoning else skill.name if skill else None
