"""torch's own ZeRO-3, FSDP2's `fully_shard`, applied the way notebooks 08 and 10 use it (plain DP ranks or HSDP)."""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from dp_helpers.scratch.ddp.mini_ddp import broadcast_state


def fully_sharded(model: nn.Module, shard_size: int | None = None) -> nn.Module:
    """torch's FSDP2 in place (each module with parameters, then the root) over all ranks; HSDP with shard_size (notebook 10)."""
    # with shard_size S: a (W / S, S) mesh, sharded within each group of S consecutive ranks, replicated across groups
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    broadcast_state(model)  # fully_shard does not broadcast: without this each rank would keep its own initial rows
    device = next(model.parameters()).device.type
    world = dist.get_world_size()
    mesh = init_device_mesh(device, (world,)) if shard_size is None else \
        init_device_mesh(device, (world // shard_size, shard_size), mesh_dim_names=("replicate", "shard"))
    for module in model.modules():
        if module is not model and any(True for _ in module.parameters(recurse=False)):
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model

