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
import warnings
from pathlib import Path

from dp_helpers.tool.files import write_text_atomic
from dp_helpers.tool.metrics import MetricsFormatError, MetricsTail, metrics_dir, read_metrics
from dp_helpers.tool.request import UsageError, check_out_dir, train_samples
from dp_helpers.tool.sampler import shard_plan


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
                  world_size: int | None = None, backend: str | None = None, start: dict | None = None,
                  **more) -> None:
    """After a run was stopped or failed: summary.json says so, how far it got, and the checkpoint it left."""
    # before: the checkpoint's file_stamp when the run started; a file no write of this run touched is not named.
    # start: the history a --resume began from (its epochs' losses, its layout), as train.py's summary counts it
    if run_dir is None or (run_dir / "summary.json").exists():
        return
    steps = MetricsTail(metrics_dir(run_dir) / "rank0.jsonl").new_lines()  # complete lines, a restart's redone steps once
    start = start or {}
    losses = [*start.get("epoch_losses", []), *logged_epoch_losses(run_dir, cfg, world_size)]
    write_text_atomic(run_dir / "summary.json", json.dumps(
        {"status": status, "reason": reason, **more, "checkpoint": left_checkpoint(cfg, before),
         "config": cfg.as_dict(), "world_size": world_size, "backend": backend,
         "steps_logged_by_rank_0": steps, "epoch_losses": losses,
         **unfinished(cfg, world_size, start, f"{status} after {len(losses)} of {cfg.epochs} epochs")},
        indent=2) + "\n")


def logged_epoch_losses(run_dir: Path, cfg, world_size: int | None) -> list[float]:
    """Each epoch that every rank finished, in order: its loss as train.py reports it, from the ranks' metrics."""
    records = logged_records(run_dir)
    world_size = world_size or (records[0]["world_size"] if records else 1)
    steps = shard_plan(train_samples(cfg), world_size, cfg.batch_size, cfg.grad_accum_steps).optimizer_steps
    epochs: dict[int, dict[int, list[dict]]] = {}
    for record in records:  # by step then rank: each rank's steps in the order it took them
        epochs.setdefault(record["epoch"], {}).setdefault(record["rank"], []).append(record)
    losses = []
    for epoch in sorted(epochs):
        ranks = epochs[epoch]
        if sorted(ranks) != list(range(world_size)) or any(len(r) != steps for r in ranks.values()):
            break  # the epoch the run stopped in
        losses.append(epoch_loss([ranks[rank] for rank in range(world_size)]))
    return losses


def logged_records(run_dir: Path) -> list[dict]:
    """The metrics of a run that may have been killed (a cut last line is skipped quietly); none if unreadable."""
    if not metrics_dir(run_dir).is_dir():
        return []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "truncated last line skipped": expected of a stopped run
        try:
            return read_metrics(run_dir)
        except (MetricsFormatError, OSError):
            return []


def epoch_loss(ranks: list[list[dict]]) -> float:
    """The sample-weighted mean loss of one epoch, summed as train.py's epoch_mean_loss sums it (per rank, then over ranks)."""
    loss_sum, count = 0.0, 0.0
    for records in ranks:
        rank_sum, rank_count = 0.0, 0
        for r in records:
            rank_sum, rank_count = rank_sum + r["loss"] * r["samples"], rank_count + r["samples"]
        loss_sum, count = loss_sum + rank_sum, count + float(rank_count)  # the all-reduce's float64 sums
    return loss_sum / count


def unfinished(cfg, world_size: int | None, start: dict, ended: str) -> dict:
    """The equivalence fields of a run that did not finish: nothing compared, and what its configuration means."""
    if world_size is None:
        return {"equivalent_to_large_batch": None, "equivalence": f"not compared: the run {ended}."}
    plan = shard_plan(train_samples(cfg), world_size, cfg.batch_size, cfg.grad_accum_steps)
    note = equivalence(cfg, plan, start)["equivalence"]
    return {"equivalent_to_large_batch": None,
            "equivalence": f"not compared: the run {ended} and left no final weights; its configuration: {note}"}


def equivalence(cfg, plan, history: dict, compressed: int | None = None) -> dict:
    """Whether this run matches one process with the global batch, and why: the sampler's arithmetic, then BatchNorm."""
    g = plan.global_batch
    as_ddp = (cfg.comm == "local-sgd" and cfg.period == 1) or (cfg.comm == "powersgd" and compressed == 0)
    if cfg.model == "bn" and cfg.bn_sync == "none" and plan.world_size > 1:
        why = "each rank's BatchNorm normalises with its own shard's statistics (--bn-sync allreduce makes them global)"
    elif why := COMM_DIFFERS.get("allreduce" if as_ddp else cfg.comm):
        why = why.format(period=cfg.period)
    elif earlier := [c for c in history.get("resumed_from", []) if c["global_batch_size"] != g]:
        why = f"its first {earlier[-1]['epoch']} epoch(s) trained with global batch {earlier[-1]['global_batch_size']}"
    else:
        earlier = [shard_plan(train_samples(cfg), c["world_size"], c["batch_size"], c["grad_accum_steps"])
                   for c in history.get("resumed_from", [])]
        padded = next((e for e in earlier if not e.equivalent_to_large_batch), plan)
        note = f" {POWERSGD_NOTHING.format(rank=cfg.powersgd_rank)}" if cfg.comm == "powersgd" else ""
        return {"equivalent_to_large_batch": padded.equivalent_to_large_batch, "equivalence": padded.explain() + note}
    return {"equivalent_to_large_batch": False, "equivalence": f"not identical to one process with batch {g}: {why}."}


POWERSGD_NOTHING = ("PowerSGD compressed no gradient: every step fell in its uncompressed warm-up, or rank {rank} "
                    "shrinks no gradient matrix of this model 2x, so every gradient was all-reduced whole, as by DDP.")
# why a --comm breaks the invariant (local-sgd with --period 1 keeps it: averaging SGD's steps is averaging gradients)
COMM_DIFFERS = {"fp16": "the gradients are rounded to fp16 for the all-reduce (close, not equal)",
                "powersgd": "PowerSGD sends a low-rank approximation of the gradients",
                "local-sgd": "the ranks step alone and average their parameters every {period} steps",
                "diloco": "the ranks step alone for {period} steps, then DiLoCo's outer step moves the weights"}
