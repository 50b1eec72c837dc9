"""Hybrid sharding (HSDP) from scratch: ZeRO within a group of ranks, plain data parallelism across the groups.

W = R x S ranks form R groups of S consecutive ranks. Each group shards the state as ZeRO does: rank r of it owns
chunk r. Rank r of every group owns the same chunk, so those R ranks are replicas of one another. One step:
reduce-scatter the gradients within the shard group (S ranks), all-reduce the chunk across the replicas (R ranks),
step the chunk, all-gather it within the shard group. The traffic that crosses groups — often machines — is one
chunk, 1/S of the gradients. The layout is the one torch's `init_device_mesh(device, (R, S), mesh_dim_names=
("replicate", "shard"))` builds, and `fully_shard(model, mesh=mesh)` on that mesh is torch's HSDP.
`HybridZeroAdam` supports any model whose trained parameters share one dtype and device (an unused parameter sends
zeros), with Adam's keyword arguments; it refuses a shard size that does not divide the world size and parameters
of mixed dtypes or devices (one flat buffer). Adam only: no other optimizer, no clipping, no accumulation switch.
Notebook 10 teaches it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from dp_helpers.scratch.ddp.mini_ddp import broadcast_state
from dp_helpers.scratch.sharding.zero import Flat, all_gather_flat, reduce_scatter_flat


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


class HybridZeroAdam:
    """ZeRO-2 within each shard group, all-reduce across replicas: Adam's state and the update for 1/S per rank."""

    def __init__(self, model: nn.Module, shard_size: int, **adam):
        broadcast_state(model)
        self.shard_group, self.replicate_group = hybrid_groups(shard_size)
        self.shard_size, self.shard_rank = shard_size, dist.get_rank(self.shard_group)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.flat = Flat([p.detach() for p in self.params], shard_size)  # padded to S chunks
        for p, view in zip(self.params, self.flat.views, strict=True):
            p.data = view
        self.shard = nn.Parameter(self.flat.chunk(self.shard_rank))
        self.adam = torch.optim.Adam([self.shard], **adam)
        self.sent = {"reduce_scatter": 0, "all_reduce": 0, "all_gather": 0}  # bytes handed to each collective

    def step(self) -> None:
        """Reduce-scatter within the group, all-reduce the chunk across replicas, step it, all-gather the group."""
        full = torch.zeros_like(self.flat.buffer)
        for p, view in zip(self.params, self.flat.views_of(full), strict=True):
            if p.grad is not None:
                view.copy_(p.grad)
            p.grad = None  # stage 2: only this rank's chunk of the gradient is kept
        self.shard.grad = torch.empty_like(self.shard)
        reduce_scatter_flat(self.shard.grad, full, group=self.shard_group)  # the sum over this group's S ranks
        dist.all_reduce(self.shard.grad, group=self.replicate_group)  # and over the R groups: over all W ranks
        self.shard.grad.div_(dist.get_world_size())
        self.adam.step()
        all_gather_flat(self.flat.buffer, self.shard.detach().clone(), group=self.shard_group)
        nbytes = self.flat.buffer.numel() * self.flat.buffer.element_size()
        self.sent["reduce_scatter"] += nbytes
        self.sent["all_reduce"] += nbytes // self.shard_size
        self.sent["all_gather"] += nbytes

    def zero_grad(self) -> None:
        """Forget the gradients."""
        for p in self.params:
            p.grad = None
