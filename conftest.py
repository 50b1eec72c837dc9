"""Root pytest hooks, for tests/ and notebooks/ alike (a notebook-only run loads only this file): headless plotting,
GPU-only notebook cells skipped with a reason, and a guard that every notebook's cells run in one kernel, in order."""

from __future__ import annotations

import os

import pytest

GPU_TAGS = {"requires-gpu": 1, "requires-multi-gpu": 2}
CELL_ORDER = pytest.StashKey[dict]()  # notebook path -> its cells' names, in the notebook's order
RAN_HERE = pytest.StashKey[dict]()  # notebook path -> names of its cells this process has started
# notebooks whose every cell is marked long: fault injection throughout (replicas and nodes killed, ~2 min of runs)
LONG_NOTEBOOKS = {"11_training_that_keeps_going.ipynb"}
# tests that run only when asked for: (marker, option, the skip's reason); .ci/run passes both options
OPT_IN = (("alone", "--notebooks-alone", "runs with --notebooks-alone (.ci/run passes it): minutes"),
          ("long", "--long", "runs with --long (.ci/run passes it): over the 5-minute budget of pytest"))


def gpu_count() -> int:
    """Visible CUDA GPUs (0 on CPU builds)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def is_cell(item) -> bool:
    """nbval's notebook-cell items carry the cell; ordinary tests do not."""
    return isinstance(getattr(item, "cell", None), dict)


def pytest_addoption(parser):
    """--notebooks-alone: also run tests/test_notebooks_alone.py; --long: also the tests marked long (.ci/run: both)."""
    parser.addoption("--notebooks-alone", action="store_true",
                     help="run every notebook alone in a fresh copy of the checkout (minutes; CI runs it)")
    parser.addoption("--long", action="store_true",
                     help="run the tests marked long: mistake galleries, fault injection, widest matrices (CI runs them)")


def pytest_configure(config):
    """Headless plotting for every test and every notebook kernel started by nbval."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    config.stash[CELL_ORDER], config.stash[RAN_HERE] = {}, {}


def pytest_itemcollected(item):
    """Record each notebook's cells (a long notebook's marked long) before any selection (-k, -m) or scheduling sees them."""
    if is_cell(item):
        item.config.stash[CELL_ORDER].setdefault(item.path, []).append(item.name)
        if item.path.name in LONG_NOTEBOOKS:  # here, before -m long selects and the skips below are decided
            item.add_marker(pytest.mark.long)


def pytest_collection_modifyitems(config, items):
    """Tests marked alone or long skip, with the reason, unless their option is given; notebook cells are slow (a
    kernel, often torchrun); cells tagged requires-gpu / requires-multi-gpu skip, with the reason, on smaller machines."""
    n = None
    for marker, option, reason in OPT_IN:
        if not config.getoption(option):
            for item in items:
                if item.get_closest_marker(marker):
                    item.add_marker(pytest.mark.skip(reason=reason))
    for item in filter(is_cell, items):
        item.add_marker(pytest.mark.slow)
        need = max((GPU_TAGS[t] for t in item.cell.get("metadata", {}).get("tags", []) if t in GPU_TAGS), default=0)
        if need:
            n = gpu_count() if n is None else n
            if n < need:
                item.add_marker(pytest.mark.skip(reason=f"notebook cell needs >= {need} GPU(s), found {n}"))


def cells_missing_before(item) -> list[str]:
    """The cells above `item` in its notebook that this process (this kernel) has not started; records `item`."""
    order, ran = item.config.stash[CELL_ORDER][item.path], item.config.stash[RAN_HERE].setdefault(item.path, set())
    missing = [name for name in order[: order.index(item.name)] if name not in ran]
    ran.add(item.name)
    return missing


@pytest.hookimpl(tryfirst=True)  # before the skipping plugin: a skipped cell still counts as reached
def pytest_runtest_setup(item):
    """A cell whose predecessors ran elsewhere would fail with a NameError: say what happened instead."""
    if is_cell(item) and (missing := cells_missing_before(item)):
        pytest.fail(f"{item.path.name}::{item.name} runs in a kernel that has not run {len(missing)} cell(s) above it "
                    f"({missing[0]}, ...): a notebook's cells share one kernel, so select whole notebooks, and with "
                    "pytest-xdist keep each file on one worker (--dist loadfile); if this shows up in a full run, "
                    "pytest or pytest-xdist changed how it distributes tests", pytrace=False)
