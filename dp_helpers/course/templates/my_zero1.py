"""Notebook 08's exercise: one ZeRO-1 step. Write step(); the flat buffers around it are given.

check_my_zero1("my_zero1.py") trains with this optimizer on 2 and 3 gloo ranks and compares with one process.
"""

import torch
import torch.distributed as dist

# torch 2.13 names them reduce_scatter_single and all_gather_single; older releases only have the *_tensor names
reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class MyZero1:
    """SGD with momentum whose momentum each rank keeps for its own chunk of the parameters only (ZeRO stage 1)."""

    def __init__(self, params, lr: float, momentum: float):
        self.params, self.lr, self.momentum = list(params), lr, momentum
        self.world_size, self.rank = dist.get_world_size(), dist.get_rank()
        numel = sum(p.numel() for p in self.params)
        self.chunk = -(-numel // self.world_size)  # every rank's share of the flat buffer (the last one padded)
        self.velocity = torch.zeros(self.chunk)  # this rank's optimizer state: 1/world_size of it

    def flat(self, tensors) -> torch.Tensor:
        """The tensors, flattened and concatenated, padded with zeros to world_size chunks."""
        flat = torch.cat([t.detach().flatten() for t in tensors])
        return torch.cat([flat, flat.new_zeros(self.chunk * self.world_size - flat.numel())])

    def write_back(self, flat: torch.Tensor) -> None:
        """Copy the values of a flat (padded) buffer into the parameters."""
        offset = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def zero_grad(self) -> None:
        """Forget the gradients."""
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        """Reduce-scatter the gradients, update this rank's chunk (SGD with momentum), all-gather every chunk."""
        raise NotImplementedError  # your code: see the three steps in the notebook
