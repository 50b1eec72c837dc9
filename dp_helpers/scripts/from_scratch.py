"""DDP from scratch, measured: drift without the broadcast, all-reduce counts, a backward's timeline, step time next to DDP.

Run with run_ddp("dp_helpers.scripts.from_scratch", "--experiment", "drift", "counts", "timeline", "timing",
world_size=2); rank 0 writes <experiment>.json with every rank's result.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from dp_helpers import dist as dph
from dp_helpers import mini_ddp
from dp_helpers.training import bce_loss


def mlp(seed: int, width: int = 32, depth: int = 3) -> nn.Module:
    """An MLP with `depth` hidden layers (the middle ones without bias), seeded."""
    torch.manual_seed(seed)
    layers, dim = [], 10
    for i in range(depth):
        layers += [nn.Linear(dim, width, bias=i != 1), nn.ReLU()]
        dim = width
    return nn.Sequential(*layers, nn.Linear(dim, 1), nn.Sigmoid())


def batch(info: dph.DistInfo, step: int, rows: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's rows of the global batch of `step`."""
    gen = torch.Generator().manual_seed(step)
    x, y = torch.randn(info.world_size * rows, 10, generator=gen), torch.rand(info.world_size * rows, generator=gen)
    mine = slice(info.rank * rows, (info.rank + 1) * rows)
    return x[mine], y[mine]


def train(model: nn.Module, info: dph.DistInfo, steps: int = 5, average=None) -> float:
    """SGD steps; `average(model)` between backward and step when the model does not all-reduce itself; the weights' sum."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(steps):
        x, y = batch(info, step)
        opt.zero_grad()
        bce_loss(model(x), y).backward()
        if average:
            average(model)
        opt.step()
    return sum(p.sum().item() for p in model.parameters())


def drift(info: dph.DistInfo, args) -> dict:
    """Averaged gradients from different starting weights, without and with broadcast_state: the weights' sum per rank."""
    from dp_helpers.collectives import average_gradients

    apart = train(mlp(seed=info.rank), info, average=average_gradients)
    synced = mlp(seed=info.rank)
    mini_ddp.broadcast_state(synced)
    return {"without broadcast": apart, "with broadcast": train(synced, info, average=average_gradients)}


def counts(info: dph.DistInfo, args) -> dict:
    """All-reduces per step: one per parameter with hooks, one per bucket with buckets of each cap."""
    out = {"hooks": _per_step(mini_ddp.HookAllReduce(mlp(0)), info)}
    for cap in args.caps:
        model = mini_ddp.MiniDDP(mlp(0), bucket_cap_mb=cap)
        out[f"buckets of {cap} MiB"] = _per_step(model, info)
    return out


def _per_step(model, info: dph.DistInfo) -> float:
    """The wrapper's all-reduces per step over a short training."""
    train(model, info, steps=4)
    return model.allreduces / 4


def timeline(info: dph.DistInfo, args) -> list[dict]:
    """The events of one backward (after one warm-up step) of MiniDDP on a wider MLP."""
    model = mini_ddp.MiniDDP(mlp(0, width=512, depth=4), bucket_cap_mb=args.bucket_cap_mb)
    train(model, info, steps=1)
    model.events.clear()
    x, y = batch(info, 99)
    bce_loss(model(x), y).backward()  # the engine callback waits for the buckets before backward() returns
    return model.events


def timing(info: dph.DistInfo, args) -> dict:
    """Median seconds per training step of MiniDDP and of DDP on the same model and batches, alternating."""
    models = {"MiniDDP": mini_ddp.MiniDDP(mlp(0, width=512, depth=4)),
              "DDP": dph.wrap_ddp(mlp(0, width=512, depth=4), info)}
    times = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, model in models.items():
            start = time.perf_counter()
            train(model, info, steps=args.steps)
            times[name].append((time.perf_counter() - start) / args.steps)
    return {name: statistics.median(t) for name, t in times.items()}


EXPERIMENTS = {"drift": drift, "counts": counts, "timeline": timeline, "timing": timing}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Which experiments, and their settings."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", choices=sorted(EXPERIMENTS), nargs="+", required=True)
    parser.add_argument("--caps", type=float, nargs="+", default=[0.001, 0.01, 25.0], help="bucket caps in MiB")
    parser.add_argument("--bucket-cap-mb", type=float, default=0.5, help="the timeline's bucket cap")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    return parser.parse_args(argv)


def main(info: dph.DistInfo) -> None:
    """Run the chosen experiments on every rank; rank 0 writes <experiment>.json for each."""
    args = parse_args()
    for name in args.experiment:
        dph.gather_to_file(info, EXPERIMENTS[name](info, args), f"{name}.json")


if __name__ == "__main__":
    dph.worker(main)
