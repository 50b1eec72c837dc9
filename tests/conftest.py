"""Shared fixtures: a private TMPDIR per test and a check that no test leaves a process behind."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def private_tmpdir(tmp_path, monkeypatch):
    """torchrun leaves a torchelastic_* folder in TMPDIR per launch: keep them inside the test's tmp_path."""
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Fail a test that leaves any child process of pytest running."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    deadline = time.monotonic() + 10
    while True:
        left = [p for p in psutil.Process().children(recursive=True)
                if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, f"test left processes running: {[(p.pid, p.cmdline()[:4]) for p in left]}"


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
        if len(files) >= count:
            return files
        time.sleep(0.2)
    raise AssertionError(f"only {len(list(folder.glob('*.pid')))} of {count} workers started in {timeout}s")
