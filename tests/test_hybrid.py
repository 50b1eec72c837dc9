"""dp_helpers.hybrid: hybrid sharding on 4 ranks (2 groups of 2) from scratch and as torch's HSDP, both one process."""

import pytest
import torch
from torch import nn

GLOBAL_BATCH, STEPS, SHARD = 16, 3, 2


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 1))


def batches() -> list:
    gen = torch.Generator().manual_seed(5)
    return [(torch.randn(GLOBAL_BATCH, 6, generator=gen), torch.randn(GLOBAL_BATCH, 1, generator=gen)) for _ in range(STEPS)]


def train(m: nn.Module, opt, rank: int, world: int) -> None:
    rows = GLOBAL_BATCH // world
    for x, y in batches():
        opt.zero_grad()
        nn.functional.mse_loss(m(x[rank * rows:(rank + 1) * rows]), y[rank * rows:(rank + 1) * rows]).backward()
        opt.step()


def both(info) -> dict:
    """Ours and torch's HSDP on a (replicate 2, shard 2) layout: weights, groups, placements, bytes sent."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from dp_helpers.hybrid import HybridZeroAdam

    m = model()
    ours = HybridZeroAdam(m, shard_size=SHARD, lr=0.05)
    train(m, ours, info.rank, info.world_size)
    groups = [dist.get_process_group_ranks(g) for g in (ours.shard_group, ours.replicate_group)]
    mesh = init_device_mesh("cpu", (info.world_size // SHARD, SHARD), mesh_dim_names=("replicate", "shard"))
    torch_groups = [dist.get_process_group_ranks(mesh[name].get_group()) for name in ("shard", "replicate")]
    t = model()
    for layer in t:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(t, mesh=mesh)
    train(t, torch.optim.Adam(t.parameters(), lr=0.05), info.rank, info.world_size)
    weight = t[0].weight
    return {"ours": {k: v.clone() for k, v in m.state_dict().items()}, "sent": ours.sent,
            "chunk": ours.shard.numel(), "groups": groups, "torch groups": torch_groups,
            "torch": {k: v.full_tensor() for k, v in t.state_dict().items()},
            "placements": str(weight.placements), "local rows": weight.to_local().shape[0]}


@pytest.mark.slow
def test_hybrid_sharding_from_scratch_and_torchs_hsdp_equal_one_process(pools):
    m = model()
    opt = torch.optim.Adam(m.parameters(), lr=0.05)
    train(m, opt, 0, 1)
    psi = sum(p.numel() for p in m.parameters())
    for rank, got in enumerate(pools.get(4).run(both)):
        torch.testing.assert_close(got["ours"], m.state_dict(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got["torch"], m.state_dict(), rtol=1e-5, atol=1e-6)
        # rank r shards with its neighbour in [0, 1] or [2, 3] and holds the same chunk as r +- 2, as torch's mesh
        assert got["groups"] == got["torch groups"] == [[rank // 2 * 2, rank // 2 * 2 + 1], [rank % 2, rank % 2 + 2]]
        assert got["placements"] == "(Replicate(), Shard(dim=0))" and got["local rows"] == 10 // SHARD
        chunk = -(-psi // SHARD)  # each rank's 1/S of the flat buffer, padded
        assert got["chunk"] == chunk
        # bytes handed to each collective per step: the full buffer within the group, one chunk across groups
        assert got["sent"] == {"reduce_scatter": STEPS * 4 * SHARD * chunk, "all_reduce": STEPS * 4 * chunk,
                               "all_gather": STEPS * 4 * SHARD * chunk}
