"""Downloading Qwen2.5 safetensors checkpoints from the Hugging Face hub, with progress and resume.

huggingface_hub resumes interrupted downloads from its cache by itself. Only config, tokenizer and
safetensors files are fetched (never pickles). Offline (`HF_HUB_OFFLINE=1`), only the local cache is read.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

from .errors import ModelError

ALLOW_PATTERNS = ["*.json", "*.safetensors", "merges.txt", "vocab.json", "*.jinja"]


def _progress_tqdm(progress: Callable[[str, int, int], None]):
    from tqdm.auto import tqdm

    class ProgressTqdm(tqdm):
        """tqdm that also reports byte progress to the caller."""

        def __init__(self, *args, **kwargs):
            kwargs.setdefault("disable", False)
            super().__init__(*args, **kwargs)

        def update(self, n=1):
            out = super().update(n)
            if self.total and getattr(self, "unit", "") == "B":
                progress("download", int(self.n), int(self.total))
            return out

    return ProgressTqdm


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP client's own errors (not OSError) that huggingface_hub lets through once its retries are spent: a
    connection dropped or timed out part-way through a file."""
    errors = []
    for module in ("httpx2", "httpx"):  # whichever client this huggingface_hub uses
        try:
            errors.append(importlib.import_module(module).HTTPError)
        except (ImportError, AttributeError):
            pass
    return tuple(errors)


def download_snapshot(repo_id: str, *, cache_dir: Path | None = None, revision: str | None = None,
                      progress: Callable[[str, int, int], None] | None = None, local_files_only: bool = False) -> Path:
    """Fetch (or find in the cache) the safetensors snapshot of `repo_id`; return its local folder."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalEntryNotFoundError, OfflineModeIsEnabled

    kwargs = {}
    if progress is not None:
        kwargs["tqdm_class"] = _progress_tqdm(progress)
    try:
        path = snapshot_download(
            repo_id, revision=revision, cache_dir=str(cache_dir) if cache_dir else None,
            allow_patterns=ALLOW_PATTERNS, local_files_only=local_files_only, **kwargs,
        )
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as err:
        raise ModelError(
            f"{repo_id} is not in the local download cache and this computer is offline (or offline mode is on). "
            "Connect to the internet to download it, or import a model file you already have."
        ) from err
    except HfHubHTTPError as err:
        raise ModelError(f"Downloading {repo_id} failed: {err}") from err
    except OSError as err:
        raise ModelError(f"Downloading {repo_id} failed: {err}") from err
    except HFValidationError as err:
        raise ModelError(f"{repo_id!r} is not a Hugging Face repository id (such as Qwen/Qwen2.5-1.5B-Instruct): "
                         f"{err}") from err
    except _transport_errors() as err:
        raise ModelError(f"Downloading {repo_id} broke off ({type(err).__name__}: {err}). Try again: the files "
                         "already downloaded are kept and the download resumes.") from err
    return Path(path)
