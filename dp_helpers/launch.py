"""run_ddp(): launch a script under torchrun from a notebook or a terminal, stream it, and clean up (taught in notebook 03).

Never mp.spawn or fork from a kernel: spawn cannot pickle functions defined in a notebook, and fork
breaks once CUDA is initialised. Each launch is a fresh `python -m torch.distributed.run` in its own
session; an interrupt, a timeout or the death of this process takes the whole tree down with it.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import math
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from .config import check_int
from .env import choose_launch, cpu_cores, gpu_count, nccl_available, resolve_backend
from .metrics import MetricsTail, metrics_dir, read_metrics

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
GRACE_S = 3.0
MAX_LOG_LINES = 20_000


class DistributedRunError(RuntimeError):
    """A launched run failed: names the failing rank(s), the exit code and the root-cause exception."""

    def __init__(self, message: str, ranks: tuple[int, ...] = (), exit_code: int | None = None,
                 cause: str = "", log_tail: str = "", run_dir: Path | None = None):
        super().__init__(message)
        self.ranks, self.exit_code, self.cause = ranks, exit_code, cause
        self.log_tail, self.run_dir = log_tail, run_dir


class RunTimeoutError(DistributedRunError, TimeoutError):
    """A launched run exceeded its timeout and was stopped."""


@dataclass
class RunResult:
    """What a finished run left: exit code, run folder, wall time, the captured log and the metrics."""

    returncode: int
    run_dir: Path
    wall_time: float
    log: str
    command: list[str]
    world_size: int
    backend: str

    @property
    def metrics(self) -> list[dict]:
        """All ranks' metric records (empty when the script wrote none)."""
        return read_metrics(self.run_dir) if metrics_dir(self.run_dir).is_dir() else []

    @property
    def summary(self) -> dict | None:
        """The run's summary.json, if the script wrote one."""
        path = self.run_dir / "summary.json"
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


@dataclass
class LaunchPlan:
    """A validated launch: the torchrun command, its environment and where it writes."""

    command: list[str]
    env: dict[str, str]
    run_dir: Path
    world_size: int
    backend: str
    timeout: float
    progress: int | None = None
    seen: dict[int, psutil.Process] = field(default_factory=dict)


def resolve_target(script) -> list[str]:
    """A .py path -> [path]; a dotted module name -> ['-m', name]; anything else is refused in one sentence."""
    if not isinstance(script, (str, os.PathLike)):
        raise TypeError(f"script must be a path or a module name, got {type(script).__name__}.")
    text = os.fspath(script)
    path = Path(text).expanduser()
    if isinstance(script, os.PathLike) or text.endswith(".py") or os.sep in text or path.exists():
        if not path.exists():
            raise FileNotFoundError(f"script not found: {path.resolve()}")
        if not path.is_file() or path.suffix != ".py":
            raise ValueError(f"script must be a .py file, got {path.resolve()}.")
        return [str(path.resolve())]
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", text) or importlib.util.find_spec(text) is None:
        raise FileNotFoundError(f"no script file or importable module named {text!r}.")
    return ["-m", text]


def check_args(script_args, env, timeout) -> None:
    """Refuse arguments, env and timeout of the wrong kind before anything starts."""
    for arg in script_args:
        if isinstance(arg, bool) or not isinstance(arg, (str, int, float, os.PathLike)):
            raise TypeError(f"script arguments must be str, int, float or Path, got {arg!r}.")
    if env is not None and (not isinstance(env, Mapping) or
                            not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise TypeError("env must be a mapping of str to str.")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, got {timeout!r}.")
    if not (math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout}.")


def check_nodes(world_size: int, nnodes: int, node_rank: int, rdzv_endpoint: str | None) -> None:
    """Refuse an impossible node layout in one sentence."""
    check_int("nnodes", nnodes, 1)
    check_int("node_rank", node_rank, 0)
    if node_rank >= nnodes:
        raise ValueError(f"node_rank must be < nnodes={nnodes}, got {node_rank}.")
    if world_size % nnodes:
        raise ValueError(f"world_size={world_size} must be a multiple of nnodes={nnodes} (same processes per node).")
    if nnodes > 1 and not (isinstance(rdzv_endpoint, str) and re.fullmatch(r"[^\s:]+:\d{1,5}", rdzv_endpoint)):
        raise ValueError(f"several nodes need rdzv_endpoint='host:port' of node 0, got {rdzv_endpoint!r}.")


def prepare_run_dir(out_dir, script_name: str) -> Path:
    """Create the run folder (a fresh one under runs/ by default); refuse one that is unwritable or already holds a run."""
    if out_dir is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        out_dir = Path("runs") / f"{stamp}-{script_name}-{uuid.uuid4().hex[:6]}"
    run_dir = Path(out_dir).expanduser().resolve()
    if metrics_dir(run_dir).exists() or (run_dir / "summary.json").exists():
        raise ValueError(f"output folder {run_dir} already holds a run; choose a new folder or delete it.")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"output folder {run_dir} is not writable ({exc.strerror}).") from None
    return run_dir


def child_env(run_dir: Path, world_size: int, backend: str, nnodes: int, extra,
              local_rdzv: bool = True) -> dict[str, str]:
    """The workers' environment: rank-prefixed lines, one thread per rank share of cores, gloo on loopback."""
    env = dict(os.environ)
    local_world = world_size // nnodes
    env.setdefault("OMP_NUM_THREADS", str(max(1, cpu_cores() // local_world)))
    if backend == "gloo" and local_rdzv and sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # the hostname's interface is flaky on CI runners
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH")) if p)
    env.update(PYTHONUNBUFFERED="1", MPLBACKEND="Agg", DP_BACKEND=backend, DP_NNODES=str(nnodes),
               DP_RUN_DIR=str(run_dir),
               TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=f"[rank ${{rank}}/{world_size}] ")
    env.update(extra or {})
    return env


def torchrun_command(target: list[str], script_args, run_dir: Path, world_size: int, nnodes: int,
                     node_rank: int, rdzv_endpoint: str | None) -> list[str]:
    """The `python -m torch.distributed.run` command line."""
    if nnodes == 1:
        rdzv = ["--standalone"]  # the store binds a free port itself: no fixed port, no race
    else:
        rdzv = ["--nnodes", str(nnodes), "--node-rank", str(node_rank), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", rdzv_endpoint, "--rdzv-id", "dp_helpers"]
    return [sys.executable, "-m", "torch.distributed.run", *rdzv,
            "--nproc-per-node", str(world_size // nnodes), "--max-restarts", "0",
            "--tee", "3", "--log-dir", str(run_dir / "logs"), "--shutdown-timeout", str(int(GRACE_S)),
            "--monitor-interval", "0.1", *target, *map(str, script_args)]


def plan_world_size(world_size: int | None, backend: str) -> int:
    """The requested world size, checked; by default one process per GPU with >= 2 GPUs, else 2 CPU processes."""
    if world_size is None:
        world_size = 2 if backend == "gloo" else choose_launch(gpu_count(), nccl_available())[1]
    check_int("world_size", world_size, 1)
    return world_size


def plan_launch(script, script_args, world_size, backend, out_dir, timeout, nnodes, node_rank,
                rdzv_endpoint, env, progress) -> LaunchPlan:
    """Validate everything and build the launch, or raise one clear sentence before anything starts."""
    target = resolve_target(script)
    check_args(script_args, env, timeout)
    world_size = plan_world_size(world_size, backend)
    check_nodes(world_size, nnodes, node_rank, rdzv_endpoint)
    if progress is not None:
        check_int("progress", progress, 1)
    backend = resolve_backend(backend, world_size, nnodes=nnodes)
    name = target[-1].rsplit(".", 1)[-1] if target[0] == "-m" else Path(target[0]).stem
    run_dir = prepare_run_dir(out_dir, name)
    command = torchrun_command(target, script_args, run_dir, world_size, nnodes, node_rank, rdzv_endpoint)
    local = nnodes == 1 or str(rdzv_endpoint).rsplit(":", 1)[0] in ("127.0.0.1", "localhost")
    return LaunchPlan(command, child_env(run_dir, world_size, backend, nnodes, env, local), run_dir,
                      world_size, backend, float(timeout), progress)


def die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the launching thread dies (Linux), so a killed kernel leaves nothing."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 == PR_SET_PDEATHSIG


def start(plan: LaunchPlan) -> subprocess.Popen:
    """Start torchrun in its own session with stdout and stderr merged into one pipe."""
    return subprocess.Popen(plan.command, env=plan.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent)


def remember_tree(proc: subprocess.Popen, plan: LaunchPlan) -> None:
    """Record torchrun's descendants: once torchrun is gone they can no longer be found through it."""
    try:
        for child in psutil.Process(proc.pid).children(recursive=True):
            plan.seen.setdefault(child.pid, child)
    except psutil.NoSuchProcess:
        pass


def kill_tree(proc: subprocess.Popen, plan: LaunchPlan) -> int:
    """SIGTERM torchrun and every worker, SIGKILL what is left after a grace period; returns how many were stopped."""
    remember_tree(proc, plan)
    members = list(plan.seen.values())
    if proc.poll() is None:
        members.append(psutil.Process(proc.pid))
    family = [p for p in members if _alive(p)]
    for p in family:
        _signal(p, signal.SIGTERM)
    _, alive = psutil.wait_procs(family, timeout=GRACE_S)
    for p in alive:
        _signal(p, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=GRACE_S)
    proc.wait()
    return len(family)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _signal(p: psutil.Process, sig: int) -> None:
    try:
        p.send_signal(sig)
    except psutil.NoSuchProcess:
        pass


def pump(stream, lines: queue.Queue) -> None:
    """Reader thread: push each output line (bytes -> str, '\\r' kept) onto the queue, then None at EOF."""
    for raw in iter(stream.readline, b""):
        lines.put(raw.decode("utf-8", errors="replace"))
    lines.put(None)


class Console:
    """Echoes worker lines (rank-prefixed) and drives an optional progress bar that follows rank 0's metrics."""

    def __init__(self, plan: LaunchPlan, echo: bool):
        self.echo, self.log = echo, deque(maxlen=MAX_LOG_LINES)
        self.tail = MetricsTail(metrics_dir(plan.run_dir) / "rank0.jsonl")
        self.bar = None
        if plan.progress:
            from tqdm.auto import tqdm
            self.bar = tqdm(total=plan.progress, desc="train", unit="step", leave=True)

    def line(self, text: str) -> None:
        """Keep every line; show worker lines (torchrun's own chatter stays in the log)."""
        self.log.append(text)
        if self.echo and text.startswith("[rank "):
            text = text.rstrip("\n")
            if self.bar is not None:
                self.bar.write(text, file=sys.stdout)
            else:
                print(text, flush=True)

    def tick(self) -> None:
        """Advance the bar by the steps rank 0 finished since the last tick."""
        if self.bar is not None:
            self.bar.update(self.tail.new_lines())

    def close(self) -> None:
        """Final tick, then close the bar."""
        if self.bar is not None:
            self.tick()
            self.bar.close()

    def text(self) -> str:
        """The captured output."""
        return "".join(self.log)


def stream(proc: subprocess.Popen, plan: LaunchPlan, console: Console) -> None:
    """Forward output until torchrun exits; enforce the deadline; never wait on a pipe orphans still hold."""
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=pump, args=(proc.stdout, lines), daemon=True).start()
    deadline, exited_at, last_scan = time.monotonic() + plan.timeout, None, 0.0
    while True:
        now = time.monotonic()
        if now - last_scan > 0.5:
            remember_tree(proc, plan)
            console.tick()
            last_scan = now
        try:
            item = lines.get(timeout=0.1)
        except queue.Empty:
            item = ""
        if item is None:
            break
        if item:
            console.line(item)
        if exited_at is None and proc.poll() is not None:
            exited_at = now
        if exited_at is not None and now - exited_at > GRACE_S:
            break  # orphaned workers still hold the pipe; kill_tree deals with them
        if now > deadline:
            raise RunTimeoutError(f"run exceeded timeout={plan.timeout:g}s and was stopped.", run_dir=plan.run_dir)


ROOT_RE = re.compile(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+).*?error_file\s*:\s*(\S+)", re.S)


def parse_failures(log: str) -> list[tuple[int, int, str]]:
    """(rank, exit code, error file) of each failure torchrun reported, the root cause first."""
    if "Root Cause" not in log:
        return []
    failures_part, root_part = log.rsplit("Root Cause", 1)
    failures_part = failures_part.rsplit("Failures:", 1)[-1]
    root = [(int(r), int(c), f) for r, c, f in ROOT_RE.findall(root_part)]
    others = [(int(r), int(c), f) for r, c, f in ROOT_RE.findall(failures_part)]
    return root + [o for o in others if o[0] not in {r[0] for r in root}]


def error_message(error_file: str) -> str:
    """The exception line a worker's @record error file holds, or '' if there is none."""
    try:
        data = json.loads(Path(error_file).read_text(encoding="utf-8"))
        return str(data["message"]["message"]).strip()
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def rank_output(log: str, rank: int) -> list[str]:
    """Every line one rank printed (its '[rank r/W] ' prefixed lines)."""
    return [line for line in log.splitlines() if line.startswith(f"[rank {rank}/")]


def last_exception_line(log: str, rank: int) -> str:
    """Fallback without an error file: the last 'SomethingError: …' line that rank printed."""
    pattern = r"\w+(Error|Exception|Interrupt)\b|what\(\):|Fatal Python error"  # Python, C++ and fatal errors
    hits = [ln for ln in rank_output(log, rank) if re.search(pattern, ln)]
    return hits[-1].split("] ", 1)[-1].strip() if hits else ""


VICTIM_RE = re.compile(r"Connection (closed|reset) by peer|remote worker crash|Broken pipe", re.I)


def culprit_first(found: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Order failures so a rank that raised comes before ranks that died of a peer's crash or were stopped."""
    # torchrun's own root cause compares timestamps in whole seconds, so a victim can win a tie
    return sorted(found, key=lambda f: (f[1] <= 0, bool(VICTIM_RE.search(f[2]))))


def last_lines(log: str, n: int = 40) -> str:
    """The last n lines of the captured output, for error messages."""
    return "\n".join(log.splitlines()[-n:])


def failure(rc: int, log: str, run_dir: Path) -> DistributedRunError:
    """Build the error for a failed run: root-cause rank, exit code and exception, then the log tail."""
    tail = last_lines(log)
    found = [(rank, code, error_message(err_file) or last_exception_line(log, rank))
             for rank, code, err_file in parse_failures(log)]
    if not found:
        return DistributedRunError(f"torchrun exited with code {rc} before any rank reported a failure; "
                                   f"last output:\n{tail}", exit_code=rc, log_tail=tail, run_dir=run_dir)
    found = culprit_first(found)
    rank, code, cause = found[0]
    cause = cause or "no exception recorded (killed by a signal?)"
    message = f"rank {rank} failed with exit code {code}: {cause}"
    if "Timed out" in cause:
        message += " (this rank waited for a peer that never arrived: the hung rank may be another one)"
    if found[1:]:
        message += " [then stopped: " + ", ".join(f"rank {r} (exit code {c})" for r, c, _ in found[1:]) + "]"
    own = "\n".join(rank_output(log, rank)[-20:])
    if own and (code < 0 or own not in tail):  # a signal leaves no exception: the rank's output is the clue
        message += f"\nrank {rank}'s last lines:\n{own}"
    return DistributedRunError(f"{message}\nlast output:\n{tail}", ranks=tuple(r for r, _, _ in found),
                               exit_code=code, cause=cause, log_tail=tail, run_dir=run_dir)


def run_ddp(script, *script_args, world_size: int | None = None, backend: str = "auto", out_dir=None,
            timeout: float = 600, nnodes: int = 1, node_rank: int = 0, rdzv_endpoint: str | None = None,
            env: Mapping[str, str] | None = None, progress: int | None = None, echo: bool = True) -> RunResult:
    """Run a .py script or a module under torchrun with world_size processes; raise DistributedRunError if a rank fails."""
    # RunTimeoutError after `timeout` seconds; KeyboardInterrupt is re-raised; in every case the whole
    # process tree is gone first. `progress`: the steps rank 0 will log, for a progress bar.
    plan = plan_launch(script, script_args, world_size, backend, out_dir, timeout, nnodes, node_rank,
                       rdzv_endpoint, env, progress)
    console, began = Console(plan, echo), time.monotonic()
    proc = start(plan)
    try:
        stream(proc, plan, console)
        proc.wait(timeout=GRACE_S * 3)
    except RunTimeoutError as exc:
        stopped = kill_tree(proc, plan)
        tail = last_lines(console.text())
        raise RunTimeoutError(f"{exc} Stopped {stopped} process(es); last output:\n{tail}",
                              log_tail=tail, run_dir=plan.run_dir) from None
    finally:  # also on KeyboardInterrupt (the notebook's stop button), which then propagates
        console.close()
        kill_tree(proc, plan)  # stops the tree if it still runs, reaps, stops orphans that outlived torchrun
        (plan.run_dir / "console.log").write_text(console.text(), encoding="utf-8")
    if proc.returncode != 0:
        raise failure(proc.returncode, console.text(), plan.run_dir)
    return RunResult(proc.returncode, plan.run_dir, time.monotonic() - began, console.text(),
                     plan.command, plan.world_size, plan.backend)


def run_train(world_size: int, echo: bool = False, out_dir=None, timeout: float = 600,
              **changes) -> tuple[RunResult, dict]:
    """The training job with some TrainConfig fields changed; returns the run and its final (unwrapped) weights."""
    import torch

    from .config import TrainConfig

    run = run_ddp("dp_helpers.scripts.train", *TrainConfig(**changes).as_args(), world_size=world_size, echo=echo,
                  out_dir=out_dir, timeout=timeout)
    return run, torch.load(run.run_dir / "model.pt", map_location="cpu", weights_only=True)


def run_json(script: str, name: str, *args, world_size: int = 2, echo: bool = False, **kwargs) -> list:
    """Run dp_helpers.scripts.<script> and return the per-rank list its rank 0 wrote to <name>.json."""
    run = run_ddp(f"dp_helpers.scripts.{script}", *args, world_size=world_size, echo=echo, **kwargs)
    return json.loads((run.run_dir / f"{name}.json").read_text(encoding="utf-8"))


def free_local_port() -> int:
    """A port free on 127.0.0.1 right now (node 0's rendezvous store binds it a moment later)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_local_nodes(script, *script_args, nnodes: int = 2, world_size: int = 4, out_dir=None,
                    timeout: float = 600) -> RunResult:
    """Several torchrun "nodes" on this machine, meeting at a c10d rendezvous on 127.0.0.1; returns node 0's run."""
    run_dir = prepare_run_dir(out_dir, "nodes")
    endpoint = f"127.0.0.1:{free_local_port()}"
    others = [subprocess.Popen([sys.executable, "-c", "import sys; from dp_helpers.launch import _node; _node(sys.argv[1:])",
                                str(script), str(world_size), str(nnodes), str(rank), endpoint, str(run_dir / f"node{rank}"),
                                str(timeout), *map(str, script_args)], stdin=subprocess.DEVNULL)
              for rank in range(1, nnodes)]
    try:
        result = run_ddp(script, *script_args, world_size=world_size, nnodes=nnodes, node_rank=0, rdzv_endpoint=endpoint,
                         out_dir=run_dir / "node0", timeout=timeout)
        codes = [p.wait(timeout=timeout) for p in others]
    finally:
        for p in others:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(codes):
        raise DistributedRunError(f"node(s) {[i + 1 for i, c in enumerate(codes) if c]} failed; see {run_dir}.",
                                  run_dir=run_dir)
    return result


def _node(argv: list[str]) -> None:
    """Entry point of one extra local node started by run_local_nodes."""
    script, world, nnodes, rank, endpoint, out, timeout, *args = argv
    run_ddp(script, *args, world_size=int(world), nnodes=int(nnodes), node_rank=int(rank), rdzv_endpoint=endpoint,
            out_dir=out, timeout=float(timeout), echo=False)
