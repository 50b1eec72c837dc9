"""dp_helpers.sharded_checkpoint: a DDP or FSDP2 run saved on 2 ranks resumes on 3 and on 1 and ends as one process."""

import pytest
import torch
from torch import nn

GLOBAL_BATCH, STEPS = 12, 4  # 12 rows: 6 per rank on 2, 4 per rank on 3, 12 on 1


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 9), nn.Tanh(), nn.Linear(9, 7), nn.Tanh(), nn.Linear(7, 1))


def batches() -> list:
    gen = torch.Generator().manual_seed(4)
    return [(torch.randn(GLOBAL_BATCH, 5, generator=gen), torch.randn(GLOBAL_BATCH, 1, generator=gen)) for _ in range(STEPS)]


def wrapped(kind: str, world: int) -> nn.Module:
    """The model as each strategy trains it (on 1 rank a plain module: nothing to wrap)."""
    m = model()
    if world == 1:
        return m
    if kind == "DDP":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(m)
    from torch.distributed.fsdp import fully_shard

    for layer in m:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    return fully_shard(m)


def steps(m: nn.Module, opt, rank: int, world: int, which: range) -> None:
    """Adam steps on this rank's rows of the global batches."""
    rows = GLOBAL_BATCH // world
    for i in which:
        x, y = batches()[i]
        opt.zero_grad()
        nn.functional.mse_loss(m(x[rank * rows:(rank + 1) * rows]), y[rank * rows:(rank + 1) * rows]).backward()
        opt.step()


def first_half(info, kind: str, folder: str) -> None:
    from dp_helpers import sharded_checkpoint

    m = wrapped(kind, info.world_size)
    opt = torch.optim.Adam(m.parameters(), lr=0.05)
    steps(m, opt, info.rank, info.world_size, range(STEPS // 2))
    sharded_checkpoint.save(folder, m, opt)


def second_half(info, kind: str, folder: str) -> dict:
    from dp_helpers import sharded_checkpoint

    m = wrapped(kind, info.world_size)
    opt = torch.optim.Adam(m.parameters(), lr=0.05)
    sharded_checkpoint.load(folder, m, opt)
    steps(m, opt, info.rank, info.world_size, range(STEPS // 2, STEPS))
    state = getattr(m, "module", m).state_dict()
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone() for k, v in state.items()}


def uninterrupted() -> dict:
    m = model()
    steps(m, torch.optim.Adam(m.parameters(), lr=0.05), 0, 1, range(STEPS))
    return m.state_dict()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["DDP", "fully_shard"])
def test_saved_on_two_ranks_resumed_on_three_and_on_one_ends_as_one_process(pools, tmp_path, kind):
    folder = str(tmp_path / "checkpoint")
    pools.get(2).run(first_half, kind, folder)
    reference = uninterrupted()
    for world in (3, 1):  # resharded: 3 ranks read pieces of 2 ranks' shards; 1 rank reads them all
        for rank, weights in enumerate(pools.get(world).run(second_half, kind, folder)):
            torch.testing.assert_close(weights, reference, rtol=1e-5, atol=1e-6, msg=lambda m, w=world, r=rank: f"{w} ranks, rank {r}: {m}")
