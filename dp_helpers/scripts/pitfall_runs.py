"""The classic DDP mistakes, each run for real next to its fix; a short process-group timeout turns hangs into errors (notebooks 06, 07).

Cases: uneven / uneven-join (ranks with different numbers of batches), rank0-collective /
rank0-fixed (a collective inside `if rank == 0:`) and module-prefix (saving the DDP wrapper's
state_dict instead of model.module's). An unused parameter's hang is notebook 04's (scripts/from_scratch.py).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join

from dp_helpers import dist as dph
from dp_helpers.models import build_model
from dp_helpers.training import bce_loss


def batch(rank: int, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s i-th small batch (the same on every call)."""
    gen = torch.Generator().manual_seed(100 * rank + i)
    return torch.randn(8, 10, generator=gen), torch.rand(8, 1, generator=gen)


def train_batches(model, n_batches: int, info: dph.DistInfo) -> int:
    """Train on n_batches small batches; returns how many ran."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(n_batches):
        x, y = batch(info.rank, i)
        opt.zero_grad()
        bce_loss(model(x.to(info.device)), y.to(info.device)).backward()
        opt.step()
    return n_batches


def batches_of(rank: int) -> int:
    """Uneven inputs: rank r has 5 - 2 (r % 2) batches."""
    return 5 - 2 * (rank % 2)


def uneven(info: dph.DistInfo, join: bool) -> dict:
    """Without Join the ranks that finish first wait at the next collective; with it, everyone finishes."""
    model = dph.wrap_ddp(build_model("linear", 10, seed=0).to(info.device), info)
    if join:
        with Join([model]):  # finished ranks shadow the others' all-reduces until everyone is done
            done = train_batches(model, batches_of(info.rank), info)
    else:
        done = train_batches(model, batches_of(info.rank), info)
    dist.barrier()  # e.g. before saving: the rank with fewer batches arrives here early
    weights = {k: v.cpu().tolist() for k, v in model.module.state_dict().items()}
    return {"batches": done, "weights": weights, "replay": join_replay(info.world_size) if join else None}


def join_replay(world_size: int) -> dict:
    """One process replaying what Join computes: each step averages the gradients of the ranks still training, divided by the initial world size."""
    model = build_model("linear", 10, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(max(map(batches_of, range(world_size)))):
        opt.zero_grad()
        for rank in (r for r in range(world_size) if i < batches_of(r)):  # a joined rank contributes zeros
            x, y = batch(rank, i)
            (bce_loss(model(x), y) / world_size).backward()
        opt.step()
    return {k: v.tolist() for k, v in model.state_dict().items()}


def rank0_collective(info: dph.DistInfo, fixed: bool) -> dict:
    """Average a metric for the log: inside `if rank == 0:` the all_reduce waits for ranks that never call it."""
    metric = torch.tensor([float(info.rank)], device=info.device)
    if fixed:
        dist.all_reduce(metric)  # every rank takes part...
        if info.rank == 0:  # ...only rank 0 prints
            print(f"mean metric {metric.item() / info.world_size}", flush=True)
    elif info.rank == 0:
        dist.all_reduce(metric)  # the bug: the other ranks never join this all_reduce
        print(f"mean metric {metric.item() / info.world_size}")
    dist.barrier()
    return {"metric": metric.item()}


def module_prefix(info: dph.DistInfo) -> dict:
    """Load the wrapper's state_dict into a plain model (fails), then model.module's (works)."""
    model, plain = dph.wrap_ddp(build_model("linear", 10, seed=0).to(info.device), info), build_model("linear", 10, seed=1)
    try:
        plain.load_state_dict(model.state_dict())
        error = ""
    except RuntimeError as exc:
        error = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())  # every line torch wrote
    plain.load_state_dict(model.module.state_dict())
    return {"wrapper_keys": list(model.state_dict()), "error": error, "module_keys": list(model.module.state_dict())}


CASES = {
    "uneven": lambda info: uneven(info, join=False), "uneven-join": lambda info: uneven(info, join=True),
    "rank0-collective": lambda info: rank0_collective(info, fixed=False),
    "rank0-fixed": lambda info: rank0_collective(info, fixed=True),
    "module-prefix": module_prefix,
}


def main(info: dph.DistInfo) -> None:
    """Run the chosen cases on every rank; rank 0 writes <case>.json as each finishes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=sorted(CASES), nargs="+", required=True)
    args = parser.parse_args()
    for name in args.case:  # several in one launch: the process start-up is paid once
        dph.gather_to_file(info, CASES[name](info), f"{name}.json")


if __name__ == "__main__":
    dph.worker(main)
