"""run_ddp(): start torchrun, stream it, stop everything it started, and explain a failure (taught in notebook 03)."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dp_helpers.tool.launch.command import GRACE_S, plan_launch
from dp_helpers.tool.launch.console import Console, drain, start_reader, stream
from dp_helpers.tool.launch.diagnose import RunTimeoutError, failure, last_lines
from dp_helpers.tool.launch.process import ProcessTree, signals_held, start
from dp_helpers.tool.metrics import metrics_dir, read_metrics
from dp_helpers.tool.sampler import plural


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


def run_ddp(script, *script_args, world_size: int | None = None, backend: str = "auto", out_dir=None,
            timeout: float | None = 600, nnodes: int = 1, node_rank: int = 0, rdzv_endpoint: str | None = None,
            env: Mapping[str, str] | None = None, progress: int | None = None, echo: bool | str = True,
            max_restarts: int = 0, link: str | None = None) -> RunResult:
    """Run a .py script or a module under torchrun with world_size processes; raise DistributedRunError if a rank fails."""
    # RunTimeoutError after `timeout` seconds (None: no limit); KeyboardInterrupt is re-raised; in every case the whole
    # process tree is gone first. `progress`: the steps rank 0 will log, for a progress bar. `max_restarts`: how often
    # torchrun may start the whole group again after a rank failed (the script must resume by itself). `link`: an
    # emulated network between the ranks, 'BANDWIDTH[,LATENCY]' such as '1gbit,20us' (gloo only; tool/link.py).
    plan = plan_launch(script, script_args, world_size, backend, out_dir, timeout, nnodes, node_rank,
                       rdzv_endpoint, env, progress, max_restarts, echo, link)
    console, began = Console(plan, echo), time.monotonic()
    try:
        tree = ProcessTree(start(plan.command, plan.env), marker=plan.env["DP_LAUNCH_ID"])
    except BaseException:
        console.close()
        raise
    reader, lines = start_reader(tree.proc.stdout)
    try:
        stream(tree, plan, console, lines)
        tree.proc.wait(timeout=GRACE_S * 3)
    except RunTimeoutError as exc:
        stopped, tail = plural(tree.kill(), "process", "processes"), last_lines(console.last())
        raise launched(RunTimeoutError(f"{exc} {stopped} stopped; {where_output(console, tail)}\nevery rank's "
                                       f"full output: {console.path}", log_tail=tail), plan) from None
    except (KeyboardInterrupt, OSError) as exc:  # after the timeout (an OSError too): the caller records the end
        launched(exc, plan)
        raise
    finally:  # also on KeyboardInterrupt (the notebook's stop button), which then propagates
        stop_and_close(tree, reader, lines, console, plan)
    log = console.path.read_text(encoding="utf-8")
    if tree.proc.returncode != 0:
        raise launched(failure(tree.proc.returncode, log, plan.run_dir), plan)
    return RunResult(tree.proc.returncode, plan.run_dir, time.monotonic() - began, log,
                     plan.command, plan.world_size, plan.backend)


def where_output(console: Console, tail: str) -> str:
    """Where a stopped run's output is: above, if any line of it was shown; else its last lines, or that it had none."""
    if console.shown_lines:
        return "its output is above"
    return f"its last output:\n{last_lines(tail, 5)}" if tail.strip() else "it had printed nothing yet"


def launched(exc: BaseException, plan) -> BaseException:
    """exc, carrying what the caller records of a run that did not finish: its folder, world size and backend."""
    exc.run_dir, exc.world_size, exc.backend = plan.run_dir, plan.world_size, plan.backend
    return exc


def stop_and_close(tree: ProcessTree, reader, lines, console: Console, plan) -> None:
    """Stop the tree if it still runs (reap it, stop orphans that outlived torchrun), then keep its last output."""
    with signals_held():  # a second Ctrl-C (a common gesture) must not leave the tree or the log half done
        tree.kill()
        shutil.rmtree(plan.env["DP_AGENT_TMPDIR"], ignore_errors=True)  # what torchrun's agent left in TMPDIR
        drain(reader, lines, console, tree.proc.stdout)
        console.close()
