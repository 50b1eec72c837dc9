"""Files written whole: a temporary name beside the target, then one rename (torch-free; notebook 07 shows write_atomic).

The run folder's records, the metrics a restart rewrites, the benchmark's results and the training tool's
checkpoints are all written here, so that a reader, or a run resumed after a crash, never meets half a file.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import shutil
from collections.abc import Callable
from pathlib import Path


def write_atomic(path, write: Callable[[Path], None]) -> Path:
    """Call write(tmp) on a temporary name beside `path`, then rename it into place: readers never see half a file."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}{PARTIAL}{os.getpid()}")
    try:
        write(tmp)
        with open(tmp, "rb") as done:
            os.fsync(done.fileno())  # on disk before the rename, so even a power cut leaves old or new
        os.replace(tmp, path)  # atomic on one file system: the old file or the new one, never a mix
    except Exception as exc:
        if disk_full(exc, path.parent):  # torch.save says "unexpected pos ..." where the disk is full
            raise full_disk(path, f" (an earlier {path.name}, if any, is kept)") from exc
        raise
    finally:
        with contextlib.suppress(OSError):  # the clean-up must not hide the error that stopped the write
            tmp.unlink(missing_ok=True)
    return path


PARTIAL = ".tmp"  # write_atomic's partial file: <name>.tmp<pid>, renamed into place or removed


def full_disk(path: Path, more: str = "") -> OSError:
    """The error a full disk raises here: one sentence naming the file that could not be written, and where."""
    return OSError(errno.ENOSPC, f"the disk is full: {path.name} could not be written in {path.parent}{more}")


@contextlib.contextmanager
def named_on_failure(path):
    """Writes to an open file, whose OSError names no file (ENOSPC on a flush), raise one that names `path`."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None or (exc.strerror or "").startswith("the disk is full"):
            raise
        path = Path(path)
        raise (full_disk(path) if disk_full(exc, path.parent) else
               OSError(exc.errno, exc.strerror or str(exc), str(path))) from exc


def append_text(path, text: str) -> None:
    """Append text to a file (created if missing); a failure names the file."""
    with named_on_failure(path), open(path, "a", encoding="utf-8") as f:
        f.write(text)


def disk_full(exc: BaseException, folder: Path) -> bool:
    """Whether a failed write failed because the disk (of folder) is full: ENOSPC, or less than 1 MiB left."""
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return True
    try:
        return shutil.disk_usage(folder).free < 2**20
    except OSError:
        return False


def remove_partials(*paths) -> None:
    """Remove the partial files a write_atomic of these paths left when its process was killed mid-write."""
    import psutil

    for path in filter(None, paths):
        path = Path(path)
        for tmp in path.parent.glob(f"{glob.escape(path.name)}{PARTIAL}*"):
            pid = tmp.name[len(path.name) + len(PARTIAL):]
            if pid.isdigit() and not psutil.pid_exists(int(pid)):
                with contextlib.suppress(OSError):
                    tmp.unlink()


def write_text_atomic(path, text: str) -> Path:
    """Write a text file whole (see write_atomic)."""
    return write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
