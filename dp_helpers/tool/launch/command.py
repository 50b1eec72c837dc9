"""The launch plan: the command that starts torchrun, the workers' environment and the run folder."""

from __future__ import annotations

import os
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from dp_helpers.tool.env import gpu_count, worker_threads
from dp_helpers.tool.request import check_launch
from dp_helpers.tool.runs import prepare_run_dir

PACKAGE_ROOT = Path(__file__).resolve().parents[3]  # the folder that holds dp_helpers/
GRACE_S = 3.0  # seconds a stopped process gets between SIGTERM and SIGKILL
JOIN_TIMEOUT_S = 60  # seconds node 0 waits for the other nodes (torchrun's default: 600)


@dataclass
class LaunchPlan:
    """A validated launch: the command, its environment and where it writes."""

    command: list[str]
    env: dict[str, str]
    run_dir: Path
    world_size: int
    backend: str
    timeout: float | None  # seconds; None: no limit
    progress: int | None = None


def child_env(run_dir: Path, world_size: int, backend: str, extra,
              local_rdzv: bool = True, max_restarts: int = 0) -> dict[str, str]:
    """The workers' environment: rank-prefixed lines, the same intra-op threads for every world size, gloo on loopback."""
    env = dict(os.environ)
    # one thread per CPU rank, as torchrun sets for several: W = 1 and W = 2 then sum alike, and so does an
    # in-process reference under worker_numerics() (a thread count can change a kernel's order of summation)
    env.setdefault("OMP_NUM_THREADS", str(worker_threads()))
    if backend == "gloo" and local_rdzv and sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # the hostname's interface is flaky on CI runners
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH")) if p)
    env.update(PYTHONUNBUFFERED="1", MPLBACKEND="Agg", DP_BACKEND=backend, DP_RUN_DIR=str(run_dir),
               DP_LAUNCHER_PID=str(os.getpid()), DP_LAUNCH_ID=uuid.uuid4().hex,  # every process of this launch
               # seconds torchrun waits between SIGTERM and SIGKILL when torchrun itself is stopped by a signal (its
               # default: 30; read by torch >= 2.12). Stopping the group after a rank failed still waits up to 30 s
               # for ranks that ignore SIGTERM; a run's timeout and the launcher's own tree kill bound that
               TORCH_ELASTIC_SHUTDOWN_TIMEOUT=str(int(GRACE_S)),
               TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=f"[rank ${{rank}}/{world_size}] ")
    if max_restarts:
        # read by torchrun's rendezvous: with torch 2.13 and gloo, a group restarted on the shared rendezvous store
        # failed to connect ("Connection refused") or hung; with this every round gets a fresh store and port
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    env.update(extra or {})
    # torchrun's agent keeps its temporary files here (agent.py), and run_ddp removes the folder after the run: a
    # name of the launch's own, set last so that nothing else can name a folder to remove
    env["DP_AGENT_TMPDIR"] = os.path.join(tempfile.gettempdir(), f"dp-launch-{uuid.uuid4().hex}")
    return env


def torchrun_command(target: list[str], script_args, run_dir: Path, world_size: int, nnodes: int,
                     rdzv_endpoint: str | None, max_restarts: int = 0, fork: bool = False) -> list[str]:
    """torchrun's command line, started through dp_helpers.tool.launch.agent (same flags as `python -m torch.distributed.run`)."""
    # fork: the workers are forked from torchrun's agent, which has imported torch, instead of each starting a Python
    # that imports it again (agent.py); only with gloo on Linux machines without a CUDA GPU (plan_launch): a process
    # forked after torch has asked CUDA anything cannot use CUDA (seen on a GPU machine: gloo ranks sharing a GPU
    # failed with "Cannot re-initialize CUDA in forked subprocess"), and macOS forks a process that has loaded system
    # frameworks badly
    start = ["--run-path", "--start-method", "fork"] if fork else []
    if nnodes == 1:
        rdzv = ["--standalone"]  # the store binds a free port itself: no fixed port, no race
    else:  # c10d's rank order follows arrival, so no --node-rank: it would be ignored
        rdzv = ["--nnodes", str(nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint,
                "--rdzv-id", "dp_helpers", "--rdzv-conf", f"join_timeout={JOIN_TIMEOUT_S}"]
    return [sys.executable, "-m", "dp_helpers.tool.launch.agent", *rdzv,
            "--nproc-per-node", str(world_size // nnodes), "--max-restarts", str(max_restarts),
            "--tee", "3", "--log-dir", str(run_dir / "logs"), "--monitor-interval", "0.1", *start, *target, *map(str, script_args)]


def plan_launch(script, script_args, world_size, backend, out_dir, timeout, nnodes, node_rank,
                rdzv_endpoint, env, progress, max_restarts: int = 0, echo=True, link=None) -> LaunchPlan:
    """Validate everything and build the launch, or raise one clear sentence before anything starts."""
    target, world_size, backend = check_launch(script, script_args, world_size, backend, out_dir, timeout, nnodes,
                                               node_rank, rdzv_endpoint, env, progress, max_restarts, echo, link=link)
    name = target[-1].rsplit(".", 1)[-1] if target[0] == "-m" else Path(target[0]).stem
    run_dir = prepare_run_dir(out_dir, name)
    if link is not None:  # the workers start behind the emulated link, which then runs the script (tool/link.py)
        target = ["-m", "dp_helpers.tool.link", link, *target]
    command = torchrun_command(target, script_args, run_dir, world_size, nnodes, rdzv_endpoint, max_restarts,
                               fork=backend == "gloo" and sys.platform.startswith("linux") and gpu_count() == 0)
    local = nnodes == 1 or str(rdzv_endpoint).rsplit(":", 1)[0] in ("127.0.0.1", "localhost")
    return LaunchPlan(command, child_env(run_dir, world_size, backend, env, local, max_restarts), run_dir,
                      world_size, backend, None if timeout is None else float(timeout), progress)
