"""A job that shrinks and grows: bare torchrun agents with `--nnodes 1:N` on this machine, one killed and started again.

Each "node" is its own torchrun agent with one worker, meeting the others at a c10d rendezvous whose store this
process holds (`is_host=false`: no agent hosts it, so killing any of them leaves the rendezvous alive). A node is
killed as a machine that loses power is: its agent and its workers at once, with SIGKILL. The survivors' workers fail
in their next collective, their agents restart them (one of each agent's --max-restarts) once the dead node's
keep-alive has lapsed, and the job goes on with the nodes left; the node started again is let in by a restart that
no agent counts. On torch 2.13 a node joining a later round waited for a MASTER_ADDR that the agent of rank 0 had
written only in its first round (the agents share one TCP store by default), so the agents here run with
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1. Supports one worker per node and any script that resumes from its own
checkpoint and prints "step S/N on W ranks"; refuses fewer than 2 nodes. Notebook 11 runs it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from dp_helpers.tool.i18n import tr
from dp_helpers.tool.launch.diagnose import DistributedRunError, RunTimeoutError
from dp_helpers.tool.launch.process import send
from dp_helpers.tool.runs import prepare_run_dir


@dataclass
class ElasticRun:
    """What the nodes printed, when each event happened (seconds from the start), and the agents' command."""

    run_dir: Path
    command: list[str]
    events: list[tuple[float, str]] = field(default_factory=list)

    def output(self, node: int) -> str:
        """Everything node `node`'s agent and workers printed to stdout, across its lives."""
        return (self.run_dir / f"node{node}.out").read_text(errors="replace")


def agent_command(script, script_args, nodes: int, endpoint: str, max_restarts: int) -> list[str]:
    """The torchrun line every node runs: 1 to `nodes` nodes, one worker each, the rendezvous held elsewhere."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", f"1:{nodes}", "--nproc-per-node", "1",
            "--max-restarts", str(max_restarts), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
            "--rdzv-id", "elastic", "--rdzv-conf", "is_host=false,last_call_timeout=1", "--monitor-interval", "0.5",
            str(Path(script).resolve()), *map(str, script_args)]


def start(command: list[str], run_dir: Path, node: int) -> subprocess.Popen:
    """One node's agent, in a session of its own, its output appended to node{i}.out and node{i}.err."""
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    with open(run_dir / f"node{node}.out", "a") as out, open(run_dir / f"node{node}.err", "a") as err:
        return subprocess.Popen(command, cwd=run_dir, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                start_new_session=True)


def kill(agent: subprocess.Popen) -> None:
    """An agent and its workers at once (torchrun starts each worker in a session of its own)."""
    try:
        root = psutil.Process(agent.pid)
        family = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:  # it had already exited
        family = []
    for p in family:
        send(p, signal.SIGKILL)
    agent.wait()


class Watch:
    """Reads the nodes' output until a line appears, within the run's deadline."""

    def __init__(self, run: ElasticRun, nodes: int, timeout: float):
        self.run, self.nodes = run, nodes
        self.began, self.deadline = time.monotonic(), time.monotonic() + timeout

    def until(self, text: str, event: str) -> None:
        """Wait until some node has printed `text`, then note `event`."""
        while not any(text in self.run.output(n) for n in range(self.nodes)):
            if time.monotonic() > self.deadline:
                raise RunTimeoutError(f"no node printed {text!r} in time; see {self.run.run_dir}.")
            time.sleep(0.2)
        self.note(event)

    def note(self, event: str) -> None:
        """Record an event with its time."""
        self.run.events.append((round(time.monotonic() - self.began, 1), event))


def kill_and_bring_back(watch: Watch, agents: list, victim: int, kill_after_step: int) -> None:
    """Kill the victim node after the step, start it again once the others go on without it."""
    nodes, run = watch.nodes, watch.run
    watch.until(f"step {kill_after_step}/", tr("step {step} done on {n} ranks", step=kill_after_step, n=nodes))
    kill(agents[victim])
    watch.note(tr("node {node} killed (its agent and its worker)", node=victim))
    watch.until(f"on {nodes - 1} ranks", tr("resumed on {n} ranks", n=nodes - 1))
    agents[victim] = start(run.command, run.run_dir, victim)
    watch.note(tr("node {node} started again", node=victim))


def run_elastic(script, *script_args, nodes: int = 2, victim: int = 1, kill_after_step: int = 8,
                max_restarts: int = 3, out_dir=None, timeout: float = 240) -> ElasticRun:
    """Run `nodes` torchrun agents; kill node `victim` after the given step, start it again once the job has shrunk."""
    import torch.distributed as dist  # here, not at import: the package imports without starting anything

    if nodes < 2 or not 0 <= victim < nodes or kill_after_step < 1:
        raise ValueError(f"run_elastic needs nodes >= 2, 0 <= victim < nodes and kill_after_step >= 1, not {nodes}, "
                         f"{victim} and {kill_after_step}.")
    run_dir = prepare_run_dir(out_dir, "elastic")
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, multi_tenant=True, wait_for_workers=False)
    run = ElasticRun(run_dir, agent_command(script, script_args, nodes, f"127.0.0.1:{store.port}", max_restarts))
    agents = [start(run.command, run_dir, n) for n in range(nodes)]
    watch = Watch(run, nodes, timeout)
    try:
        kill_and_bring_back(watch, agents, victim, kill_after_step)
        codes = [a.wait(timeout=max(watch.deadline - time.monotonic(), 1)) for a in agents]
        watch.note(tr("every agent exited"))
    except subprocess.TimeoutExpired:
        raise RunTimeoutError(f"the nodes were still running {timeout:g}s after the start; see {run_dir}.") from None
    finally:
        for a in agents:
            if a.poll() is None:
                kill(a)
        del store
    check(codes, run_dir)
    return run


def check(codes: list[int], run_dir: Path) -> None:
    """Raise DistributedRunError naming the nodes whose agents failed, with the last lines the first one wrote."""
    failed = [n for n, c in enumerate(codes) if c]
    if failed:
        said = (run_dir / f"node{failed[0]}.err").read_text(errors="replace").strip().splitlines()[-2:]
        raise DistributedRunError(f"node(s) {failed} failed: {' '.join(said)}", run_dir=run_dir)
