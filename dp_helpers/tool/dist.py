"""worker(), setup(), teardown() for scripts run under torchrun or alone: explicit rank info, a short timeout, no globals (notebook 03)."""

from __future__ import annotations

import gc
import json
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP

from dp_helpers.tool.env import device_for
from dp_helpers.tool.files import write_text_atomic
from dp_helpers.tool.request import UsageError, env_seconds, resolve_backend
from dp_helpers.tool.runs import fresh_run_dir

DEFAULT_PG_TIMEOUT_S = 30.0
# init_process_group's timeout also bounds its wait for the other ranks to arrive, and on a busy machine one rank can
# finish importing torch seconds after another: measured, a rank 5 s late failed a 3 s group at its start-up
STARTUP_S = 60.0


@dataclass(frozen=True)
class DistInfo:
    """Who this process is in the group, where its tensors live and where the run writes."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str
    is_main: bool
    run_dir: Path

    def tag(self) -> str:
        """The '[rank r/W]' prefix for per-rank lines."""
        return f"[rank {self.rank}/{self.world_size}]"


def torchrun_env() -> tuple[int, int, int, int]:
    """RANK, LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE from torchrun; (0, 0, 1, 1) for a script run alone."""
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
    present = [k for k in names if k in os.environ]
    if not present:
        return 0, 0, 1, 1
    if len(present) < len(names):
        raise SystemExit(f"{', '.join(k for k in names if k not in present)} not set while {', '.join(present)} "
                           "is: start the script with torchrun (python -m torch.distributed.run) or alone, not half-way.")
    rank, local_rank, world_size = (int(os.environ[k]) for k in names)
    if world_size > 1 and "TORCHELASTIC_RUN_ID" not in os.environ:  # torchrun sets it for every worker it starts
        raise SystemExit(f"RANK={rank} and WORLD_SIZE={world_size} are set, but torchrun did not start this process "
                         "(a shell left over from another run?): the other ranks would never come. Start it with "
                         "torchrun, or unset RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT to run alone.")
    return rank, local_rank, world_size, int(os.environ.get("LOCAL_WORLD_SIZE", world_size))


def default_run_dir() -> Path:
    """The launcher's run folder; under a bare torchrun one per run id; alone a fresh one under runs/."""
    script = Path(sys.argv[0]).stem or "script"
    if "DP_RUN_DIR" in os.environ:
        return Path(os.environ["DP_RUN_DIR"])
    if "TORCHELASTIC_RUN_ID" in os.environ:  # the same on every rank of one torchrun
        return Path("runs") / f"{script}-{os.environ['TORCHELASTIC_RUN_ID']}"
    return fresh_run_dir(script)


def exit_when_orphaned(poll_s: float = 0.5) -> threading.Thread:
    """Start a daemon thread that ends this worker if its launcher dies (a SIGKILLed torchrun cannot stop us)."""
    parent = os.getppid()

    def watch() -> None:
        """Poll the parent pid; exit the process once it changes."""
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(70)  # os._exit works even while the main thread is stuck in a collective

    thread = threading.Thread(target=watch, name="dp-orphan-watchdog", daemon=True)
    thread.start()
    return thread


def check_agent_store() -> None:
    """Under torchrun the agent serves the rendezvous store before any worker starts: refuse at once if none answers."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or not addr or not (port or "").isdigit():
        return  # another launcher: rank 0 itself may host the store, so nothing answers yet
    try:
        socket.create_connection((addr, int(port)), timeout=5).close()
    except OSError as exc:
        raise SystemExit(f"torchrun's rendezvous store at {addr}:{port} does not answer ({exc.strerror or exc}): "
                         "these RANK/WORLD_SIZE/MASTER_* variables are left over from a torchrun that has ended. "
                         "Start the script with torchrun, or unset RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, "
                         "MASTER_PORT and TORCHELASTIC_* to run alone.") from None


def init_then_narrow(init, timeout_s: float, *args, **kwargs):
    """init(*args, **kwargs) waiting up to STARTUP_S for every rank; then the group's collectives time out in timeout_s."""
    narrow = getattr(dist.distributed_c10d, "_set_pg_timeout", None)  # torch's own setter (private): where absent,
    kwargs["timeout"] = timedelta(seconds=max(timeout_s, STARTUP_S) if narrow else timeout_s)  # one timeout for both
    result = init(*args, **kwargs)
    if narrow:
        narrow(timedelta(seconds=timeout_s))
    return result


def init_group(backend: str, rank: int, world_size: int, timeout_s: float) -> None:
    """Join torchrun's group (address in the environment), or form a group of one without torchrun."""
    if "RANK" in os.environ:
        init_then_narrow(dist.init_process_group, timeout_s, backend)
    else:  # alone: an in-memory store, so a debugger can step through the same DDP code
        init_then_narrow(dist.init_process_group, timeout_s, backend, store=dist.HashStore(), rank=rank,
                         world_size=world_size)


def setup(backend: str | None = None, timeout_s: float | None = None, run_dir=None) -> DistInfo:
    """Join the process group (torchrun's, or one of size 1 alone); a mismatched collective then fails within timeout_s."""
    rank, local_rank, world_size, local_world_size = torchrun_env()
    backend = resolve_backend(backend or os.environ.get("DP_BACKEND", "auto"), world_size,
                              local_world_size=local_world_size)
    timeout_s = float(timeout_s or env_seconds("DP_PG_TIMEOUT", DEFAULT_PG_TIMEOUT_S))
    device = device_for(backend, local_rank)
    if device.type != "cpu":
        torch.cuda.set_device(device)
    if "RANK" in os.environ:
        exit_when_orphaned()
        check_agent_store()
    init_group(backend, rank, world_size, timeout_s)
    run_dir = Path(run_dir or default_run_dir())
    run_dir.mkdir(parents=True, exist_ok=True)
    return DistInfo(rank, local_rank, world_size, device, backend, rank == 0, run_dir)


def teardown() -> None:
    """Free unreachable DDP models, then destroy the process group if one exists (safe in a finally block)."""
    # A DDP wrapper sits in reference cycles; if the garbage collector only reaches it at interpreter
    # exit, its gloo work dies after the group and the process aborts ("terminate called without an
    # active exception"): measured in 5 of 12 four-rank runs on torch 2.13, 0 of 15 with this collect.
    gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def worker(main: Callable[[DistInfo], object], **setup_args) -> None:
    """Run main(info) as one rank: join the group, leave it, record an exception for the launcher, exit with its code."""
    @record  # an exception is written to torchrun's error file: the launcher names this rank and its error
    def run() -> None:
        """Setup, main, teardown; after an exception no teardown: the exit below closes the connections."""
        info = setup(**setup_args)
        # destroying the group first would let the peers fail and torchrun stop this rank (SIGTERM)
        # before its error file is written and it exits with its own code
        main(info)
        teardown()

    exit_without_finalizing(run)


def exit_without_finalizing(run: Callable[[], object]) -> None:
    """Call run(), then end the process with its exit code (1 after an exception, printed) and no finalization."""
    # torch 2.13 keeps the gloo group's threads alive once a DDP model was built, even after
    # destroy_process_group(); interpreter finalization then sometimes aborts the process (SIGABRT
    # "terminate called without an active exception"), also after an exception, whose traceback keeps
    # the model alive. So every ending skips finalization: the exit code says what happened.
    try:
        run()
        code = 0
    except SystemExit as exc:  # argparse: 0 after --help, 2 after a bad flag (its message is printed)
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int) and exc.code is not None:
            print(exc.code, file=sys.stderr)  # sys.exit("message") prints its message, as Python would
    except UsageError as exc:  # bad input (a bare run's flags, a checkpoint in use): one sentence, as the CLI says it
        print(f"error: {exc}", file=sys.stderr)
        code = 2
    except BaseException:  # @record has written the error file; the traceback goes to stderr as usual
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    if code == 0 and os.environ.get("DP_FORKED_RANK") == str(os.getpid()):
        return  # forked by torchrun's agent (--start-method fork): it waits for the return; a fork's exit never finalizes
    os._exit(code)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside a DDP wrapper (the model itself when it is not wrapped)."""
    return model.module if isinstance(model, DDP) else model


def wrap_ddp(model: torch.nn.Module, info: DistInfo, bucket_cap_mb: float | None = None,
             gradient_as_bucket_view: bool = False) -> DDP:
    """DDP around a model already on info.device; the constructor broadcasts rank 0's parameters and buffers."""
    return DDP(
        model,
        # one GPU per process: its index; on CPU it must be None (the module's own device is used)
        device_ids=[info.device] if info.device.type != "cpu" else None,
        # gradients are all-reduced in buckets of about this many MiB; None keeps torch's default
        **({} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}),
        # True: each .grad is a view into its bucket, so gradients are stored once instead of twice
        gradient_as_bucket_view=gradient_as_bucket_view,
        # buffers (BatchNorm's running statistics) keep the default: rank 0's are broadcast before a forward,
        # unless the previous forward ran under no_sync() or no_grad(); torch 2.13 deprecates that switch's
        # old name, broadcast_buffers, for forward_sync_buffers
    )


def epoch_mean_loss(loss_sum: float, count: int, info: DistInfo) -> float:
    """The sample-weighted mean loss of this epoch over all ranks (one all-reduce, called by every rank)."""
    totals = torch.tensor([loss_sum, float(count)], dtype=torch.float64, device=info.device)
    dist.all_reduce(totals)
    return (totals[0] / totals[1]).item()


def print0(info: DistInfo, *args, **kwargs) -> None:
    """Print on rank 0 only: summaries are said once, not world_size times."""
    if info.is_main:
        print(*args, flush=True, **kwargs)


def write_experiments(info: DistInfo, experiments: dict, names: list[str], args) -> None:
    """Run each named experiment(info, args) on every rank; rank 0 writes <name>.json with every rank's result."""
    for name in names:
        gather_to_file(info, experiments[name](info, args), f"{name}.json")


def gather_to_file(info: DistInfo, mine, filename: str) -> list | None:
    """Every rank hands in `mine`; rank 0 writes the list of all ranks' values as JSON into the run folder."""
    table = [None] * info.world_size
    dist.all_gather_object(table, mine)  # a collective: every rank takes part, only rank 0 writes
    if info.is_main:
        write_text_atomic(info.run_dir / filename, json.dumps(table, indent=1))
        return table
    return None
