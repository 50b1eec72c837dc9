"""Several torchrun "nodes" on one machine, meeting at a c10d rendezvous on 127.0.0.1 (notebook 09)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from dp_helpers.tool.launch.command import GRACE_S, PACKAGE_ROOT
from dp_helpers.tool.launch.diagnose import (
    DistributedRunError,
    RunTimeoutError,
    failure,
    read_records,
)
from dp_helpers.tool.launch.run import RunResult, run_ddp
from dp_helpers.tool.runs import prepare_run_dir

PORT_TRIES = 3


def free_local_port() -> int:
    """A port free on 127.0.0.1 right now; another process may take it before node 0 binds it (run_local_nodes retries)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_taken(exc: DistributedRunError) -> bool:
    """Whether a launch failed because the rendezvous port was taken between choosing and binding it."""
    return "EADDRINUSE" in exc.log_tail or "address already in use" in exc.log_tail.lower()


def start_node(script, script_args, world_size: int, nnodes: int, rank: int, endpoint: str, out, timeout: float):
    """One extra node: a python process that calls run_ddp with node_rank=rank."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(PACKAGE_ROOT), os.environ.get("PYTHONPATH"))))}
    return subprocess.Popen([sys.executable, "-c", "import sys; from dp_helpers.tool.launch.nodes import node; node(sys.argv[1:])",
                             str(script), str(world_size), str(nnodes), str(rank), endpoint, str(out), str(timeout),
                             *map(str, script_args)], stdin=subprocess.DEVNULL, env=env)  # this copy of dp_helpers


def wait_node(proc: subprocess.Popen, rank: int, timeout: float) -> int:
    """An extra node's exit code, or RunTimeoutError if it outlives the run's timeout."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RunTimeoutError(f"node {rank} was still running {timeout:g}s after node 0 finished.") from None


def across_nodes(exc: DistributedRunError, run_dir) -> DistributedRunError:
    """Node 0's error, re-diagnosed with every node's recorded failures: the culprit may be on another node."""
    found = [f for path in sorted(run_dir.glob("node*/failures.json")) for f in (read_records(path) or [])]
    if not found:
        return exc
    log = (run_dir / "node0" / "console.log").read_text(encoding="utf-8", errors="replace")
    return failure(exc.exit_code or 1, log, run_dir, found)


def launch_nodes(script, script_args, nnodes: int, world_size: int, run_dir, timeout: float) -> RunResult:
    """Start nodes 1..n-1 in the background and node 0 here, at one fresh port; returns node 0's run."""
    endpoint = f"127.0.0.1:{free_local_port()}"
    others = [start_node(script, script_args, world_size, nnodes, rank, endpoint, run_dir / f"node{rank}", timeout)
              for rank in range(1, nnodes)]
    try:
        result = run_ddp(script, *script_args, world_size=world_size, nnodes=nnodes, node_rank=0,
                         rdzv_endpoint=endpoint, out_dir=run_dir / "node0", timeout=timeout)
        codes = [wait_node(p, rank, timeout) for rank, p in enumerate(others, start=1)]
    except DistributedRunError as exc:
        for p in others:  # their ranks fail too once node 0's are gone; let them write their records
            try:
                p.wait(timeout=4 * GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        raise across_nodes(exc, run_dir) from None
    finally:
        for p in others:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(codes):
        raise DistributedRunError(f"node(s) {[i + 1 for i, c in enumerate(codes) if c]} failed; see {run_dir}.",
                                  run_dir=run_dir)
    return result


def run_local_nodes(script, *script_args, nnodes: int = 2, world_size: int = 4, out_dir=None,
                    timeout: float = 600) -> RunResult:
    """Several torchrun "nodes" on this machine, meeting at a c10d rendezvous on 127.0.0.1; returns node 0's run."""
    run_dir = prepare_run_dir(out_dir, "nodes")
    for attempt in range(1, PORT_TRIES + 1):
        try:
            return launch_nodes(script, script_args, nnodes, world_size, run_dir, timeout)
        except DistributedRunError as exc:
            if attempt == PORT_TRIES or not port_taken(exc):
                raise
            for folder in run_dir.glob("node*"):  # kept, out of the next attempt's way
                folder.rename(run_dir / f"port-taken{attempt}-{folder.name}")


def node(argv: list[str]) -> None:
    """Entry point of one extra local node started by run_local_nodes."""
    script, world, nnodes, rank, endpoint, out, timeout, *args = argv
    run_ddp(script, *args, world_size=int(world), nnodes=int(nnodes), node_rank=int(rank), rdzv_endpoint=endpoint,
            out_dir=out, timeout=float(timeout), echo=False)
