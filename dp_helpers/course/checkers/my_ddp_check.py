"""A learner's MyDDP (notebook 04's exercise) next to torch's DistributedDataParallel on every rank, step by step.

    python -m torch.distributed.run --nproc-per-node 2 -m dp_helpers.course.checkers.my_ddp_check --module my_ddp_core.py

Both wrap the same MLP (each rank starts from its own seed: the broadcast must fix that) and train on the same
batches; every step records the order of the learner's hooks and all-reduces, the buckets launched, and how the
averaged gradients compare with DDP's. Rank 0 writes my_ddp.json with every rank's record (script_check reads it).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from dp_helpers.scripts.from_scratch import batch, mlp
from dp_helpers.tool import dist as dph
from dp_helpers.tool.training import bce_loss


def load(path: str):
    """The MyDDP class of the learner's file."""
    spec = importlib.util.spec_from_file_location("my_ddp_core", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MyDDP


def recorded(method, events: list, kind: str):
    """A method that notes each call (kind, time) before running."""

    @functools.wraps(method)
    def note(self, *args):
        """The original, after a record."""
        events.append({"kind": kind, "arg": args[0] if kind == "launch" else None, "t": time.perf_counter()})
        return method(self, *args)

    return note


class NotedWork:
    """An async all-reduce's work handle whose wait() is noted in the events (when, relative to the hooks)."""

    def __init__(self, work, events: list):
        self.work, self.events = work, events

    def wait(self, *args, **kwargs):
        """Note the wait, then wait."""
        self.events.append({"kind": "wait", "arg": None, "t": time.perf_counter()})
        return self.work.wait(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.work, name)


def note_waits(events: list) -> None:
    """Make dist.all_reduce(..., async_op=True) hand back work whose wait() is noted."""
    original = dist.all_reduce

    @functools.wraps(original)
    def all_reduce(*args, **kwargs):
        """The original; its work handle noted."""
        work = original(*args, **kwargs)
        return NotedWork(work, events) if work is not None else None

    dist.all_reduce = all_reduce


class Reordered(nn.Module):
    """Two layers that run in the reverse order of their registration: the later bucket fills first."""

    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.head, self.body = nn.Linear(16, 1), nn.Linear(10, 16)  # registered head first, used last

    def forward(self, x):
        """body, then head."""
        return torch.sigmoid(self.head(torch.relu(self.body(x))))


REORDERED_CAP = 700  # bytes: body's 704 in one bucket, head's 68 in the other


def one_step(mine, theirs, info, step: int, events: list) -> dict:
    """One forward and backward of both wrappers on the same batch: the events, and the gradients side by side."""
    x, y = batch(info, step)
    for model in (mine, theirs):
        model.zero_grad(set_to_none=True)
    del events[:]
    bce_loss(mine(x), y).backward()
    bce_loss(theirs(x), y).backward()
    pairs = [(a.grad, b.grad) for a, b in zip(mine.module.parameters(), theirs.module.parameters(), strict=True)
             if a.grad is not None]
    gap = max((a - b).abs().max().item() for a, b in pairs)
    ratio = sum((a * b).sum().item() for a, b in pairs) / sum((b * b).sum().item() for _, b in pairs)
    return {"events": [dict(e) for e in events], "gap": gap, "ratio": ratio}


def main(info: dph.DistInfo) -> None:
    """Train both wrappers a few steps; rank 0 writes every rank's record."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", required=True)
    parser.add_argument("--cap", type=int, default=4000, help="bucket cap in bytes")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    events: list[dict] = []
    note_waits(events)
    cls = load(args.module)
    cls.ready = recorded(cls.ready, events, "ready")  # before the constructor registers it as the hook
    cls.launch = recorded(cls.launch, events, "launch")
    mine, theirs = cls(mlp(seed=info.rank), args.cap), DDP(mlp(seed=0))
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (mine, theirs)]
    record = {"buckets": len(mine.buckets), "steps": []}
    for step in range(args.steps):
        record["steps"].append(one_step(mine, theirs, info, step, events))
        for opt in optimizers:
            opt.step()
    record["weight_gap"] = max((a - b).abs().max().item() for a, b in zip(mine.parameters(), theirs.parameters(),
                                                                          strict=True))
    mine, theirs = cls(Reordered(seed=info.rank), REORDERED_CAP), DDP(Reordered(seed=0))
    record["reordered"] = {"buckets": len(mine.buckets), "steps": [one_step(mine, theirs, info, 9, events)]}
    dph.gather_to_file(info, record, "my_ddp.json")


if __name__ == "__main__":
    dph.worker(main)
