"""Tiny heads on the base model's hidden states: the switcher (reasoning needed?) and the verifier (correct?).

Plain nn.Modules saved as safetensors plus a JSON config; no pickles.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn


class Standardize(nn.Module):
    """Per-feature (x - mean) / std with statistics fixed from the training features (last-layer states of
    Qwen have a few huge dimensions that otherwise swamp a tiny head)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.register_buffer("mean", torch.zeros(hidden_size))
        self.register_buffer("std", torch.ones(hidden_size))

    def fit(self, x: torch.Tensor) -> None:
        self.mean.copy_(x.mean(0))
        self.std.copy_(x.std(0).clamp(min=1e-4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


class SwitcherHead(nn.Module):
    """MLP hidden→8→1 on the chunk-EMA of the prefill's last-layer states (paper: width 8, dropout 0.2)."""

    def __init__(self, hidden_size: int, width: int = 8, dropout: float = 0.2):
        super().__init__()
        self.norm = Standardize(hidden_size)
        self.net = nn.Sequential(nn.Linear(hidden_size, width), nn.ReLU(), nn.Dropout(dropout), nn.Linear(width, 1))

    def forward(self, pooled: torch.Tensor, noise: float = 0.0) -> torch.Tensor:  # (B, H) -> (B,) logits
        z = self.norm(pooled)
        if noise and self.training:  # paper: Gaussian input noise for robustness (on standardized features)
            z = z + noise * torch.randn_like(z)
        return self.net(z).squeeze(-1)


class VerifierHead(nn.Module):
    """Linear hidden→1 + sigmoid on the hidden state at the end of the verification prompt."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.norm = Standardize(hidden_size)
        self.linear = nn.Linear(hidden_size, 1)

    def forward(self, h: torch.Tensor, noise: float = 0.0) -> torch.Tensor:  # (B, H) -> (B,) logits
        return self.linear(self.norm(h)).squeeze(-1)


def chunk_ema(hidden: torch.Tensor, chunk: int = 128, alpha: float = 0.5) -> torch.Tensor:
    """r_1 = mean(chunk 1); r_c = α·mean(chunk c) + (1−α)·r_{c−1}. hidden: (T, H) -> (H,)."""
    r = None
    for start in range(0, hidden.shape[0], chunk):
        m = hidden[start:start + chunk].float().mean(0)
        r = m if r is None else alpha * m + (1 - alpha) * r
    return r


HEAD_FILES = ("head.json", "head.safetensors")


def save_head(head: nn.Module, folder: Path, config: dict) -> None:
    """Write the head to a temporary folder and swap it in whole: a crash keeps the old head or the new one.
    A folder holding anything but a head's files is refused, since the swap replaces the whole folder."""
    from safetensors.torch import save_file

    from .convert import AtomicDir

    folder = Path(folder)
    other = sorted(p.name for p in folder.iterdir() if p.name not in HEAD_FILES) if folder.is_dir() else []
    if other:
        raise ValueError(f"{folder} holds other files ({', '.join(other[:3])}); save the head to a new folder.")
    with AtomicDir(folder) as tmp:
        save_file({k: v.contiguous() for k, v in head.state_dict().items()}, str(tmp / "head.safetensors"))
        (tmp / "head.json").write_text(json.dumps(config, indent=2))


def load_head(folder: Path, kind: str) -> tuple[nn.Module, dict]:
    """Load a saved head of the given kind ('switcher' or 'verifier'); a head of another kind is refused."""
    from safetensors.torch import load_file

    folder = Path(folder)
    config = json.loads((folder / "head.json").read_text())
    if config.get("kind") != kind:
        raise ValueError(f"{folder} does not hold a {kind} head")
    head = SwitcherHead(config["hidden_size"], config.get("width", 8)) if kind == "switcher" else VerifierHead(
        config["hidden_size"])
    head.load_state_dict(load_file(str(folder / "head.safetensors")))
    return head.eval(), config
