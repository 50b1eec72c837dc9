"""One training step's torch.profiler trace, read as compute against communication (taught in notebook 04).

Reads the Chrome trace `prof.export_chrome_trace(path)` writes on one rank, for a step whose script named its two
phases with `record_function("forward")` and `record_function("backward")`. Compute: the operators the training
thread ran in the forward, and autograd's functions (`autograd::engine::evaluate_function: ...`) in the backward.
Communication: each collective from the moment it was issued to the moment it was done, as the emulated link
records it (`link: all_reduce`, tool/link.py), or, with no link, gloo's own work (`gloo:all_reduce`, on gloo's
threads). Exposed communication: the rest of the backward after autograd's last function, when the training thread
waits for the last buckets and copies them into `.grad`. Refuses, in one sentence, a trace without the two ranges;
it reads CPU traces (a CUDA trace's kernels run on streams this reader does not look at).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

PHASES = ("forward", "backward")
AUTOGRAD = "autograd::engine::evaluate_function"
NOT_COMPUTE = ("forward", "backward", "link:", "c10d::", "gloo:", "DistributedDataParallel.forward", "ProfilerStep")


@dataclass
class StepTrace:
    """A step's intervals in ms from the forward's start: phases, compute, communication, exposed communication."""

    phases: dict[str, tuple[float, float]]
    compute: list[tuple[float, float]]
    communication: list[tuple[float, float]]
    exposed: tuple[float, float] | None

    @property
    def exposed_ms(self) -> float:
        """How long the training thread waited for communication after its last operator."""
        return self.exposed[1] - self.exposed[0] if self.exposed else 0.0


def read_step(path: str | Path) -> StepTrace:
    """The step in a Chrome trace written by torch.profiler; ValueError if it lacks the forward and backward ranges."""
    events = [e for e in json.loads(Path(path).read_text())["traceEvents"] if e.get("ph") == "X"]
    ranges = {e["name"]: e for e in events if e["name"] in PHASES}
    if len(ranges) < 2:
        raise ValueError(f"{path}: no 'forward' and 'backward' ranges; wrap the two phases in "
                         "torch.profiler.record_function('forward') and ('backward')")
    start, thread = ranges["forward"]["ts"], ranges["backward"]["tid"]
    span = lambda e: ((e["ts"] - start) / 1e3, (e["ts"] + e["dur"] - start) / 1e3)  # noqa: E731
    phases = {name: span(e) for name, e in ranges.items()}
    own = [(e["name"], span(e)) for e in events if e["tid"] == thread and not e["name"].startswith(NOT_COMPUTE)]
    forward = [s for _, s in own if phases["forward"][0] <= s[0] < phases["forward"][1]]
    backward = [s for name, s in own if name.startswith(AUTOGRAD) and s[0] >= phases["backward"][0]]
    linked = [span(e) for e in events if e["name"].startswith("link:")]
    communication = linked or [span(e) for e in events if e["name"].startswith("gloo:")]
    end = phases["backward"][1]
    last = max((b for _, b in backward), default=end)
    return StepTrace(phases, merge(forward + backward), sorted(communication), (last, end) if end > last else None)


def merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of intervals, as disjoint intervals in order (nested operators count once)."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out
