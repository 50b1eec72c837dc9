"""Notebook 08, exercise 3: one ZeRO-1 step, written into the given MyZero1."""

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
        mine = torch.empty(self.chunk)
        reduce_scatter(mine, self.flat(p.grad for p in self.params))  # the sum of this rank's chunk, nothing else
        mine /= self.world_size  # the average gradient
        own = self.flat(self.params)[self.rank * self.chunk:(self.rank + 1) * self.chunk]
        self.velocity.mul_(self.momentum).add_(mine)  # torch.optim.SGD's momentum, on this chunk only
        own -= self.lr * self.velocity
        full = torch.empty(self.chunk * self.world_size)
        all_gather(full, own.contiguous())  # every rank's updated chunk, in rank order
        self.write_back(full)
