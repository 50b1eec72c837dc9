"""Per-rank JSONL metrics: each rank writes `metrics/rank{r}.jsonl`, the reader gathers all ranks (used by every notebook).

A record is one JSON object per line with at least rank, world_size, epoch, step (0-based, global
across epochs), loss (this rank's local mean loss), samples (this rank's batch size at this step) and
time (seconds since the rank started training). A non-finite loss is written as the string "nan",
"inf" or "-inf", because bare NaN is not JSON. After torchrun restarted the group, the records a
failed attempt wrote past the snapshot it resumed from stay in the file, marked "superseded": k (the
attempt that redid them); readers skip them unless asked.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from pathlib import Path

from dp_helpers.tool.files import named_on_failure, write_text_atomic
from dp_helpers.tool.request import UsageError

REQUIRED = ("rank", "world_size", "epoch", "step", "loss", "samples", "time")


class MetricsFormatError(ValueError):
    """A metrics file holds a line that is not a valid record."""


def metrics_dir(run_dir: str | Path) -> Path:
    """Where a run keeps its per-rank files."""
    return Path(run_dir) / "metrics"


def encode_float(value: float) -> float | str:
    """A JSON-safe float: non-finite values become 'nan', 'inf' or '-inf'."""
    value = float(value)
    return value if math.isfinite(value) else str(value)


def mark_superseded(path: Path, from_step: int, attempt: int) -> int:
    """Mark the records at step >= from_step as superseded by restart `attempt` (rewritten whole, then renamed); returns how many."""
    lines, marked = path.read_text(encoding="utf-8").splitlines(keepends=True), 0
    for i, line in enumerate(lines):
        if not line.endswith("\n"):  # a line cut short by the crash: no record to keep
            lines[i] = ""
            continue
        record = json.loads(line)
        if record["step"] >= from_step and "superseded" not in record:
            lines[i], marked = json.dumps({**record, "superseded": attempt}) + "\n", marked + 1
    write_text_atomic(path, "".join(lines))
    return marked


class MetricsWriter:
    """Appends one record per line to this rank's file, flushing each line so a crash loses nothing written."""

    def __init__(self, run_dir: str | Path, rank: int, world_size: int, restart: tuple[int, int] | None = None):
        self.rank, self.world_size = rank, world_size
        path = metrics_dir(run_dir) / f"rank{rank}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        if restart is not None and path.exists():  # (attempt, the step it resumes from): keep, mark, then append
            mark_superseded(path, restart[1], restart[0])
        # "x": never truncate or mix with an earlier run's file
        self.file = path.open("x" if restart is None else "a", encoding="utf-8")
        self.path, self.start = path, time.perf_counter()

    def log(self, epoch: int, step: int, loss: float, samples: int, **extra) -> dict:
        """Write one record and return it."""
        record = {"rank": self.rank, "world_size": self.world_size, "epoch": epoch, "step": step,
                  "loss": encode_float(loss), "samples": int(samples),
                  "time": round(time.perf_counter() - self.start, 6), **extra}
        with named_on_failure(self.path):  # a full disk names this file, not just "No space left on device"
            self.file.write(json.dumps(record, allow_nan=False) + "\n")
            self.file.flush()
        return record

    def close(self) -> None:
        """Close the file."""
        with named_on_failure(self.path):
            self.file.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def parse_record(text: str, path: Path, line_no: int) -> dict:
    """One line -> a record with a float loss, or MetricsFormatError naming the file and line."""
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MetricsFormatError(f"{path}, line {line_no}: not valid JSON ({exc.msg}).") from None
    if not isinstance(record, dict):
        raise MetricsFormatError(f"{path}, line {line_no}: expected a JSON object.")
    missing = [key for key in REQUIRED if key not in record]
    if missing:
        raise MetricsFormatError(f"{path}, line {line_no}: missing {', '.join(missing)}.")
    loss = record["loss"]
    if isinstance(loss, bool) or not isinstance(loss, (int, float, str)):
        raise MetricsFormatError(f"{path}, line {line_no}: loss must be a number, got {loss!r}.")
    try:
        record["loss"] = float(loss)
    except ValueError:
        raise MetricsFormatError(f"{path}, line {line_no}: loss must be a number, got {loss!r}.") from None
    return record


def read_file(path: str | Path) -> list[dict]:
    """All records of one file; a truncated last line (a killed run) is skipped with a warning."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    records = []
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        is_last_unterminated = line_no == len(lines) and not text.endswith("\n")
        try:
            records.append(parse_record(line, path, line_no))
        except MetricsFormatError:
            if not is_last_unterminated:
                raise
            warnings.warn(f"{path}, line {line_no}: truncated last line skipped (was the run killed?).",
                          stacklevel=2)
    return records


def read_metrics(run_dir: str | Path, superseded: bool = False) -> list[dict]:
    """Every rank's records of a run folder (or one .jsonl file) by step then rank; superseded=True keeps a failed attempt's too."""
    path = Path(run_dir)
    if path.is_file():
        files = [path]
    else:
        if not path.exists():
            raise UsageError(f"run folder not found: {path}")
        files = sorted(metrics_dir(path).glob("rank*.jsonl"))
    records = [r for f in files for r in read_file(f) if superseded or "superseded" not in r]
    return sorted(records, key=lambda r: (r["step"], r["rank"]))


class MetricsTail:
    """Counts new steps in a growing file (the launcher's progress bar follows rank 0); a restart's redone steps don't count twice."""

    def __init__(self, path: str | Path):
        self.path, self.offset, self.inode, self.last_step = Path(path), 0, None, -1

    def new_lines(self) -> int:
        """How many complete lines with a new step (or with no step) were appended since the last call."""
        try:
            with self.path.open("rb") as f:
                inode = os.fstat(f.fileno()).st_ino
                self.offset = self.offset if inode == self.inode else 0  # replaced: read it again
                self.inode = inode
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return 0
        complete = chunk.rfind(b"\n") + 1
        self.offset += complete
        return sum(self.is_new(line) for line in chunk[:complete].splitlines())

    def is_new(self, line: bytes) -> bool:
        """A line counts unless it is a superseded record or one whose step was counted before."""
        try:
            record = json.loads(line)
        except ValueError:
            return True
        step = record.get("step") if isinstance(record, dict) else None
        if not isinstance(step, int):
            return True
        if "superseded" in record or step <= self.last_step:
            return False
        self.last_step = step
        return True
