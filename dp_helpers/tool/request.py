"""The train request, checked in one room: every check that can run before anything starts, in the order it runs.

`check_train_request` is the door (the CLI's `train` and run_train() call it). In order, each refusing the first
problem in one sentence (a UsageError):
1. the machine: what it has (env.machine, read once) and the world size asked for (`plan_world_size`);
2. the config, each flag alone, then the flags that contradict each other, then the files they name (`validate`);
3. the request on this machine: its outputs, the backend, the CPU processes, SyncBatchNorm, restarts
   (`check_outputs`, `check_machine` with `resolve_backend`, `check_restarts`);
4. the launch, what every run_ddp() checks (`check_launch`): the script, its arguments and environment, the timeout,
   the nodes, the echo, and the run folder (`check_out_dir`);
5. a --resume checkpoint this run can continue and a --fail-at it trains, and the steps rank 0 will log
   (`progress_steps`, the sampler's arithmetic last).
The checks call down only: env's facts, the sampler's arithmetic, and, to read a --resume checkpoint, torch and the
model's shapes (models). run_ddp() runs check_launch again (a notebook launches scripts without a train request) and
the training script validate() again (a script run alone). A new check goes into the step it belongs to; a new
flag's check comes with its field in config.TrainConfig (its minimum, choices and type) or into `validate`.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import NamedTuple

from dp_helpers.tool import env as machine_facts
from dp_helpers.tool.errors import UsageError  # noqa: F401 (its home for every module that refuses bad input)
from dp_helpers.tool.sampler import shard_plan

DIGITS_TRAIN, DIGITS_HELD_OUT = 1500, 297  # scikit-learn's 1,797 digits, split once: 1,500 divide evenly over 1-6 ranks


# The errors, and the checks every step uses


class MissingFileError(UsageError, FileNotFoundError):
    """A file the request names does not exist: a UsageError that `except FileNotFoundError` also catches."""


def check_int(name: str, value, minimum: int) -> None:
    """Refuse a value that is not a real int (bools too) or is below minimum."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{name} must be an int, got {value!r} ({type(value).__name__}).")
    if value < minimum:
        raise UsageError(f"{name} must be >= {minimum}, got {value}.")
    if value >= 2**63:  # torch keeps its integers (a seed, a size) in 64 bits
        raise UsageError(f"{name} must be below 2**63 (a 64-bit integer), got {value}.")


def check_positive_number(name: str, value) -> None:
    """Refuse a value that is not a finite number > 0 (NaN and inf too)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"{name} must be a number, got {value!r} ({type(value).__name__}).")
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{name} must be a finite number > 0, got {value}.")


def check_choice(name: str, value, choices) -> None:
    """Refuse a value that is not one of choices."""
    if value not in choices:
        raise UsageError(f"{name} must be one of {', '.join(map(str, choices))}, got {value!r}.")


def check_momentum(name: str, value) -> None:
    """Refuse a momentum that is not a number in [0, 1)."""
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and 0 <= value < 1):
        raise UsageError(f"{name} must be a number in [0, 1), got {value!r}.")


def check_kind(name: str, value, kind: type) -> None:
    """Refuse a switch that is not True/False and a word that is not a string (numbers have their own checks)."""
    wanted = {bool: "True or False", str: "a string"}.get(kind)
    if wanted and not isinstance(value, kind):
        raise UsageError(f"{name} must be {wanted}, got {value!r} ({type(value).__name__}).")


def env_seconds(name: str, default: float, env: Mapping[str, str] | None = None) -> float:
    """A timeout in seconds from the environment (default when unset); anything but a positive number is refused."""
    raw = (os.environ if env is None else env).get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{name}={raw!r} in the environment: it must be a positive number of seconds; "
                         "unset it for the default.")
    return value


def flag_words(name: str, value) -> list[str]:
    """A setting as command-line words: ['--lr', '0.01'], ['--check-grads'], ['--no-use-no-sync']."""
    flag = f"--{name.replace('_', '-')}"
    if isinstance(value, bool):
        return [flag if value else f"--no-{flag[2:]}"]
    return [flag, str(value)]


# 1. The machine: the world size and the backend it can run


def plan_world_size(world_size: int | None, backend: str, machine: machine_facts.Machine | None = None) -> int:
    """The requested world size, checked; by default one process per GPU with >= 2 GPUs, else 2 CPU processes."""
    if world_size is None:
        world_size = 2 if backend == "gloo" else (machine or machine_facts.machine()).world_size
    check_int("world_size", world_size, 1)
    return world_size


def resolve_backend(backend: str, world_size: int, n_gpus: int | None = None,
                    has_nccl: bool | None = None, local_world_size: int | None = None) -> str:
    """Turn 'auto' into a concrete backend and refuse a combination that cannot run, in one sentence."""
    check_choice("backend", backend, machine_facts.BACKENDS)
    n_gpus = machine_facts.gpu_count() if n_gpus is None else n_gpus
    has_nccl = machine_facts.nccl_available() if has_nccl is None else has_nccl
    local_world = world_size if local_world_size is None else local_world_size  # processes on this node
    if backend == "auto":
        return "nccl" if has_nccl and n_gpus >= max(local_world, 2) else "gloo"
    if backend == "nccl" and not has_nccl:
        raise UsageError("backend 'nccl' is not built into this torch (a CPU build?); use backend 'gloo'.")
    if backend == "nccl" and n_gpus < local_world:
        raise UsageError(f"backend 'nccl' needs one GPU per process: {local_world} processes per node "
                         f"but {n_gpus} GPU(s) visible; lower the world size or use backend 'gloo'.")
    return backend


# 2. The config: each flag alone, then flags that contradict each other, then the files they name


def validate(cfg, world_size: int = 1) -> None:
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
    if cfg.async_checkpoint and not cfg.checkpoint:
        raise UsageError("--async-checkpoint changes how --checkpoint writes its snapshots, and there is no "
                         "--checkpoint FILE: add one or drop --async-checkpoint.")
    check_paths(cfg)
    if train_samples(cfg) < world_size:
        raise UsageError(f"samples={cfg.samples} is fewer than world_size={world_size}: some ranks would "
                         "only see padding; use more samples or fewer processes.")


def check_paths(cfg) -> None:
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


def default(cfg, name: str):
    """A config field's default (what the flag means when left out)."""
    return next(f.default for f in fields(cfg) if f.name == name)


def train_samples(cfg) -> int:
    """Training samples per epoch: --samples for the synthetic data, the fixed training split for digits."""
    return DIGITS_TRAIN if cfg.data == "digits" else cfg.samples


def check_data(cfg) -> None:
    """Refuse a model that does not fit the data, and flags that describe synthetic data only."""
    if (cfg.data == "digits") != (cfg.model == "cnn"):
        raise UsageError(f"--data {cfg.data} and --model {cfg.model} do not fit: digits needs --model cnn (10 classes, "
                         "cross-entropy) and cnn needs --data digits (8x8 images); the other models take synthetic data.")
    moved = [f"--{name}" for name in ("samples", "dim") if getattr(cfg, name) != default(cfg, name)]
    if cfg.data == "digits" and moved:
        raise UsageError(f"{' and '.join(moved)} {'describe' if len(moved) > 1 else 'describes'} the synthetic data; digits has its own fixed split "
                         f"({DIGITS_TRAIN} training and {DIGITS_HELD_OUT} held-out 8x8 images): drop {' '.join(moved)}.")


def fault(cfg, world_size: int) -> tuple[int, int]:
    """--fail-at EPOCH:RANK as (0-based epoch, rank), or one sentence on what is wrong with it."""
    try:
        epoch, rank = (int(part) for part in cfg.fail_at.split(":"))
    except ValueError:
        raise UsageError(f"fail_at={cfg.fail_at!r}: write EPOCH:RANK, e.g. 2:1 (rank 1 dies in epoch 2).") from None
    if not (1 <= epoch <= cfg.epochs and 0 <= rank < world_size):
        raise UsageError(f"fail_at={cfg.fail_at!r}: the epoch must be 1..{cfg.epochs} and the rank 0..{world_size - 1}.")
    return epoch - 1, rank


def check_strategy(cfg, world_size: int = 1) -> None:
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


def check_comm(cfg) -> None:
    """Refuse a --comm that cannot apply, and its settings without it."""
    unused = [(f"--{name.replace('_', '-')} {getattr(cfg, name)}", comms) for name, comms in
              (("powersgd_rank", ("powersgd",)), ("period", ("local-sgd", "diloco")), ("outer_lr", ("diloco",)),
               ("outer_momentum", ("diloco",)))
              if getattr(cfg, name) != default(cfg, name) and cfg.comm not in comms]
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


# 3. The request on this machine (check_train_request runs the five steps)


class TrainPlan(NamedTuple):
    """What a checked train request will run: its world size and backend, and the steps rank 0 will log."""

    world_size: int
    backend: str
    steps: int | None


def check_train_request(cfg, world_size: int | None = None, backend: str = "auto", oversubscribe: bool = False,
                        max_restarts: int = 0, out_dir=None, timeout: float | None = None, link=None) -> TrainPlan:
    """Refuse a request that cannot run, in one sentence, before anything starts; what it will run."""
    machine = machine_facts.machine()  # what this machine has, read once
    world_size = plan_world_size(world_size, backend, machine)
    validate(cfg, world_size)  # each flag alone, then flags that contradict each other, then the files they name
    check_outputs(cfg, out_dir)  # the snapshot must not be one of the run folder's own files
    resolved = check_machine(cfg, world_size, backend, oversubscribe, machine)  # what this machine can run
    check_restarts(max_restarts, cfg)  # a restarted group needs a snapshot to resume from
    check_launch("dp_helpers.scripts.train", (), world_size, backend, out_dir, timeout, max_restarts=max_restarts,
                 machine=machine, link=link)  # what run_ddp() checks again: the script, the timeout, the run folder
    return TrainPlan(world_size, resolved, progress_steps(cfg, world_size))  # reads a --resume checkpoint


RUN_FILES = ("model.pt", "summary.json", "console.log", "loss.png", "failures.json", "restarts.jsonl")
RUN_FOLDERS = ("metrics", "logs")


def check_outputs(cfg, out_dir) -> None:
    """Refuse a --checkpoint inside the run folder: one of the run's own files (model.pt, metrics/...), or any other."""
    if not cfg.checkpoint or out_dir is None or not str(out_dir).strip():  # an empty --out: check_out_dir's
        return
    target, folder = (Path(p).expanduser().resolve() for p in (cfg.checkpoint, out_dir))
    inside = target.relative_to(folder) if target.is_relative_to(folder) and target != folder else None
    if inside is not None and (str(inside) in RUN_FILES or inside.parts[0] in RUN_FOLDERS):
        raise UsageError(f"--checkpoint {cfg.checkpoint} is the run folder's own {inside}: the run would overwrite "
                         "the snapshot with it; give the checkpoint another name, e.g. ck.pt.")
    if inside is not None:  # its lock, <checkpoint>.lock, is written before the launcher wants the folder new or empty
        raise UsageError(f"--checkpoint {cfg.checkpoint} lies in the run folder {out_dir}, which must be new or empty "
                         "when the run starts: keep the checkpoint outside it.")


def check_machine(cfg, world_size: int, backend: str, oversubscribe: bool, machine) -> str:
    """Refuse what this machine cannot run (far more CPU processes than cores, SyncBatchNorm without GPUs); the backend."""
    backend = resolve_backend(backend, world_size, machine.gpus, machine.nccl)
    if cfg.bn_sync == "syncbn" and backend != "nccl":
        raise UsageError("bn_sync 'syncbn' needs one GPU per process on nccl (SyncBatchNorm refuses CPU tensors); "
                         "use --bn-sync allreduce, the same statistics by hand.")
    limit = max(8, 4 * machine.cores)
    if backend == "gloo" and world_size > limit and not oversubscribe:
        raise UsageError(f"world size {world_size} means {world_size} CPU processes on {machine.cores} core(s); "
                         f"use at most {limit}, or pass --oversubscribe if you mean it.")
    return backend


def check_restarts(max_restarts: int, cfg) -> None:
    """Refuse --max-restarts below 0, or above 0 without --checkpoint (a restarted group would start from scratch)."""
    check_int("max_restarts", max_restarts, 0)
    if max_restarts and cfg.strategy != "ddp":
        raise UsageError(f"--max-restarts {max_restarts} needs --checkpoint, which --strategy {cfg.strategy} does not "
                         "write: restarts that resume are available with --strategy ddp.")
    if max_restarts and not cfg.checkpoint:
        raise UsageError(f"--max-restarts {max_restarts} needs --checkpoint FILE: a restarted group resumes from the last "
                         "snapshot, and without one it would start over from epoch 1.")


# 4. A launch: what every run_ddp() checks


def check_launch(script, script_args, world_size: int | None, backend: str, out_dir, timeout, nnodes: int = 1,
                 node_rank: int = 0, rdzv_endpoint: str | None = None, env=None, progress: int | None = None,
                 max_restarts: int = 0, echo=True, machine=None, link=None) -> tuple[list[str], int, str]:
    """Refuse a launch that cannot start; returns torchrun's target, the world size and the backend it will use."""
    check_echo(echo)
    target = resolve_target(script)
    check_args(script_args, env, timeout)
    world_size = plan_world_size(world_size, backend, machine)
    check_nodes(world_size, nnodes, node_rank, rdzv_endpoint)
    if progress is not None:
        check_int("progress", progress, 1)
    check_int("max_restarts", max_restarts, 0)
    facts = {} if machine is None else {"n_gpus": machine.gpus, "has_nccl": machine.nccl}
    backend = resolve_backend(backend, world_size, local_world_size=world_size // nnodes, **facts)
    check_link(link, backend)
    check_out_dir(out_dir)
    return target, world_size, backend


def check_link(link, backend: str) -> None:
    """Refuse an emulated link that is not BANDWIDTH[,LATENCY], or one asked of a backend other than gloo."""
    if link is None:
        return
    # imports torch.distributed: only when a link is asked for
    from dp_helpers.tool.link import parse_link, torch_too_old

    if not isinstance(link, str):
        raise UsageError(f"link must be a string such as '1gbit,20us', got {type(link).__name__}.")
    try:
        parse_link(link)
    except ValueError as exc:
        raise UsageError(f"{exc}.") from None
    if reason := torch_too_old():
        raise UsageError(f"{reason}.")
    if backend != "gloo":
        raise UsageError(f"an emulated link wraps gloo between CPU processes; this run would use {backend}: pass "
                         "backend='gloo' (--backend gloo), or measure the real link instead.")


def resolve_target(script) -> list[str]:
    """A .py path -> [path]; a dotted module name -> ['-m', name]; anything else is refused in one sentence."""
    if not isinstance(script, (str, os.PathLike)):
        raise UsageError(f"script must be a path or a module name, got {type(script).__name__}.")
    text = os.fspath(script)
    path = Path(text).expanduser()
    if isinstance(script, os.PathLike) or text.endswith(".py") or os.sep in text or path.exists():
        if not path.exists():
            raise MissingFileError(f"script not found: {path.resolve()}")
        if not path.is_file() or path.suffix != ".py":
            raise UsageError(f"script must be a .py file, got {path.resolve()}.")
        return [str(path.resolve())]
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", text) or importlib.util.find_spec(text) is None:
        raise UsageError(f"no script file or importable module named {text!r}.")
    return ["-m", text]


def check_args(script_args, env, timeout) -> None:
    """Refuse script arguments, env and timeout of the wrong kind."""
    for arg in script_args:
        if isinstance(arg, bool) or not isinstance(arg, (str, int, float, os.PathLike)):
            raise UsageError(f"script arguments must be str, int, float or Path, got {arg!r}.")
    if env is not None and (not isinstance(env, Mapping) or
                            not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise UsageError("env must be a mapping of str to str.")
    if timeout is not None:  # None: no limit
        check_positive_number("timeout", timeout)
    check_env_numbers({**os.environ, **(env or {})})


ENV_SECONDS = ("DP_PG_TIMEOUT", "DP_PROBE_TIMEOUT")  # read by every rank: a bad value is refused here, before a start


def check_env_numbers(env: Mapping[str, str]) -> None:
    """Refuse a DP_* timeout in the environment that is not a positive number of seconds, naming the variable."""
    for name in ENV_SECONDS:
        env_seconds(name, 0, env)


def check_nodes(world_size: int, nnodes: int, node_rank: int, rdzv_endpoint: str | None) -> None:
    """Refuse an impossible node layout."""
    check_int("nnodes", nnodes, 1)
    check_int("node_rank", node_rank, 0)
    if node_rank >= nnodes:
        raise UsageError(f"node_rank must be < nnodes={nnodes}, got {node_rank}.")
    if world_size % nnodes:
        raise UsageError(f"world_size={world_size} must be a multiple of nnodes={nnodes} (same processes per node).")
    if nnodes > 1 and not (isinstance(rdzv_endpoint, str) and re.fullmatch(r"[^\s:]+:\d{1,5}", rdzv_endpoint)):
        raise UsageError(f"several nodes need rdzv_endpoint='host:port' of node 0, got {rdzv_endpoint!r}.")


def check_echo(echo) -> None:
    """Refuse an echo that is not True, False or "all" (every line, tracebacks too: by default only their last line)."""
    if echo not in (True, False, "all") or isinstance(echo, (int, float)) and not isinstance(echo, bool):
        raise UsageError(f"echo must be True, False or 'all', got {echo!r}.")


def check_out_dir(out_dir) -> None:
    """Refuse a run folder that is an empty name, a file, or already holds a run or anything else."""
    if out_dir is None:  # a new one under runs/
        return
    if not str(out_dir).strip():
        raise UsageError("the output folder is an empty string; give a folder name, or none for a new one under runs/.")
    run_dir = Path(out_dir).expanduser().resolve()
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"output folder {run_dir} is a file; give a folder (new or empty) for the run.")
    if (run_dir / "metrics").exists() or (run_dir / "summary.json").exists():
        raise UsageError(f"output folder {run_dir} already holds a run; choose a new folder or delete it.")
    if run_dir.is_dir() and any(run_dir.iterdir()):
        raise UsageError(f"output folder {run_dir} exists and is not empty; a run writes into a new or empty folder.")


# 5. A --resume checkpoint this run can continue, and the steps rank 0 will log


def read_checkpoint(path: str) -> dict:
    """A checkpoint written by scripts/train.py (model, optimizer, epoch, step, and the run's settings), on the CPU."""
    import pickle

    import torch  # only when resuming: the rest of the room is torch-free, so the CLI starts fast

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        int(state["epoch"]), state["model"].items()  # noqa: B018 - the fields every checkpoint has
        return state
    # unreadable (OSError, EOFError), not a torch file (RuntimeError), unsafe pickle (UnpicklingError),
    # or a torch file without an epoch (KeyError, TypeError, IndexError, ValueError)
    except (OSError, EOFError, RuntimeError, pickle.UnpicklingError, KeyError, TypeError, IndexError,
            ValueError) as exc:
        raise UsageError(f"{path} is not a checkpoint written by --checkpoint ({type(exc).__name__}).") from exc
    except AttributeError as exc:  # "model" is not a state_dict
        raise UsageError(f"{path} is not a checkpoint written by --checkpoint ({type(exc).__name__}).") from exc


# what a resumed run must keep, or it would train another job than the checkpoint's (the sizes are checked apart)
RESUMED_SETTINGS = ("lr", "momentum", "data", "samples", "dim", "sync", "strategy", "use_no_sync", "bn_sync", "comm")


def changed_settings(state: dict, cfg) -> dict:
    """The checkpoint's value of each training setting this run changes (older checkpoints: the optimizer's lr, momentum)."""
    theirs = dict(state.get("config") or {})
    groups = state.get("optimizer", {}).get("param_groups") if isinstance(state.get("optimizer"), dict) else None
    for key in ("lr", "momentum"):
        if key not in theirs and groups and key in groups[0]:
            theirs[key] = groups[0][key]
    return {k: theirs[k] for k in RESUMED_SETTINGS if k in theirs and theirs[k] != getattr(cfg, k)}


def as_flags(settings: dict) -> str:
    """Settings as the command line writes them: --lr 0.01 --no-use-no-sync."""
    return " ".join(word for name, value in settings.items() for word in flag_words(name, value))


def check_resume(cfg) -> int:
    """Refuse, in one sentence, a checkpoint this run cannot continue; returns the epoch it resumes from."""
    # another world size, batch size or accumulation is fine: whole tensors, written at an epoch's end
    state = read_checkpoint(cfg.resume)
    changed = changed_settings(state, cfg)
    theirs = {k: tuple(v.shape) for k, v in state["model"].items()}
    if model_shapes(cfg) != theirs:
        raise UsageError(f"{cfg.resume} holds another model's weights ({', '.join(f'{k} {list(s)}' for k, s in theirs.items())}); "
                         f"resume with the --model and --dim it was trained with (now: --model {cfg.model} --dim {cfg.dim}).")
    if int(state["epoch"]) >= cfg.epochs:
        raise UsageError(f"{cfg.resume} finished epoch {state['epoch']} of --epochs {cfg.epochs}: nothing is left to "
                         "train; raise --epochs to continue.")
    if changed:
        raise UsageError(f"{cfg.resume} was trained with {as_flags(changed)}, and resuming continues that training: "
                         f"resume with the same (now: {as_flags({k: getattr(cfg, k) for k in changed})}).")
    if "seed" in state and state["seed"] != cfg.seed:  # the sampler's permutation
        raise UsageError(f"{cfg.resume} was written with --seed {state['seed']}; resume with the same (now: {cfg.seed}).")
    return int(state["epoch"])


def model_shapes(cfg) -> dict:
    """The shape of every tensor in the state dict of the model this config builds."""
    from dp_helpers.tool.models import build_model

    return {k: tuple(v.shape) for k, v in build_model(cfg.model, cfg.dim, cfg.seed).state_dict().items()}


def progress_steps(cfg, world_size: int) -> int | None:
    """Optimizer steps rank 0 will log (a metrics line each), after checking --resume and that --fail-at fires."""
    last, first = (min(cfg.epochs, cfg.stop_after) if cfg.stop_after else cfg.epochs), 0
    if cfg.resume:
        first = check_resume(cfg)
        if cfg.stop_after and cfg.stop_after <= first:
            raise UsageError(f"--stop-after {cfg.stop_after} stops at or before epoch {first}, where {cfg.resume} "
                             "resumes: nothing would train; raise --stop-after or leave it out.")
    if cfg.fail_at and not first <= fault(cfg, world_size)[0] < last:  # before its --resume point, after --stop-after
        trained = f"epoch {last}" if last == first + 1 else f"epochs {first + 1} to {last}"
        raise UsageError(f"--fail-at {cfg.fail_at} would never fire: this run trains only {trained}; pick an epoch "
                         "it trains.")
    plan = shard_plan(train_samples(cfg), world_size, cfg.batch_size, cfg.grad_accum_steps)
    return plan.optimizer_steps * max(last - first, 0) or None
