"""Reasoning adapters: the only peft caller. Attach, enable for decode segments, disable for the prompt.

The prompt is always encoded by the base model (`base()` context), so its KV cache is exactly the base
model's and both modes share one prefill; the adapter then runs on the response tokens only ("masked LoRA",
two-pass form). We use the two-pass form rather than peft's Activated LoRA because aLoRA's masked in-place
add fails to train on quanto's custom autograd output; inference and training use the same form.
Adapters are never merged.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path

from torch import nn

from models.fpt import fpt_of, transform_lora_state

ADAPTER_NAME = "reason"
META_FILE = "ponder_adapter.json"


def lora_config(rank: int = 16, alpha: int | None = None, dropout: float = 0.05):
    from peft import LoraConfig

    return LoraConfig(r=rank, lora_alpha=alpha or 2 * rank, lora_dropout=dropout, target_modules="all-linear",
                      task_type="CAUSAL_LM", bias="none")


def attach_new(model: nn.Module, rank: int = 16, alpha: int | None = None, dropout: float = 0.05):
    """Wrap `model` with a fresh, trainable LoRA adapter on all linear layers (LM head excluded)."""
    from peft import get_peft_model

    return get_peft_model(model, lora_config(rank, alpha, dropout), adapter_name=ADAPTER_NAME)


def load_adapter(model: nn.Module, folder: Path, trainable: bool = False):
    """Attach a saved adapter (peft safetensors format): for inference, or to train it further."""
    from peft import PeftModel

    folder = Path(folder)
    if not (folder / "adapter_model.safetensors").is_file():
        raise FileNotFoundError(f"{folder} holds no adapter_model.safetensors")
    peft_model = PeftModel.from_pretrained(model, str(folder), adapter_name=ADAPTER_NAME, is_trainable=trainable)
    if fpt_of(model) is not None:  # saved in the original basis: move the factors into the transformed one
        copy_adapter_weights(peft_model, folder, ADAPTER_NAME)
    if not trainable:
        peft_model.eval()
    return peft_model


def _param_name(saved_key: str, adapter_name: str) -> str:
    """peft's saved key → the parameter's name in a model holding the adapter as `adapter_name`
    (`...q_proj.lora_A.weight` → `...q_proj.lora_A.<name>.weight`, `...lora_embedding_A` → `...lora_embedding_A.<name>`),
    the rule of peft's `set_peft_model_state_dict`."""
    suffix = saved_key.split("lora_", 1)[1]
    if "." in suffix:
        rest = ".".join(suffix.split(".")[1:])
        return saved_key[: len(saved_key) - len(rest)] + f"{adapter_name}.{rest}"
    return f"{saved_key}.{adapter_name}"


def copy_adapter_weights(model: nn.Module, folder: Path, adapter_name: str) -> None:
    """Copy a saved adapter's tensors into the LoRA parameters of `adapter_name` (already injected with the saved
    config). peft's own loader calls `model.state_dict()`, which unpacks every quantized weight of the base
    (about 0.5 GB of temporaries for the 0.5B): this reads only the adapter file. Raises ValueError when a tensor
    has no parameter or another shape, or a parameter gets no tensor."""
    import torch
    from safetensors.torch import load_file

    saved = load_file(str(Path(folder) / "adapter_model.safetensors"))
    spec = fpt_of(model)
    if spec is not None:  # adapters are saved in the original basis (see save_adapter)
        saved = transform_lora_state(saved, spec, model.config)
    params = {n: p for n, p in model.named_parameters() if f".{adapter_name}" in n and "lora_" in n}
    filled = set()
    with torch.no_grad():
        for key, tensor in saved.items():
            name = _param_name(key, adapter_name) if "lora_" in key else key
            param = params.get(name)
            if param is None:
                raise ValueError(f"the adapter holds {key}, which this model has no place for")
            if param.shape != tensor.shape:
                raise ValueError(f"{key} has shape {tuple(tensor.shape)}, the model expects {tuple(param.shape)}")
            param.copy_(tensor.to(param.dtype))
            filled.add(name)
    missing = sorted(set(params) - filled)
    if missing:
        raise ValueError(f"the adapter has no weights for {missing[0]} (and {len(missing) - 1} more)")


def check_adapter(folder: Path) -> None:
    """Raise ValueError when a saved adapter cannot be read whole (bad config JSON, damaged safetensors), before
    peft starts changing the model in place."""
    from safetensors.torch import load_file

    folder = Path(folder)
    try:
        config = json.loads((folder / "adapter_config.json").read_text())
        if not isinstance(config, dict) or "r" not in config:
            raise ValueError("adapter_config.json is not a LoRA config")
        if not load_file(str(folder / "adapter_model.safetensors")):
            raise ValueError("adapter_model.safetensors holds no tensors")
    except Exception as err:  # OSError, JSON errors, and safetensors' own error types
        raise ValueError(f"it is damaged ({err})") from err


def is_adapted(model: nn.Module) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


@contextlib.contextmanager
def base(model: nn.Module):
    """Run the base model: the adapter is off inside, restored on exit (also on error)."""
    if is_adapted(model):
        with model.disable_adapter():
            yield
    else:
        yield


def save_adapter(model: nn.Module, folder: Path, meta: dict) -> None:
    folder = Path(folder)
    model.save_pretrained(str(folder), safe_serialization=True)
    card = folder / "README.md"  # peft's generated model card names local paths: not shipped
    if card.is_file():
        card.unlink()
    nested = folder / ADAPTER_NAME  # peft puts a non-default adapter name in a subfolder: keep one flat layout
    if nested.is_dir():
        for f in nested.iterdir():
            f.replace(folder / f.name)
        nested.rmdir()
    weights = folder / "adapter_model.safetensors"
    if weights.is_file():  # ship bf16: half the size, the precision the base computes in anyway
        import torch
        from safetensors.torch import load_file, save_file

        state = load_file(str(weights))
        spec = fpt_of(model)
        if spec is not None:  # trained on a transformed base: saved in the original basis, loadable on any base
            state = transform_lora_state(state, spec, model.config, inverse=True)
        state = {k: v.to(torch.bfloat16) for k, v in state.items()}
        save_file(state, str(weights), metadata={"format": "pt"})
    (folder / META_FILE).write_text(json.dumps(meta, indent=2))


def adapter_meta(folder: Path) -> dict:
    """The adapter's card (ponder_adapter.json), {} without one; a ValueError when it is not a JSON object."""
    path = Path(folder) / META_FILE
    if not path.is_file():
        return {}
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise ValueError(f"{META_FILE} is nested too deeply") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{META_FILE} is not a JSON object")
    return meta


def base_fingerprint(hf_dir: Path) -> str:
    """A short hash of the base weights' safetensors headers, stored with adapters trained on them."""
    digest = hashlib.sha256()
    for f in sorted(Path(hf_dir).glob("*.safetensors")):
        with open(f, "rb") as fh:
            digest.update(fh.read(1 << 16))
        digest.update(str(f.stat().st_size).encode())
    return digest.hexdigest()[:16]
