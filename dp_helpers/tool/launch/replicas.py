"""Replicas that live and die apart: one torchrun per replica, meeting at a store this process holds.

A single torchrun restarts every rank when one fails; per-step fault tolerance needs the opposite, so each replica
is its own torchrun (one process, `max_restarts` restarts of its own) and the replicas meet only through a TCPStore
served from here, on a port the system picks, which outlives all of them (torchft runs a "lighthouse" for this).
Each replica's script reads DP_FT_STORE (host:port), DP_REPLICA_ID and DP_NUM_REPLICAS.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from dp_helpers.tool.launch.command import PACKAGE_ROOT
from dp_helpers.tool.launch.diagnose import DistributedRunError, RunTimeoutError
from dp_helpers.tool.runs import prepare_run_dir


@dataclass
class ReplicaRun:
    """What one replica's torchrun left: its id, its folder and its whole output."""

    replica: int
    run_dir: Path
    log: str


def start_replica(script, script_args, replica: int, replicas: int, store: str, out: Path, max_restarts: int,
                  timeout: float) -> subprocess.Popen:
    """One replica: a python process that calls run_ddp with one rank and this replica's environment."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(PACKAGE_ROOT), os.environ.get("PYTHONPATH"))))}
    code = "import sys; from dp_helpers.tool.launch.replicas import replica; replica(sys.argv[1:])"
    out.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f"{out.name}.launcher.log", "w") as log:
        return subprocess.Popen([sys.executable, "-c", code, str(script), str(replica), str(replicas), store, str(out),
                                 str(max_restarts), str(timeout), *map(str, script_args)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)


def replica(argv: list[str]) -> None:
    """Entry point of one replica's launcher process."""
    from dp_helpers.tool.launch.run import run_ddp

    script, rid, replicas, store, out, max_restarts, timeout, *args = argv
    env = {"DP_FT_STORE": store, "DP_REPLICA_ID": rid, "DP_NUM_REPLICAS": replicas}
    try:
        run_ddp(script, *args, world_size=1, out_dir=out, timeout=float(timeout), env=env, echo=False,
                max_restarts=int(max_restarts))
    except DistributedRunError as exc:
        sys.exit(f"replica {rid}: {exc}")


def run_replicas(script, *script_args, replicas: int = 3, max_restarts: int = 1, out_dir=None,
                 timeout: float = 300) -> list[ReplicaRun]:
    """Run `replicas` copies of a script, each under its own torchrun, meeting at a store held here."""
    import torch.distributed as dist  # here, not at import: the package imports without starting anything

    if replicas < 1 or max_restarts < 0:
        raise ValueError(f"run_replicas needs replicas >= 1 and max_restarts >= 0, not {replicas} and {max_restarts}.")
    run_dir = prepare_run_dir(out_dir, "replicas")
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # port 0: the system picks one
    procs = [start_replica(script, script_args, r, replicas, f"127.0.0.1:{store.port}", run_dir / f"replica{r}",
                           max_restarts, timeout) for r in range(replicas)]
    try:
        codes = [wait(p, timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        del store  # the store goes once every replica has
    failed = [r for r, code in enumerate(codes) if code]
    if failed:
        said = (run_dir / f"replica{failed[0]}.launcher.log").read_text(errors="replace").strip().splitlines()[-3:]
        raise DistributedRunError(f"replica(s) {failed} failed; {' '.join(said)}", run_dir=run_dir)
    return [ReplicaRun(r, run_dir / f"replica{r}", (run_dir / f"replica{r}" / "console.log").read_text(errors="replace"))
            for r in range(replicas)]


def wait(proc: subprocess.Popen, timeout: float) -> int:
    """A replica launcher's exit code, or RunTimeoutError past the timeout."""
    try:
        return proc.wait(timeout=timeout + 30)  # its own run_ddp stops at `timeout`: this is the backstop
    except subprocess.TimeoutExpired:
        raise RunTimeoutError(f"a replica was still running {timeout:g}s after its start.") from None
