"""Hybrid sharding next to torch's HSDP, and checkpoints saved on one world size, loaded on another (notebook 10).

Run with run_ddp("dp_helpers.scripts.hsdp_reshard", "--experiment", "hsdp", "save", "--folder", F, world_size=4),
then "--experiment", "resume", "--folder", F on another world size; rank 0 writes <experiment>.json with every
rank's result. tests/test_hybrid.py and tests/test_sharded_checkpoint.py run the same functions in rank pools.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn

from dp_helpers.scratch.sharding import fsdp
from dp_helpers.tool import dist as dph

GLOBAL_BATCH, STEPS, SHARD = 12, 4, 2  # 12 rows split evenly over 1, 2, 3 and 4 ranks
KINDS = ("DDP", "fully_shard")


def model() -> nn.Module:
    """A small seeded Tanh MLP: the same on every rank and in the one-process reference."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 7), nn.Tanh(), nn.Linear(7, 1))


def batches() -> list:
    """STEPS seeded global batches of GLOBAL_BATCH rows."""
    gen = torch.Generator().manual_seed(5)
    return [(torch.randn(GLOBAL_BATCH, 6, generator=gen), torch.randn(GLOBAL_BATCH, 1, generator=gen))
            for _ in range(STEPS)]


def train(m: nn.Module, opt, rank: int, world: int, which: range = range(STEPS)) -> None:
    """Adam steps on this rank's rows of the global batches (mean loss: the ranks' average is the batch's)."""
    rows = GLOBAL_BATCH // world
    for i in which:
        x, y = batches()[i]
        opt.zero_grad()
        nn.functional.mse_loss(m(x[rank * rows:(rank + 1) * rows]), y[rank * rows:(rank + 1) * rows]).backward()
        opt.step()


def uninterrupted() -> dict:
    """One process, the whole global batch, every step: what each run here must end with."""
    m = model()
    train(m, torch.optim.Adam(m.parameters(), lr=0.05), 0, 1)
    return m.state_dict()


def full(state: dict) -> dict:
    """A state_dict's tensors whole (DTensors gathered: a collective), detached copies."""
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone() for k, v in state.items()}


def hsdp(info, _args=None) -> dict:
    """Ours (dp_helpers.scratch.sharding.hybrid) and torch's HSDP on a (replicate W/2, shard 2) layout: weights, groups, bytes sent."""
    import torch.distributed as dist

    from dp_helpers.scratch.sharding.hybrid import HybridZeroAdam

    m = model()
    ours = HybridZeroAdam(m, shard_size=SHARD, lr=0.05)
    train(m, ours, info.rank, info.world_size)
    t = fsdp.fully_sharded(model(), SHARD)  # fully_shard on a (replicate W/2, shard 2) mesh: torch's HSDP
    mesh = t[0].weight.device_mesh
    train(t, torch.optim.Adam(t.parameters(), lr=0.05), info.rank, info.world_size)
    return {"ours": full(m.state_dict()), "torch": full(t.state_dict()), "sent": ours.sent, "chunk": ours.shard.numel(),
            "groups": [dist.get_process_group_ranks(g) for g in (ours.shard_group, ours.replicate_group)],
            "torch groups": [dist.get_process_group_ranks(mesh[name].get_group()) for name in ("shard", "replicate")],
            "placements": str(t[0].weight.placements), "local rows": t[0].weight.to_local().shape[0]}


def wrapped(kind: str, world: int) -> nn.Module:
    """The model as each strategy trains it (on 1 rank a plain module: nothing to wrap)."""
    if world == 1:
        return model()
    if kind == "DDP":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model())
    return fsdp.fully_sharded(model())


def first_half(info, kind: str, folder: str) -> None:
    """Train the first half of the steps, then save model and optimizer with DCP (every rank its own shards)."""
    from dp_helpers.scratch.sharding import checkpoint as sharded_checkpoint

    m = wrapped(kind, info.world_size)
    opt = torch.optim.Adam(m.parameters(), lr=0.05)
    train(m, opt, info.rank, info.world_size, range(STEPS // 2))
    sharded_checkpoint.save(folder, m, opt)


def second_half(info, kind: str, folder: str) -> dict:
    """Load the checkpoint onto this run's ranks (resharded), train the rest, return the full weights."""
    from dp_helpers.scratch.sharding import checkpoint as sharded_checkpoint

    m = wrapped(kind, info.world_size)
    opt = torch.optim.Adam(m.parameters(), lr=0.05)
    sharded_checkpoint.load(folder, m, opt)
    train(m, opt, info.rank, info.world_size, range(STEPS // 2, STEPS))
    return full(getattr(m, "module", m).state_dict())


def as_lists(result):
    """Tensors as nested lists, for JSON (float32 values survive the round trip exactly)."""
    if isinstance(result, dict):
        return {k: as_lists(v) for k, v in result.items()}
    return result.tolist() if isinstance(result, torch.Tensor) else result


def save(info, args) -> dict:
    """The first half of a DDP run and of a fully_shard run, each saved into its own folder under --folder."""
    for kind in KINDS:
        first_half(info, kind, str(Path(args.folder) / kind))
    return {"world_size": info.world_size}


def resume(info, args) -> dict:
    """Both runs loaded on this world size, finished; their full weights."""
    return {kind: as_lists(second_half(info, kind, str(Path(args.folder) / kind))) for kind in KINDS}


EXPERIMENTS = {"hsdp": lambda info, args: as_lists(hsdp(info)), "save": save, "resume": resume}


def main(info: dph.DistInfo) -> None:
    """Run the chosen experiments on every rank; rank 0 writes <experiment>.json for each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", choices=sorted(EXPERIMENTS), nargs="+", required=True)
    parser.add_argument("--folder", default="checkpoint", help="where save writes and resume reads the checkpoints")
    args = parser.parse_args()
    dph.write_experiments(info, EXPERIMENTS, args.experiment, args)


if __name__ == "__main__":
    dph.worker(main)
