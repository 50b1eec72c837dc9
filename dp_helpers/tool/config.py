"""What the `train` job trains: TrainConfig, one field per flag, and its flags (torch-free, so the CLI starts fast).

Each field says its flag's help, minimum, choices and type; request.py checks a config against them, and more.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field, fields

from dp_helpers.tool.models import MODELS
from dp_helpers.tool.request import flag_words

DATA = ("synthetic", "digits")
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
    async_checkpoint: bool = option(False, "with --checkpoint: rank 0 copies the state into CPU memory and a background "
                                           "thread writes the file while training goes on, so no rank waits for the "
                                           "disk (the next save and the end of the run wait for the last write)")
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
