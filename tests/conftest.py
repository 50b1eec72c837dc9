"""Shared fixtures: a private TMPDIR per test and a check that no test leaves a process behind."""

from __future__ import annotations

import multiprocessing.util
import os
import re
import subprocess
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent


LAUNCH = re.compile(r"\brun_\w+\(|\blaunch")  # run_ddp(, run_train(, a notebook's own launch helper ...


def launches(path: Path) -> int:
    """Code cells of a notebook that launch processes: its share of the suite's time, roughly."""
    import nbformat

    return sum(bool(LAUNCH.search(c.source)) for c in nbformat.read(path, 4).cells if c.cell_type == "code")


def pytest_collection_modifyitems(items):
    """Longest first, so no worker starts a long file while the other runs out of work: notebooks by their launches,
    then test files by their slow tests. pytest-xdist keeps each file on one worker (--dist loadfile) and, with
    --no-loadscope-reorder, hands the files out in this order."""
    cost = {p: launches(p) for p in {i.path for i in items if i.path.suffix == ".ipynb"}}
    slow = {p: sum(1 for i in items if i.path == p and i.get_closest_marker("slow")) for p in {i.path for i in items}}
    items.sort(key=lambda i: (0, -cost[i.path]) if i.path in cost else (1, -slow[i.path]))  # stable: cells keep order


@pytest.fixture(scope="session", autouse=True)
def workers_numerics():
    """The tests' own computations run with the workers' thread count, as the package's references do, so comparing
    them with ranks holds on any CPU (the notebooks' kernels keep torch's default: their references set it)."""
    from dp_helpers.tool.env import worker_numerics

    with worker_numerics():
        yield


@pytest.fixture(autouse=True)
def nothing_left_in_the_checkout(request):
    """A test may leave nothing in the checkout's runs/ (or the folder from which pytest was started)."""
    folders = [Path(request.config.rootpath) / "runs", Path.cwd() / "runs"]
    before = {f: set(f.iterdir()) if f.is_dir() else set() for f in folders}
    yield
    left = sorted(str(p) for f in folders if f.is_dir() for p in set(f.iterdir()) - before[f])
    assert not left, f"the test left {left}: give its runs a folder under tmp_path"


def signal_state() -> dict[str, str]:
    """This process's ignored and blocked signals as the kernel keeps them (a child inherits both across exec)."""
    status = Path("/proc/self/status")
    if not status.is_file():  # not Linux
        return {}
    return dict(line.split(":\t") for line in status.read_text().splitlines() if line.startswith(("SigIgn", "SigBlk")))


@pytest.fixture(autouse=True)
def signals_left_as_found():
    """A test may not leave a signal ignored or blocked: every later process this worker starts would inherit it
    (a CLI with SIGINT ignored does not stop on Ctrl-C)."""
    before = signal_state()
    yield
    assert signal_state() == before, "the test left a signal ignored or blocked"


@pytest.fixture(autouse=True)
def private_tmpdir(tmp_path, monkeypatch):
    """torchrun leaves a torchelastic_* folder in TMPDIR per launch: keep them inside the test's tmp_path."""
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))


def started_by(marker: str) -> list[psutil.Process]:
    """Live processes (not zombies) whose environment carries DP_TEST_ID=marker, wherever they were reparented."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get("DP_TEST_ID") == marker and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def survivors(marker: str, within: float = 5.0) -> list[psutil.Process]:
    """The marked processes still alive `within` seconds from now (returns as soon as none is, after a re-check)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not started_by(marker):
            time.sleep(0.5)  # none now: and none appears after it either (no late respawn)
            return started_by(marker)
        time.sleep(0.2)
    return started_by(marker)


@pytest.fixture(autouse=True)
def no_leftover_processes(monkeypatch):
    """Fail a test that leaves any process running: every process it starts inherits a marker, orphans included."""
    marker = f"test-{uuid.uuid4().hex}"
    monkeypatch.setenv("DP_TEST_ID", marker)
    yield
    deadline = time.monotonic() + 10
    while (left := started_by(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"test left processes running: {[(p.pid, p.cmdline()[:4]) for p in left]}"


@pytest.fixture(autouse=True)
def quick_tests_start_no_process(request, monkeypatch):
    """A test not marked slow may not start a process: `pytest -m "not slow"` stays a quick loop that needs no launcher."""
    if request.node.get_closest_marker("slow") or request.node.get_closest_marker("gpu"):
        return

    def refuse(*args, **kwargs):
        raise AssertionError("this test starts a process: mark it @pytest.mark.slow")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.setattr(multiprocessing.util, "spawnv_passfds", refuse)


@pytest.fixture(scope="session")
def pools():
    """Rank pools (tests/ranks.py) shared by the whole session: pools.get(world_size).run(fn, *args)."""
    from tests.ranks import Pools

    shared = Pools()
    yield shared
    shared.close()


@pytest.fixture
def write_script(tmp_path):
    """Write a worker script into tmp_path and return its path."""

    def write(body: str, name: str = "worker.py") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(body))
        return path

    return write


def pids_alive(pids) -> list[int]:
    """The pids in `pids` that still run (zombies count as gone)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def wait_for_files(folder: Path, count: int, timeout: float = 60) -> list[Path]:
    """Wait until `count` files exist in folder (workers announce their pids this way)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = sorted(folder.glob("*.pid"))
        # a file exists before its pid is written into it: wait for the content too
        if len(files) >= count and all(f.read_text().strip() for f in files):
            return files
        time.sleep(0.2)
    raise AssertionError(f"only {len(list(folder.glob('*.pid')))} of {count} workers started in {timeout}s")
