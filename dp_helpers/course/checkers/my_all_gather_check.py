"""A learner's ring_all_gather (notebook 03's exercise) on every rank, next to dist.all_gather, over several shapes.

    python -m torch.distributed.run --nproc-per-node 3 -m dp_helpers.course.checkers.my_all_gather_check --module my_all_gather.py

Every rank records, per case, which torch.distributed functions the learner's code called, with whom, how many bytes
it sent, the shape of its result and which rank's tensor each piece of it holds. Rank 0 writes my_all_gather.json.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from dp_helpers.course.checkers.my_zero1_check import count_calls, load
from dp_helpers.tool import dist as dph

CALLED = ("send", "recv", "isend", "irecv", "batch_isend_irecv", "all_gather", "all_gather_into_tensor",
          "all_gather_single", "all_reduce", "broadcast", "gather", "scatter", "all_to_all", "all_to_all_single")
CASES = [((5,), torch.float32), ((1,), torch.float32), ((3, 4), torch.float32), ((2,), torch.float64),
         ((4,), torch.int64)]


def tensor_of(rank: int, shape, dtype) -> torch.Tensor:
    """Rank's input: values that say whose they are (rank * 1000 + position)."""
    return (torch.arange(torch.Size(shape).numel()) + 1000 * rank).reshape(shape).to(dtype)


def whose(result: torch.Tensor, shape, dtype, world_size: int) -> list[int | None]:
    """For each rank-sized piece of the result, the rank whose tensor it is (None: nobody's)."""
    pieces = result.reshape(world_size, *shape) if result.numel() == world_size * torch.Size(shape).numel() else []
    return [next((r for r in range(world_size) if torch.equal(p, tensor_of(r, shape, dtype))), None) for p in pieces]


class Handle:
    """What dist.isend and dist.irecv return, noting whether the learner waited on it."""

    def __init__(self, work):
        self.work, self.waited = work, False

    def wait(self, *args, **kwargs):
        """The work's wait, noted."""
        self.waited = True
        return self.work.wait(*args, **kwargs)

    def __getattr__(self, name):
        """Anything else of the work's (is_completed, ...)."""
        return getattr(self.work, name)


def note_waits(handles: list) -> None:
    """Have dist.isend and dist.irecv hand out Handles, each kept in `handles`."""
    for name in ("isend", "irecv"):
        original = getattr(dist, name)

        def noted(*args, _original=original, **kwargs):
            """The original's work, as a Handle."""
            handles.append(Handle(_original(*args, **kwargs)))
            return handles[-1]

        setattr(dist, name, noted)


def one_case(fn, shape, dtype, info: dph.DistInfo, calls: list, handles: list) -> dict:
    """The learner's all-gather of one input: its calls, the bytes sent, the result's shape and pieces."""
    del calls[:], handles[:]
    result = fn(tensor_of(info.rank, shape, dtype))
    unwaited = sum(not h.waited for h in handles)
    if unwaited:  # the result may be read before its pieces arrive: say so, rather than whatever follows from it
        raise RuntimeError(f"ring_all_gather returned with {unwaited} of its {len(handles)} isend/irecv handles "
                           "never waited on")
    sent = sum(c["values"] * torch.empty((), dtype=dtype).element_size() for c in calls if "send" in c["name"])
    return {"shape": list(shape), "dtype": str(dtype), "calls": [dict(c) for c in calls], "bytes": sent,
            "mine": torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size(),
            "result_shape": list(result.shape) if isinstance(result, torch.Tensor) else None,
            "whose": whose(result, shape, dtype, info.world_size) if isinstance(result, torch.Tensor) else []}


def main(info: dph.DistInfo) -> None:
    """Every case on every rank; rank 0 writes every rank's record."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", required=True)
    args = parser.parse_args()
    calls: list[dict] = []
    handles: list[Handle] = []
    count_calls(calls, CALLED)
    note_waits(handles)
    fn = load(args.module, "my_all_gather", "ring_all_gather")
    record = [one_case(fn, shape, dtype, info, calls, handles) for shape, dtype in CASES]
    dph.gather_to_file(info, record, "my_all_gather.json")


if __name__ == "__main__":
    dph.worker(main)
