"""Hybrid sharding (HSDP) from scratch: ZeRO within a group of ranks, plain data parallelism across the groups.

W = R x S ranks form R groups of S consecutive ranks. Each group shards the state as ZeRO does: rank r of it owns
chunk r. Rank r of every group owns the same chunk, so those R ranks are replicas of one another. One step:
reduce-scatter the gradients within the shard group (S ranks), all-reduce the chunk across the replicas (R ranks),
step the chunk, all-gather it within the shard group. The traffic that crosses groups — often machines — is one
chunk, 1/S of the gradients. The layout is the one torch's `init_device_mesh(device, (R, S), mesh_dim_names=
("replicate", "shard"))` builds, and `fully_shard(model, mesh=mesh)` on that mesh is torch's HSDP.
`HybridZeroAdam` is zero.py's ZeroAdam at stage 2 with its collectives inside the shard group and one all-reduce
added: it supports what ZeroAdam does (any model whose trained parameters share one dtype and device; an unused
parameter sends zeros; Adam's keyword arguments) and refuses a shard size that does not divide the world size. Adam
only: no other optimizer, no clipping, no accumulation switch. Notebook 10 teaches it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from dp_helpers.scratch.sharding.zero import ZeroAdam


def hybrid_groups(shard_size: int) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """This rank's shard group (its S consecutive ranks) and replicate group (the ranks holding its chunk)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if shard_size < 1 or world % shard_size:
        raise ValueError(f"hybrid sharding needs a shard size that divides the world size {world}, not {shard_size}.")
    mine = {}
    for start in range(0, world, shard_size):  # every rank creates every group, in the same order
        ranks = list(range(start, start + shard_size))
        group = dist.new_group(ranks)
        mine["shard"] = group if rank in ranks else mine.get("shard")
    for offset in range(shard_size):
        ranks = list(range(offset, world, shard_size))
        group = dist.new_group(ranks)
        mine["replicate"] = group if rank in ranks else mine.get("replicate")
    return mine["shard"], mine["replicate"]


class HybridZeroAdam(ZeroAdam):
    """ZeroAdam's stage 2 within each shard group, plus an all-reduce of the chunk across the replicas."""

    def __init__(self, model: nn.Module, shard_size: int, **adam):
        self.shard_group, self.replicate_group = hybrid_groups(shard_size)
        super().__init__(model, stage=2, group=self.shard_group, **adam)  # a Flat of S chunks: one per group rank
        self.shard_size, self.shard_rank = shard_size, self.rank
        self.sent["all_reduce"] = 0

    def average(self, summed: torch.Tensor) -> torch.Tensor:
        """The sum over this group's S ranks, all-reduced over the R groups: over all W ranks, then the mean."""
        dist.all_reduce(summed, group=self.replicate_group)
        self.sent["all_reduce"] += summed.numel() * summed.element_size()
        return summed.div_(dist.get_world_size())
