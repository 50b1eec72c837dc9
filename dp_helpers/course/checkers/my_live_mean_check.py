"""A learner's live_mean (the survivors' average of a per-step fault-tolerant job) on every rank, over several cases.

    python -m torch.distributed.run --nproc-per-node 3 -m dp_helpers.course.checkers.my_live_mean_check --module my_live_mean.py

Each case says which ranks are alive; every rank hands the learner's function gradients whose values say whose they
are, and records what it got back, what its gradients became and which torch.distributed functions it called. Rank 0
writes my_live_mean.json.
"""

from __future__ import annotations

import argparse

import torch

from dp_helpers.course.checkers.my_zero1_check import count_calls, load
from dp_helpers.tool import dist as dph

CALLED = ("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "reduce", "reduce_scatter",
          "reduce_scatter_tensor", "send", "recv", "isend", "irecv", "barrier")
SHAPES = ((3,), (2, 2))


def dead_sets(world_size: int) -> list[tuple[int, ...]]:
    """The ranks that are dead in each case: none, one in the middle, the first, all but the last."""
    return [(), (1,), (0,), tuple(range(world_size - 1))]


def grads_of(rank: int, dtype) -> list[torch.Tensor]:
    """This rank's gradients: values that say whose they are ((rank + 1)^2, no mean of some ranks that of others)."""
    return [((rank + 1) ** 2 + torch.arange(torch.Size(s).numel()) / 10).reshape(s).to(dtype) for s in SHAPES]


def one_case(fn, dead: tuple[int, ...], dtype, info: dph.DistInfo, calls: list) -> dict:
    """The learner's live_mean on this rank in one case: what it returned, what the gradients became, its calls."""
    del calls[:]
    grads = grads_of(info.rank, dtype)
    returned = fn(grads, info.rank not in dead)
    return {"dead": list(dead), "dtype": str(dtype), "returned": returned if isinstance(returned, int | float) else
            repr(returned), "grads": [g.tolist() for g in grads], "calls": sorted({c["name"] for c in calls})}


def main(info: dph.DistInfo) -> None:
    """Every case on every rank; rank 0 writes every rank's record."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", required=True)
    args = parser.parse_args()
    calls: list[dict] = []
    count_calls(calls, CALLED)
    fn = load(args.module, "my_live_mean", "live_mean")
    record = [one_case(fn, dead, dtype, info, calls) for dead in dead_sets(info.world_size)
              for dtype in (torch.float32, torch.float64)]
    dph.gather_to_file(info, record, "my_live_mean.json")


if __name__ == "__main__":
    dph.worker(main)
