"""The checks of a `train` request, in the order they run, before anything starts: the first problem in one sentence.

The CLI and run_train() call check_train_request(); a new flag's check goes into the step it belongs to (torch-free
until a --resume checkpoint has to be read). What every launch checks (the script, --out, --timeout, the world size
and the backend) stays with the launcher, in launch/command.py's plan_launch.
"""

from __future__ import annotations

from pathlib import Path

from dp_helpers.tool.checks import UsageError, check_int
from dp_helpers.tool.config import TrainConfig, fault, shard_plan, train_samples, validate


def check_train_request(cfg: TrainConfig, world_size: int, backend: str = "auto", oversubscribe: bool = False,
                        max_restarts: int = 0, out_dir=None) -> int | None:
    """Refuse a request that cannot run; returns the optimizer steps rank 0 will log (the progress bar's length)."""
    check_int("world_size", world_size, 1)
    validate(cfg, world_size)  # each flag alone, then flags that contradict each other, then the files they name
    check_outputs(cfg, out_dir)  # the snapshot must not be one of the run folder's own files
    check_machine(cfg, world_size, backend, oversubscribe)  # what this machine can run
    check_restarts(max_restarts, cfg)  # a restarted group needs a snapshot to resume from
    return progress_steps(cfg, world_size)  # reads a --resume checkpoint: one this run can continue


RUN_FILES = ("model.pt", "summary.json", "console.log", "loss.png", "failures.json", "restarts.jsonl")
RUN_FOLDERS = ("metrics", "logs")


def check_outputs(cfg: TrainConfig, out_dir) -> None:
    """Refuse a --checkpoint that is one of the files the run writes into its own folder (model.pt, metrics/...)."""
    if not cfg.checkpoint or out_dir is None:
        return
    target, folder = (Path(p).expanduser().resolve() for p in (cfg.checkpoint, out_dir))
    inside = target.relative_to(folder) if target.is_relative_to(folder) and target != folder else None
    if inside is not None and (str(inside) in RUN_FILES or inside.parts[0] in RUN_FOLDERS):
        raise UsageError(f"--checkpoint {cfg.checkpoint} is the run folder's own {inside}: the run would overwrite "
                         "the snapshot with it; give the checkpoint another name, e.g. ck.pt.")


def check_machine(cfg: TrainConfig, world_size: int, backend: str, oversubscribe: bool) -> None:
    """Refuse what this machine cannot run: far more CPU processes than cores, SyncBatchNorm without GPUs."""
    from dp_helpers.tool.env import cpu_cores, resolve_backend

    backend = resolve_backend(backend, world_size)
    if cfg.bn_sync == "syncbn" and backend != "nccl":
        raise UsageError("bn_sync 'syncbn' needs one GPU per process on nccl (SyncBatchNorm refuses CPU tensors); "
                         "use --bn-sync allreduce, the same statistics by hand.")
    limit = max(8, 4 * cpu_cores())
    if backend == "gloo" and world_size > limit and not oversubscribe:
        raise UsageError(f"world size {world_size} means {world_size} CPU processes on {cpu_cores()} core(s); "
                         f"use at most {limit}, or pass --oversubscribe if you mean it.")


def check_restarts(max_restarts: int, cfg: TrainConfig) -> None:
    """Refuse --max-restarts below 0, or above 0 without --checkpoint (a restarted group would start from scratch)."""
    check_int("max_restarts", max_restarts, 0)
    if max_restarts and cfg.strategy != "ddp":
        raise UsageError(f"--max-restarts {max_restarts} needs --checkpoint, which --strategy {cfg.strategy} does not "
                         "write: restarts that resume are available with --strategy ddp.")
    if max_restarts and not cfg.checkpoint:
        raise UsageError(f"--max-restarts {max_restarts} needs --checkpoint FILE: a restarted group resumes from the last "
                         "snapshot, and without one it would start over from epoch 1.")


def progress_steps(cfg: TrainConfig, world_size: int) -> int | None:
    """Optimizer steps rank 0 will log in this run (one metrics line each), after checking a --resume checkpoint."""
    plan = shard_plan(train_samples(cfg), world_size, cfg.batch_size, cfg.grad_accum_steps)
    last, first = (min(cfg.epochs, cfg.stop_after) if cfg.stop_after else cfg.epochs), 0
    if cfg.resume:  # torch is imported only when resuming
        from dp_helpers.tool.training import check_resume

        first = check_resume(cfg)
        if cfg.stop_after and cfg.stop_after <= first:
            raise UsageError(f"--stop-after {cfg.stop_after} stops at or before epoch {first}, where {cfg.resume} "
                             "resumes: nothing would train; raise --stop-after or leave it out.")
    check_fault_fires(cfg, world_size, first, last)
    return plan.optimizer_steps * max(last - first, 0) or None


def check_fault_fires(cfg: TrainConfig, world_size: int, first: int, last: int) -> None:
    """Refuse a --fail-at in an epoch this run does not train (before its --resume point, after its --stop-after)."""
    if cfg.fail_at and not first <= fault(cfg, world_size)[0] < last:
        trained = f"epoch {last}" if last == first + 1 else f"epochs {first + 1} to {last}"
        raise UsageError(f"--fail-at {cfg.fail_at} would never fire: this run trains only {trained}; pick an epoch "
                         "it trains.")
