"""Errors raised by the model store, each with a message a user can act on."""


class ModelError(Exception):
    """Base class: anything that stops a model from being installed or loaded."""


class ChecksumMismatch(ModelError):
    """The assembled or downloaded file does not have the expected size or sha256."""


class CorruptModelFile(ModelError):
    """The file is truncated, not a GGUF/safetensors file, or its contents are unreadable."""


class UnsupportedArchitecture(ModelError):
    """The model is not a Qwen2 / Qwen2.5 causal language model."""


class MissingTokenizer(ModelError):
    """The model folder has no tokenizer files."""


class UnsafeWeights(ModelError):
    """Only safetensors and GGUF are loaded: pickled checkpoints are refused."""


class DiskFull(ModelError):
    """Writing the model ran out of disk space; nothing half-written was kept."""


class NotEnoughMemory(ModelError):
    """The model would not fit in this machine's RAM."""


class ModelNotInstalled(ModelError):
    """The requested model is not in the store."""


class InvalidModelId(ModelError):
    """A model id that is not a safe store folder name (see `models.registry.validate_model_id`)."""


class ModelAlreadyInstalled(ModelError):
    """An import would land on an installed model's name (its weights, W4 cache and adapters would mix)."""
