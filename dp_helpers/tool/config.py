"""The training job's explicit configuration and the sampler arithmetic, torch-free so the CLI starts fast (notebooks 01, 03)."""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from dp_helpers.tool.checks import UsageError, check_choice, check_int, check_positive_number

MODELS = ("linear", "mlp", "bn", "cnn")
DATA = ("synthetic", "digits")
DIGITS_TRAIN, DIGITS_HELD_OUT = 1500, 297  # scikit-learn's 1,797 digits, split once: 1,500 divide evenly over 1-6 ranks
SYNCS = ("ddp", "manual")
STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp", "hsdp")
COMMS = ("allreduce", "fp16", "powersgd", "local-sgd", "diloco")
POWERSGD_START = 10  # uncompressed steps first (torch suggests about a tenth of the run; 2 is the minimum)
BN_SYNCS = ("none", "allreduce", "syncbn")


def option(default, help: str, minimum: int | None = None, choices: tuple | None = None, kind: type | None = None):
    """A TrainConfig field with what its command-line flag and its check need: help text, minimum, choices, type."""
    return field(default=default, metadata={"help": help, "minimum": minimum, "choices": choices,
                                            "kind": kind or type(default)})


# what --model, --lr and --momentum mean when left out: each data set's own recipe (digits: 98.0 % held out after the
# default 10 epochs on 2 processes, measured; tests/test_train.py asserts >= 90 % after 2)
DATA_DEFAULTS = {"synthetic": {"model": "linear", "lr": 0.01, "momentum": 0.0},
                 "digits": {"model": "cnn", "lr": 0.05, "momentum": 0.9}}
DATA_NAMES = {"synthetic": "synthetic data", "digits": "digits"}


def per_data(name: str) -> str:
    """'(default: 0.01 with synthetic data, 0.05 with digits)': a help text's default, from DATA_DEFAULTS."""
    return "(default: " + ", ".join(f"{d[name]:g} with {DATA_NAMES[data]}" if isinstance(d[name], float) else
                                    f"{d[name]} with {DATA_NAMES[data]}" for data, d in DATA_DEFAULTS.items()) + ")"


def recipe(data: str) -> str:
    """'--model cnn --lr 0.05 --momentum 0.9': a data set's defaults as flags."""
    return " ".join(f"--{name} {value:g}" if isinstance(value, float) else f"--{name} {value}"
                    for name, value in DATA_DEFAULTS[data].items())


@dataclass(frozen=True)
class TrainConfig:
    """What the `train` job trains; the defaults reproduce the source article's problem. Each field is a flag."""

    # --model, --lr and --momentum left out (None) are filled from DATA_DEFAULTS when the config is built: to change
    # the data, build a new TrainConfig (dataclasses.replace would keep the old data's values)

    epochs: int = option(10, "passes over the data", minimum=1)
    batch_size: int = option(10, "samples per process per step (micro_batch_size); the global batch is "
                                 "world_size x batch_size x grad_accum_steps", minimum=1)
    lr: float = option(None, f"SGD learning rate {per_data('lr')}", kind=float)
    samples: int = option(100, "synthetic samples", minimum=1)
    dim: int = option(10, "features per sample", minimum=1)
    seed: int = option(0, "seeds data, weights and shuffling", minimum=0)
    data: str = option("synthetic", "synthetic: the source article's random features and 0/1 labels; digits: "
                                    "scikit-learn's bundled 8x8 handwritten digits (1,500 to train, 297 held out; its defaults "
                                    f"{recipe('digits')} reach about 98 percent held-out accuracy in the default 10 "
                                    "epochs on 2 processes)",
                       choices=DATA)
    model: str = option(None, "linear (the source article's), mlp, bn (a BatchNorm layer); cnn with --data digits "
                              f"{per_data('model')}", choices=MODELS, kind=str)
    sync: str = option("ddp", "ddp: DistributedDataParallel; manual: all_reduce the gradients by hand", choices=SYNCS)
    strategy: str = option("ddp", "ddp: every rank holds everything; zero1: DDP with torch's ZeroRedundancyOptimizer "
                                  "(optimizer state sharded); zero2: the course's ZeroOptimizer, stage 2 (gradients "
                                  "and state sharded); zero3: the course's Zero3Module (parameters too); fsdp: torch's "
                                  "fully_shard (parameters, gradients and state sharded); hsdp: fully_shard on a 2-D "
                                  "mesh, sharded within groups of --shard-size processes and replicated across them",
                       choices=STRATEGIES)
    shard_size: int = option(2, "with --strategy hsdp: processes per shard group; the world size must hold at least "
                                "2 such groups", minimum=2)
    comm: str = option("allreduce", "how the ranks' gradients meet (--strategy ddp): allreduce (DDP's default); fp16 "
                                    "(torch's fp16_compress_hook); powersgd (the course's PowerSGD hook, rank "
                                    f"--powersgd-rank, after {POWERSGD_START} uncompressed steps); local-sgd (each rank "
                                    "steps alone, parameters averaged every --period steps); diloco (inner steps as "
                                    "local-sgd, then an outer Nesterov SGD step on the averaged change)", choices=COMMS)
    powersgd_rank: int = option(1, "with --comm powersgd: the rank r of each gradient matrix's approximation",
                                minimum=1)
    period: int = option(4, "with --comm local-sgd or diloco: optimizer steps between two averages (H)", minimum=1)
    outer_lr: float = option(0.7, "with --comm diloco: the outer step's learning rate", kind=float)
    outer_momentum: float = option(0.5, "with --comm diloco: the outer step's Nesterov momentum (the paper's 0.9 "
                                        "suits an AdamW inner optimizer; over SGD with momentum it diverged here)",
                                   kind=float)
    check_grads: bool = option(False, "assert after every backward that all ranks hold identical gradients")
    grad_accum_steps: int = option(1, "micro-batches per optimizer step; DDP all-reduces only on the last (no_sync)",
                                   minimum=1)
    use_no_sync: bool = option(True, "with accumulation, skip the all-reduce of all but the last micro-batch")
    momentum: float = option(None, "SGD momentum: optimizer state that a checkpoint must carry "
                                   f"{per_data('momentum')}", kind=float)
    bn_sync: str = option("none", "with --model bn: per-rank statistics (none), an all-reduce by hand, or "
                                  "SyncBatchNorm (GPUs)", choices=BN_SYNCS)
    checkpoint: str = option("", "after every epoch rank 0 saves model, optimizer, epoch and history here (written "
                                 "whole, then renamed into place; a file already there is replaced); a restart resumes "
                                 "from it")
    resume: str = option("", "continue from this checkpoint (every rank loads it)")
    stop_after: int = option(0, "stop after this many epochs, as if interrupted (0: never)", minimum=0)
    fail_at: str = option("", "EPOCH:RANK: that rank kills itself (SIGKILL) halfway through that epoch (1-based), "
                              "once: a fault for --max-restarts to survive")

    def __post_init__(self):
        """Fill --model, --lr and --momentum left out (None) from the data's own recipe."""
        for name, value in DATA_DEFAULTS.get(self.data, {}).items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)  # frozen: set once, here

    def as_args(self) -> list[str]:
        """The fields that differ from the defaults, as worker command-line flags (a True bool is a bare flag)."""
        args, defaults = [], DATA_DEFAULTS.get(self.data, {})
        for f in fields(self):
            value = getattr(self, f.name)
            if value != defaults.get(f.name, f.default):
                args += flag_words(f.name, value)
        return args

    def as_dict(self) -> dict:
        """The config as a plain dict (for summary.json)."""
        return asdict(self)


def flag_words(name: str, value) -> list[str]:
    """A setting as command-line words: ['--lr', '0.01'], ['--check-grads'], ['--no-use-no-sync']."""
    flag = f"--{name.replace('_', '-')}"
    if isinstance(value, bool):
        return [flag if value else f"--no-{flag[2:]}"]
    return [flag, str(value)]


def validate(cfg: TrainConfig, world_size: int = 1) -> None:
    """Refuse a config that cannot train, with one sentence naming the flag and the fix."""
    for f in fields(cfg):
        value, meta = getattr(cfg, f.name), f.metadata
        check_kind(f.name, value, meta["kind"])
        if meta["minimum"] is not None:
            check_int(f.name, value, meta["minimum"])
        if meta["choices"] is not None:
            check_choice(f.name, value, meta["choices"])
    check_positive_number("lr", cfg.lr)
    check_momentum("momentum", cfg.momentum)
    if cfg.bn_sync != "none" and cfg.model != "bn":
        raise UsageError(f"bn_sync={cfg.bn_sync!r} only means something for model 'bn' (the one with BatchNorm); "
                         f"model {cfg.model!r} has no BatchNorm: drop --bn-sync or use --model bn.")
    check_strategy(cfg, world_size)
    check_comm(cfg)
    check_data(cfg)
    if cfg.fail_at:
        fault(cfg, world_size)
    check_paths(cfg)
    if train_samples(cfg) < world_size:
        raise UsageError(f"samples={cfg.samples} is fewer than world_size={world_size}: some ranks would "
                         "only see padding; use more samples or fewer processes.")


def check_momentum(name: str, value) -> None:
    """Refuse a momentum that is not a number in [0, 1)."""
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and 0 <= value < 1):
        raise UsageError(f"{name} must be a number in [0, 1), got {value!r}.")


def check_kind(name: str, value, kind: type) -> None:
    """Refuse a switch that is not True/False and a word that is not a string (numbers have their own checks)."""
    wanted = {bool: "True or False", str: "a string"}.get(kind)
    if wanted and not isinstance(value, kind):
        raise UsageError(f"{name} must be {wanted}, got {value!r} ({type(value).__name__}).")


def check_paths(cfg: TrainConfig) -> None:
    """Refuse a --resume file that is missing or a folder, and a --checkpoint whose folder does not exist."""
    if cfg.resume and Path(cfg.resume).is_dir():
        raise UsageError(f"resume={cfg.resume!r} is a folder; give the checkpoint file a --checkpoint run wrote.")
    if cfg.resume and not Path(cfg.resume).is_file():
        raise UsageError(f"resume={cfg.resume!r}: no such checkpoint file; give the path a --checkpoint run wrote.")
    if not cfg.checkpoint:
        return
    target = Path(cfg.checkpoint).expanduser().resolve()
    if target.is_dir():
        raise UsageError(f"checkpoint={cfg.checkpoint!r} is a folder; give a file name in it, e.g. {cfg.checkpoint}/ck.pt.")
    file_above = next((f for f in target.parents if f.is_file()), None)
    if file_above is not None:
        raise UsageError(f"checkpoint={cfg.checkpoint!r}: {file_above} is a file, not a folder; give a path in a folder.")
    if not target.parent.is_dir():
        raise UsageError(f"checkpoint={cfg.checkpoint!r}: its folder does not exist; create it first.")
    if not os.access(target.parent, os.W_OK | os.X_OK):  # the snapshot is written beside it, then renamed
        raise UsageError(f"checkpoint={cfg.checkpoint!r}: its folder {target.parent} is not writable.")


def train_samples(cfg: TrainConfig) -> int:
    """Training samples per epoch: --samples for the synthetic data, the fixed training split for digits."""
    return DIGITS_TRAIN if cfg.data == "digits" else cfg.samples


def check_data(cfg: TrainConfig) -> None:
    """Refuse a model that does not fit the data, and flags that describe synthetic data only."""
    if (cfg.data == "digits") != (cfg.model == "cnn"):
        raise UsageError(f"--data {cfg.data} and --model {cfg.model} do not fit: digits needs --model cnn (10 classes, "
                         "cross-entropy) and cnn needs --data digits (8x8 images); the other models take synthetic data.")
    defaults = TrainConfig()
    moved = [f"--{name}" for name in ("samples", "dim") if getattr(cfg, name) != getattr(defaults, name)]
    if cfg.data == "digits" and moved:
        raise UsageError(f"{' and '.join(moved)} {'describe' if len(moved) > 1 else 'describes'} the synthetic data; digits has its own fixed split "
                         f"({DIGITS_TRAIN} training and {DIGITS_HELD_OUT} held-out 8x8 images): drop {' '.join(moved)}.")


def fault(cfg: TrainConfig, world_size: int) -> tuple[int, int]:
    """--fail-at EPOCH:RANK as (0-based epoch, rank), or one sentence on what is wrong with it."""
    try:
        epoch, rank = (int(part) for part in cfg.fail_at.split(":"))
    except ValueError:
        raise UsageError(f"fail_at={cfg.fail_at!r}: write EPOCH:RANK, e.g. 2:1 (rank 1 dies in epoch 2).") from None
    if not (1 <= epoch <= cfg.epochs and 0 <= rank < world_size):
        raise UsageError(f"fail_at={cfg.fail_at!r}: the epoch must be 1..{cfg.epochs} and the rank 0..{world_size - 1}.")
    return epoch - 1, rank


def check_strategy(cfg: TrainConfig, world_size: int = 1) -> None:
    """Refuse what a sharded strategy cannot do: the flags that assume every rank holds the whole model and optimizer."""
    if cfg.shard_size != 2 and cfg.strategy != "hsdp":
        raise UsageError(f"--shard-size {cfg.shard_size} only means something with --strategy hsdp; drop it or add "
                         "--strategy hsdp.")
    if cfg.strategy == "hsdp":
        check_hybrid(cfg.shard_size, world_size)
    if cfg.strategy == "ddp":
        return
    clash = [name for name, on in (("--sync manual", cfg.sync == "manual"), ("--check-grads", cfg.check_grads),
                                   ("--bn-sync", cfg.bn_sync != "none"), ("--checkpoint", bool(cfg.checkpoint)),
                                   ("--resume", bool(cfg.resume))) if on]
    if clash:
        raise UsageError(f"--strategy {cfg.strategy} cannot be combined with {' or '.join(clash)} (they assume every "
                         "rank holds the whole model and optimizer); drop it or use --strategy ddp.")


def check_hybrid(shard_size: int, world_size: int) -> None:
    """Refuse a world size that does not make at least two shard groups of shard_size processes."""
    if world_size < 2 * shard_size or world_size % shard_size:
        raise UsageError(f"--strategy hsdp with --shard-size {shard_size} needs a world size that is a multiple of "
                         f"{shard_size} and at least {2 * shard_size} (two groups to replicate across), not "
                         f"{world_size}; e.g. --world-size {2 * shard_size}.")


def check_comm(cfg: TrainConfig) -> None:
    """Refuse a --comm that cannot apply, and its settings without it."""
    unused = [(f"--{name.replace('_', '-')} {getattr(cfg, name)}", comms) for name, comms in
              (("powersgd_rank", ("powersgd",)), ("period", ("local-sgd", "diloco")), ("outer_lr", ("diloco",)),
               ("outer_momentum", ("diloco",)))
              if getattr(cfg, name) != getattr(TrainConfig, name) and cfg.comm not in comms]
    if unused:
        flag, comms = unused[0]
        raise UsageError(f"{flag} only means something with --comm {' or '.join(comms)}; drop it or add that --comm.")
    check_positive_number("outer_lr", cfg.outer_lr)
    check_momentum("outer_momentum", cfg.outer_momentum)
    if cfg.comm == "allreduce":
        return
    if cfg.strategy != "ddp" or cfg.sync != "ddp":
        raise UsageError(f"--comm {cfg.comm} changes how DDP's gradients meet, so it needs --strategy ddp and --sync "
                         "ddp (the others reduce their own way).")
    local = cfg.comm in ("local-sgd", "diloco")
    clash = [name for name, on in (("--check-grads", cfg.check_grads and local), ("--checkpoint", bool(cfg.checkpoint)),
                                   ("--resume", bool(cfg.resume))) if on and cfg.comm != "fp16"]
    if clash:
        why = ("the ranks' gradients differ by design" if clash[0] == "--check-grads" else
               "each rank keeps state of its own (" + ("error feedback and Q factors" if cfg.comm == "powersgd" else
                                                       "weights between averages") + ") that a checkpoint does not save")
        raise UsageError(f"--comm {cfg.comm} cannot be combined with {clash[0]}: {why}.")


def add_train_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per TrainConfig field (--batch-size for batch_size), its default, type, choices and help from the field."""
    for f in fields(TrainConfig):
        flag, meta = f"--{f.name.replace('_', '-')}", f.metadata
        if isinstance(f.default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=meta["help"])
        else:
            parser.add_argument(flag, type=meta["kind"], default=f.default, choices=meta["choices"],
                                help=meta["help"])


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """Pick the TrainConfig fields out of parsed flags."""
    return TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})


def worker_parser() -> argparse.ArgumentParser:
    """Flags of the worker script: the training config plus the run folder."""
    parser = argparse.ArgumentParser(description="DDP training worker (under torchrun, or alone as world size 1).")
    add_train_flags(parser)
    parser.add_argument("--out", default=None,
                        help="run folder (default: the launcher's, or a new one under runs/ when run alone)")
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
        """True when the last optimizer step accumulates a short micro-batch with full ones (each weighted by its size)."""
        return self.last_batch != self.batch_size and self.last_group > 1

    @property
    def equivalent_to_large_batch(self) -> bool:
        """True when the run sees exactly the batches one process with the global batch sees, weighted alike."""
        return self.padded == 0  # micro-batches of unequal size are weighted by their size, as one large batch

    def explain(self) -> str:
        """One sentence on whether this run matches one process with the global batch, and why."""
        w, g = self.world_size, self.global_batch
        if self.padded:
            verb = "does" if self.samples == 1 else "do"
            times = "twice" if self.padded <= self.samples else "more than once"  # the sampler repeats from the start
            return (f"not identical to one process with batch {g}: {plural(self.samples, 'sample')} {verb} not split "
                    f"evenly over {w} ranks, so the sampler repeats {self.padded} sample(s) every epoch "
                    f"and the last global batch ({w}x{self.last_batch}) counts them {times}.")
        same = f"identical to one process with batch {g}"
        whole, rest = divmod(self.samples, g)
        if not rest:
            return f"{same}: {self.samples} samples split into {plural(whole, 'whole global batch', 'whole global batches')}."
        return (f"{same}: one process's last batch holds the remaining {plural(rest, 'sample')}, and so does this "
                f"run's last optimizer step: {self.last_step()}.")

    def last_step(self) -> str:
        """How the epoch's last optimizer step is made up, in words (for explain)."""
        b, k = self.batch_size, self.last_group
        if self.last_batch == b:
            return f"it accumulates only {k} of {self.grad_accum_steps} micro-batches"
        if k == 1:
            return f"each rank's last batch is short ({plural(self.last_batch, 'sample')})"
        return (f"it accumulates {k} micro-batches ({plural(k - 1, 'full one', 'full ones')} of {b} samples and one "
                f"of {self.last_batch}), each weighted by its size, as one large batch weights every sample")


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 sample', '2 samples'; irregular plurals given: plural(2, 'process', 'processes')."""
    return f"{n} {word if n == 1 else many or word + 's'}"


def shard_plan(samples: int, world_size: int, batch_size: int, grad_accum_steps: int = 1) -> ShardPlan:
    """The DistributedSampler arithmetic (drop_last=False) for one epoch, micro-batches grouped for accumulation."""
    per_rank = math.ceil(samples / world_size)
    steps = math.ceil(per_rank / batch_size)
    last = per_rank - (steps - 1) * batch_size
    return ShardPlan(samples, world_size, batch_size, per_rank, per_rank * world_size - samples, steps, last,
                     grad_accum_steps)
