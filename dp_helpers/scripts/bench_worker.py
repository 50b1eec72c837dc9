"""Timings for `python -m dp_helpers bench`, one process per rank: training throughput or all-reduce time (notebook 05)."""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP

from dp_helpers import dist as dph
from dp_helpers.collectives import ring_all_reduce
from dp_helpers.models import MLP


def sync(info: dph.DistInfo) -> None:
    """Wait for queued GPU work, so the clock measures it (a no-op on CPU)."""
    if info.device.type != "cpu":
        torch.cuda.synchronize(info.device)


def throughput(model, batch: int, args, info: dph.DistInfo) -> float:
    """Samples per second this rank trains at, after warm-up steps."""
    x, y = torch.randn(batch, args.dim, device=info.device), torch.rand(batch, 1, device=info.device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step() -> None:
        """One training step."""
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.binary_cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    sync(info)
    dist.barrier()  # everyone starts the clock together
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync(info)
    return batch * args.steps / (time.perf_counter() - start)


def train_mode(args, info: dph.DistInfo) -> dict:
    """Throughput for every batch size, with DDP or as independent processes that never communicate."""
    torch.manual_seed(0)
    model = MLP(args.dim, hidden=args.hidden, depth=args.depth).to(info.device)
    if args.ddp:
        model = DDP(model, device_ids=[info.device] if info.device.type != "cpu" else None)
    return {str(b): throughput(model, b, args, info) for b in args.batches}


def timed(fn, tensor: torch.Tensor, repeats: int, info: dph.DistInfo) -> float:
    """Median seconds of one collective call over `repeats` calls (after one warm-up)."""
    fn(tensor.clone())
    times = []
    for _ in range(repeats):
        work = tensor.clone()
        dist.barrier()
        start = time.perf_counter()
        fn(work)
        sync(info)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def allreduce_mode(args, info: dph.DistInfo) -> list[dict]:
    """dist.all_reduce and ring_all_reduce times for each message size."""
    rows = []
    for mib in args.sizes:
        tensor = torch.randn(max(1, int(mib * 2**20 / 4)), device=info.device)
        rows.append({"bytes": tensor.numel() * 4, "all_reduce_s": timed(dist.all_reduce, tensor, args.repeats, info),
                     "ring_s": timed(ring_all_reduce, tensor, args.repeats, info)})
    return rows


@record
def main() -> None:
    """Measure on every rank; rank 0 writes bench.json with every rank's numbers."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("train", "allreduce"), required=True)
    parser.add_argument("--ddp", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--batches", type=int, nargs="+", default=[64])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--sizes", type=float, nargs="+", default=[1.0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    info = dph.setup()
    try:
        result = train_mode(args, info) if args.mode == "train" else allreduce_mode(args, info)
        dph.gather_to_file(info, result, "bench.json")
    finally:
        dph.teardown()


if __name__ == "__main__":
    main()
