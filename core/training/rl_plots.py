"""PNG learning curves of a budget-RL run (reward, length, accuracy vs step), drawn from its log.jsonl entries.

matplotlib is imported lazily with the Agg backend (no display, no Qt), so importing this module costs nothing.
Each curve shows the per-step values and a moving average, since one step is a single question's group.
"""
from __future__ import annotations

from pathlib import Path

CURVES = (("reward", "mean reward"), ("length", "mean generated tokens"), ("accuracy", "accuracy"))


def moving_average(values: list[float], window: int = 10) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def write_curves(entries: list[dict], folder: Path) -> list[Path]:
    """Write reward.png, length.png and accuracy.png into `folder`; returns their paths (none without entries)."""
    if not entries:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    steps = [e["step"] for e in entries]
    paths = []
    for key, label in CURVES:
        values = [float(e[key]) for e in entries]
        fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
        ax.plot(steps, values, ".", alpha=0.35, label="per step")
        ax.plot(steps, moving_average(values), "-", label="moving average (10)")
        if key == "length":
            budgets = [e.get("budget") for e in entries]
            if all(b is not None for b in budgets):
                ax.plot(steps, budgets, "x", alpha=0.3, color="grey", label="budget")
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
        fig.tight_layout()
        path = folder / f"{key}.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths
