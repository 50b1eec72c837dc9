"""Root pytest hooks, for tests/ and notebooks/ alike: headless plotting, GPU-only notebook cells skipped with a reason."""

from __future__ import annotations

import os

import pytest

GPU_TAGS = {"requires-gpu": 1, "requires-multi-gpu": 2}


def gpu_count() -> int:
    """Visible CUDA GPUs (0 on CPU builds)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_configure(config):
    """Headless plotting for every test and every notebook kernel started by nbval."""
    os.environ.setdefault("MPLBACKEND", "Agg")


def pytest_collection_modifyitems(config, items):
    """Notebook cells tagged requires-gpu / requires-multi-gpu are reported as skipped, with the reason, on smaller machines."""
    n = None
    for item in items:
        cell = getattr(item, "cell", None)  # nbval's notebook-cell items carry the cell
        tags = cell.get("metadata", {}).get("tags", []) if isinstance(cell, dict) else []
        need = max((GPU_TAGS[t] for t in tags if t in GPU_TAGS), default=0)
        if need:
            n = gpu_count() if n is None else n
            if n < need:
                item.add_marker(pytest.mark.skip(reason=f"notebook cell needs >= {need} GPU(s), found {n}"))
