"""The training job's explicit configuration and the sampler arithmetic, torch-free so the CLI starts fast (notebooks 01, 03)."""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

MODELS = ("linear", "mlp", "bn")
SYNCS = ("ddp", "manual")
BN_SYNCS = ("none", "allreduce", "syncbn")


@dataclass(frozen=True)
class TrainConfig:
    """What the `train` job trains; the defaults reproduce the source article's problem."""

    epochs: int = 10
    batch_size: int = 10  # per process (micro_batch_size); global_batch_size = world_size * batch_size
    lr: float = 0.01
    samples: int = 100
    dim: int = 10
    seed: int = 0
    model: str = "linear"
    sync: str = "ddp"  # ddp: the DDP wrapper all-reduces gradients; manual: an all_reduce per parameter by hand
    check_grads: bool = False  # assert after every backward that all ranks hold identical gradients
    grad_accum_steps: int = 1  # micro-batches per optimizer step (DDP synchronises only the last)
    use_no_sync: bool = True  # with accumulation: skip the all-reduce of all but the last micro-batch
    momentum: float = 0.0  # SGD momentum: optimizer state that a checkpoint must carry
    bn_sync: str = "none"  # for --model bn: none (per-rank statistics), allreduce (by hand), syncbn (GPUs)
    checkpoint: str = ""  # rank 0 saves model, optimizer and epoch here after every epoch
    resume: str = ""  # every rank loads this checkpoint and continues from its epoch
    stop_after: int = 0  # stop after this many epochs (a simulated interruption); 0 runs them all

    def as_args(self) -> list[str]:
        """The fields that differ from the defaults, as worker command-line flags (a True bool is a bare flag)."""
        args = []
        for f in fields(self):
            flag, value = f"--{f.name.replace('_', '-')}", getattr(self, f.name)
            if value != f.default and isinstance(value, bool):
                args.append(flag if value else f"--no-{flag[2:]}")
            elif value != f.default:
                args += [flag, str(value)]
        return args

    def as_dict(self) -> dict:
        """The config as a plain dict (for summary.json)."""
        return asdict(self)


def check_int(name: str, value, minimum: int) -> None:
    """Raise TypeError unless value is a real int (not bool), ValueError if below minimum."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__}).")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}.")


def check_positive_number(name: str, value) -> None:
    """Raise unless value is a finite number > 0 (NaN and inf are refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__}).")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value}.")


def validate(cfg: TrainConfig, world_size: int = 1) -> None:
    """Refuse a config that cannot train, with one sentence naming the flag and the fix."""
    for name, minimum in (("epochs", 1), ("batch_size", 1), ("samples", 1), ("dim", 1), ("seed", 0),
                          ("grad_accum_steps", 1), ("stop_after", 0)):
        check_int(name, getattr(cfg, name), minimum)
    check_positive_number("lr", cfg.lr)
    if not (isinstance(cfg.momentum, (int, float)) and 0 <= cfg.momentum < 1):
        raise ValueError(f"momentum must be a number in [0, 1), got {cfg.momentum!r}.")
    if cfg.bn_sync not in BN_SYNCS:
        raise ValueError(f"bn_sync must be one of {', '.join(BN_SYNCS)}, got {cfg.bn_sync!r}.")
    if cfg.model not in MODELS:
        raise ValueError(f"model must be one of {', '.join(MODELS)}, got {cfg.model!r}.")
    if cfg.sync not in SYNCS:
        raise ValueError(f"sync must be one of {', '.join(SYNCS)}, got {cfg.sync!r}.")
    if cfg.resume and not Path(cfg.resume).is_file():
        raise FileNotFoundError(f"resume={cfg.resume!r}: no such checkpoint file; give the path a --checkpoint "
                                "run wrote.")
    if cfg.checkpoint and not Path(cfg.checkpoint).resolve().parent.is_dir():
        raise FileNotFoundError(f"checkpoint={cfg.checkpoint!r}: its folder does not exist; create it first.")
    if cfg.samples < world_size:
        raise ValueError(f"samples={cfg.samples} is fewer than world_size={world_size}: some ranks would "
                         "only see padding; use more samples or fewer processes.")


def add_train_flags(parser: argparse.ArgumentParser) -> None:
    """The flags shared by the CLI and the worker script, defaults from TrainConfig."""
    d = TrainConfig()
    parser.add_argument("--epochs", type=int, default=d.epochs, help="passes over the data")
    parser.add_argument("--batch-size", type=int, default=d.batch_size, help="samples per process per step")
    parser.add_argument("--lr", type=float, default=d.lr, help="SGD learning rate")
    parser.add_argument("--samples", type=int, default=d.samples, help="synthetic samples")
    parser.add_argument("--dim", type=int, default=d.dim, help="features per sample")
    parser.add_argument("--seed", type=int, default=d.seed, help="seeds data, weights and shuffling")
    parser.add_argument("--model", choices=MODELS, default=d.model, help="linear (the source article's) or mlp")
    parser.add_argument("--sync", choices=SYNCS, default=d.sync,
                        help="ddp: DistributedDataParallel; manual: all_reduce the gradients by hand")
    parser.add_argument("--check-grads", action=argparse.BooleanOptionalAction, default=d.check_grads,
                        help="assert after every backward that all ranks hold identical gradients")
    parser.add_argument("--grad-accum-steps", type=int, default=d.grad_accum_steps,
                        help="micro-batches per optimizer step; DDP all-reduces only on the last (no_sync)")
    parser.add_argument("--use-no-sync", action=argparse.BooleanOptionalAction, default=d.use_no_sync,
                        help="with accumulation, skip the all-reduce of all but the last micro-batch")
    parser.add_argument("--momentum", type=float, default=d.momentum, help="SGD momentum")
    parser.add_argument("--bn-sync", choices=BN_SYNCS, default=d.bn_sync,
                        help="with --model bn: per-rank statistics, an all-reduce by hand, or SyncBatchNorm (GPUs)")
    parser.add_argument("--checkpoint", default=d.checkpoint, help="save model, optimizer and epoch here every epoch")
    parser.add_argument("--resume", default=d.resume, help="continue from this checkpoint")
    parser.add_argument("--stop-after", type=int, default=d.stop_after,
                        help="stop after this many epochs, as if interrupted (0: never)")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """Pick the TrainConfig fields out of parsed flags."""
    return TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})


def worker_parser() -> argparse.ArgumentParser:
    """Flags of the worker script: the training config plus the run folder."""
    parser = argparse.ArgumentParser(description="DDP training worker (run under torchrun).")
    add_train_flags(parser)
    parser.add_argument("--out", default=os.environ.get("DP_RUN_DIR", "runs/train"),
                        help="run folder (default: $DP_RUN_DIR set by the launcher)")
    return parser


@dataclass(frozen=True)
class ShardPlan:
    """How many samples each rank sees per epoch, the padding, and the batch sizes that follow."""

    samples: int
    world_size: int
    batch_size: int
    per_rank: int
    padded: int
    steps_per_epoch: int
    last_batch: int
    grad_accum_steps: int = 1

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps per epoch: the micro-batches grouped grad_accum_steps at a time."""
        return math.ceil(self.steps_per_epoch / self.grad_accum_steps)

    @property
    def last_group(self) -> int:
        """Micro-batches in the epoch's last optimizer step."""
        return self.steps_per_epoch - (self.optimizer_steps - 1) * self.grad_accum_steps

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step over all ranks: world_size x batch_size x grad_accum_steps."""
        return self.world_size * self.batch_size * self.grad_accum_steps

    @property
    def mixes_micro_batch_sizes(self) -> bool:
        """True when the last optimizer step averages a short micro-batch with full ones (each weighted 1/k)."""
        return self.last_batch != self.batch_size and self.last_group > 1

    @property
    def equivalent_to_large_batch(self) -> bool:
        """True when the run sees exactly the batches one process with the global batch sees, weighted alike."""
        return self.padded == 0 and not self.mixes_micro_batch_sizes

    def explain(self) -> str:
        """One sentence on whether this run matches one process with the global batch, and why."""
        w, b, g = self.world_size, self.batch_size, self.global_batch
        if self.padded:
            return (f"not identical to one process with batch {g}: {self.samples} samples do not split "
                    f"evenly over {w} ranks, so the sampler repeats {self.padded} sample(s) every epoch "
                    f"and the last global batch ({w}x{self.last_batch}) counts them twice.")
        if self.mixes_micro_batch_sizes:
            return (f"not identical to one process with batch {g}: the epoch's last optimizer step accumulates "
                    f"{self.last_group} micro-batches of {b} and {self.last_batch} samples with equal weights, "
                    "where one large batch weights every sample equally.")
        if self.last_batch != b:
            return (f"identical to one process with batch {g}: each rank's last batch is short "
                    f"({self.last_batch} samples), and one process ends on the same {w * self.last_batch} samples.")
        return f"identical to one process with batch {g}: {self.samples} samples split into whole global batches."


def shard_plan(samples: int, world_size: int, batch_size: int, grad_accum_steps: int = 1) -> ShardPlan:
    """The DistributedSampler arithmetic (drop_last=False) for one epoch, micro-batches grouped for accumulation."""
    per_rank = math.ceil(samples / world_size)
    steps = math.ceil(per_rank / batch_size)
    last = per_rank - (steps - 1) * batch_size
    return ShardPlan(samples, world_size, batch_size, per_rank, per_rank * world_size - samples, steps, last,
                     grad_accum_steps)
