"""Loss curves per rank and across ranks; every function takes ax=None and returns the Axes (used by every notebook)."""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from pathlib import Path

from .metrics import read_metrics


def _get_ax(ax):
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(7, 4))
    return ax


def _runs(run_or_runs) -> list:
    """One run (a folder, a RunResult or a list of records) or several, as a list."""
    if isinstance(run_or_runs, (list, tuple)) and run_or_runs and isinstance(run_or_runs[0], dict):
        return [run_or_runs]
    return list(run_or_runs) if isinstance(run_or_runs, (list, tuple)) else [run_or_runs]


def _load(run) -> tuple[str, list[dict]]:
    """(label, records) for a run folder, a RunResult or a list of records."""
    if isinstance(run, list):
        return "run", run
    folder = Path(getattr(run, "run_dir", run))
    return folder.name, read_metrics(folder)


def mean_curve(records: list[dict]) -> tuple[list[int], list[float]]:
    """Per step, the sample-weighted mean of the ranks' losses: the loss of the global batch."""
    sums: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for r in records:
        sums[r["step"]][0] += r["loss"] * r["samples"]
        sums[r["step"]][1] += r["samples"]
    steps = sorted(sums)
    return steps, [sums[s][0] / sums[s][1] for s in steps]


def _mark_nonfinite(ax, label: str, steps: list[int], losses: list[float], color) -> None:
    """Warn about and draw non-finite losses, which matplotlib would otherwise drop without a word."""
    bad = [s for s, v in zip(steps, losses, strict=True) if not math.isfinite(v)]
    if not bad:
        return
    warnings.warn(f"{label}: non-finite loss at {len(bad)} step(s), first at step {bad[0]}; "
                  "marked with x at the top of the plot.", stacklevel=3)
    finite = [v for v in losses if math.isfinite(v)]
    top = max(finite) if finite else 1.0
    ax.plot(bad, [top] * len(bad), "x", color="red", markersize=8, label=f"{label}: non-finite loss")


def plot_loss_curves(run_or_runs, ax=None, per_rank: bool = True, labels=None):
    """Draw each run's mean loss (thick) and per-rank losses (thin) against step; returns the Axes."""
    ax = _get_ax(ax)
    runs = _runs(run_or_runs)
    for i, run in enumerate(runs):
        label, records = _load(run)
        label = labels[i] if labels else label
        if not records:
            raise ValueError(f"{label}: no metric records; did training run 0 steps?")
        color = f"C{i}"
        if per_rank:
            by_rank = defaultdict(list)
            for r in records:
                by_rank[r["rank"]].append(r)
            for rank, rows in sorted(by_rank.items()):
                ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], color=color, alpha=0.35,
                        linewidth=0.8, marker=".", markersize=2)
                _mark_nonfinite(ax, f"{label} rank {rank}", [r["step"] for r in rows], [r["loss"] for r in rows], color)
        steps, losses = mean_curve(records)
        ax.plot(steps, losses, color=color, linewidth=2, marker="o", markersize=2.5,
                label=f"{label} (mean of {records[0]['world_size']} ranks)")
        _mark_nonfinite(ax, f"{label} mean", steps, losses, color)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("training loss" + (": thin lines are single ranks" if per_rank else ""))
    ax.legend(fontsize="small")
    return ax


def save_loss_figure(run_dir, path) -> Path:
    """Draw one run's curves on a pyplot-free Figure and save it to `path` (the train job's loss.png)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4))  # no pyplot: no backend switch, no figure left open in a notebook
    plot_loss_curves(run_dir, ax=fig.subplots())
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return Path(path)
