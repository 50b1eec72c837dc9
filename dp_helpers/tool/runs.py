"""The run folder: a fresh one per run, refused when it already holds a run; its records written whole (torch-free).

Every launcher and every script writes here: `run_ddp` creates it and tells the workers its path
(`DP_RUN_DIR`), a script started without a launcher creates its own (notebook 03).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from pathlib import Path

from dp_helpers.tool.files import write_text_atomic
from dp_helpers.tool.metrics import MetricsTail, metrics_dir
from dp_helpers.tool.request import UsageError, check_out_dir


def fresh_run_dir(name: str) -> Path:
    """A new, unique folder name under runs/ for a run of `name`."""
    return Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{name}-{uuid.uuid4().hex[:6]}"


def prepare_run_dir(out_dir, name: str) -> Path:
    """Create the run folder (a fresh one under runs/ by default); refuse one that is unwritable or already holds a run."""
    check_out_dir(out_dir)  # request.py's: an empty name, a file, a folder that holds a run or anything else
    run_dir = Path(fresh_run_dir(name) if out_dir is None else out_dir).expanduser().resolve()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"output folder {run_dir} is not writable ({exc.strerror}).") from None
    return run_dir


@contextlib.contextmanager
def checkpoint_lock(path):
    """Hold `<path>.lock` while a run may write the snapshot at path: a second live run is refused in one sentence."""
    if not path:
        yield
        return
    try:
        import fcntl  # noqa: F401 (POSIX: on Windows no lock is taken)
    except ImportError:
        yield
        return
    lock = Path(f"{path}.lock")
    fd = take_lock(lock, path)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            lock.unlink()  # before the lock goes: a run that opens it now finds another file and locks that
        os.close(fd)


def take_lock(lock: Path, path) -> int:
    """An open descriptor holding an exclusive lock on the file now at `lock`, or a UsageError if a live run has it."""
    import fcntl

    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise UsageError(f"checkpoint {path}: its lock file {lock} cannot be created ({exc.strerror}).") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UsageError(f"checkpoint {path} is in use by another run that is still going (it holds {lock.name}); "
                             "give this run another --checkpoint, or wait for that one to end.") from None
        if lock.exists() and os.stat(lock).st_ino == os.fstat(fd).st_ino:
            return fd  # the file still at that path: not one a finishing run has just removed
        os.close(fd)


def file_stamp(path) -> tuple | None:
    """What tells one write of a file from another (inode, size, modification time); None when there is no file."""
    if not path or not Path(path).is_file():
        return None
    stat = Path(path).stat()
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


def left_checkpoint(cfg, before: tuple | None) -> str | None:
    """The --checkpoint file if this run wrote it (or resumed from it), not one an earlier run left there."""
    stamp = file_stamp(cfg.checkpoint)
    resumed = bool(cfg.resume) and stamp is not None and Path(cfg.resume).resolve() == Path(cfg.checkpoint).resolve()
    return cfg.checkpoint if stamp is not None and (stamp != before or resumed) else None


def mark_failed(run_dir: Path, reason: str) -> None:
    """A finished run whose last writes failed (a full disk): summary.json says failed, and why, if it can be written."""
    path = Path(run_dir) / "summary.json"
    with contextlib.suppress(OSError, ValueError):
        summary = json.loads(path.read_text(encoding="utf-8"))
        write_text_atomic(path, json.dumps({**summary, "status": "failed", "reason": reason}, indent=2) + "\n")


def record_ending(run_dir: Path, cfg, reason: str, status: str = "stopped", before: tuple | None = None,
                  **more) -> None:
    """After a run was stopped or failed: summary.json says so, how far it got, and the checkpoint it left."""
    # before: the checkpoint's file_stamp when the run started; a file no write of this run touched is not named
    if run_dir is None or (run_dir / "summary.json").exists():
        return
    steps = MetricsTail(metrics_dir(run_dir) / "rank0.jsonl").new_lines()  # complete lines, a restart's redone steps once
    write_text_atomic(run_dir / "summary.json", json.dumps(
        {"status": status, "reason": reason, **more, "config": cfg.as_dict(), "steps_logged_by_rank_0": steps,
         "checkpoint": left_checkpoint(cfg, before)}, indent=2) + "\n")
