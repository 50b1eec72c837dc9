"""Step times of every strategy on one model, side by side in the same processes (benchmarks/README.md records runs).

Run with run_ddp("dp_helpers.scripts.strategy_times", "--rounds", "5", world_size=2); rank 0 writes times.json:
each rank's median step time per strategy, the strategies taking turns round by round so that a noisy moment of
a shared machine hits all of them alike. Correctness is not measured here: the equivalence matrix in tests/ does that.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from dp_helpers.tool import dist as dph
from dp_helpers.tool.env import worker_numerics
from dp_helpers.tool.training import bce_loss


def mlp(width: int, depth: int) -> nn.Module:
    """depth hidden layers of width, seeded alike on every rank."""
    torch.manual_seed(0)
    layers, dim = [], 64
    for _ in range(depth):
        layers += [nn.Linear(dim, width), nn.ReLU()]
        dim = width
    return nn.Sequential(*layers, nn.Linear(dim, 1), nn.Sigmoid())


def build(name: str, width: int, depth: int):
    """(model to call, optimizer) for one strategy, Adam throughout."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from dp_helpers.scratch.ddp import mini_ddp
    from dp_helpers.scratch.sharding import fsdp, zero, zero3

    m = mlp(width, depth)
    if name == "DDP":
        return (w := DDP(m)), torch.optim.Adam(w.parameters(), lr=1e-3)
    if name == "MiniDDP":
        return (w := mini_ddp.MiniDDP(m)), torch.optim.Adam(m.parameters(), lr=1e-3)
    if name == "ZeroRedundancyOptimizer":
        return (w := DDP(m)), ZeroRedundancyOptimizer(w.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    if name in ("ZeRO-1 (ours)", "ZeRO-2 (ours)"):
        return m, zero.ZeroOptimizer(m.parameters(), torch.optim.Adam, stage=int(name[5]), lr=1e-3)
    if name == "ZeRO-3 (ours)":
        return (w := zero3.Zero3Module(m)), torch.optim.Adam(w.parameters(), lr=1e-3)
    if name == "fully_shard":
        return (w := fsdp.fully_sharded(m)), torch.optim.Adam(w.parameters(), lr=1e-3)
    raise ValueError(f"unknown strategy {name!r}")


STRATEGIES = ("DDP", "MiniDDP", "ZeRO-1 (ours)", "ZeroRedundancyOptimizer", "ZeRO-2 (ours)", "ZeRO-3 (ours)",
              "fully_shard")


def steps(model, opt, x, y, n: int) -> float:
    """Seconds for n training steps, from a barrier."""
    dist.barrier()
    start = time.perf_counter()
    for _ in range(n):
        opt.zero_grad()
        bce_loss(model(x).squeeze(1), y).backward()
        opt.step()
    return time.perf_counter() - start


def measure(info: dph.DistInfo, args) -> dict:
    """Each strategy's median seconds per step over the rounds, strategies alternating within each round."""
    built = {name: build(name, args.width, args.depth) for name in STRATEGIES}
    gen = torch.Generator().manual_seed(info.rank)
    x, y = torch.randn(args.batch, 64, generator=gen), torch.rand(args.batch, generator=gen)
    times = {name: [] for name in STRATEGIES}
    for model, opt in built.values():
        steps(model, opt, x, y, 2)  # warm-up: buckets rebuilt, first gathers recorded, state allocated
    for _ in range(args.rounds):
        for name, (model, opt) in built.items():
            times[name].append(steps(model, opt, x, y, args.steps) / args.steps)
    params = sum(p.numel() for p in mlp(args.width, args.depth).parameters())
    return {"parameters": params, "seconds_per_step": {n: statistics.median(t) for n, t in times.items()}}


def parse_args(argv=None) -> argparse.Namespace:
    """--width, --depth, --batch (per rank), --rounds, --steps."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    return parser.parse_args(argv)


@worker_numerics()
def main(info: dph.DistInfo) -> None:
    """Measure on every rank; rank 0 writes times.json with every rank's result."""
    dph.gather_to_file(info, measure(info, parse_args()), "times.json")


if __name__ == "__main__":
    dph.worker(main)
