"""Notebook 04, exercise 3: the heart of DDP, ready() and launch() written into the given MyDDP."""

import torch
import torch.distributed as dist
from torch import nn

from dp_helpers.scratch.ddp.mini_ddp import assign_buckets, broadcast_state, engine_callback


class MyDDP(nn.Module):
    """Average the gradients over all ranks, one flat bucket at a time, while the backward still runs."""

    def __init__(self, module: nn.Module, bucket_cap_bytes: int):
        super().__init__()
        self.module = module
        broadcast_state(module)  # the same start on every rank
        params = list(reversed(list(module.parameters())))  # the order in which the backward produces gradients
        groups = assign_buckets([p.numel() * p.element_size() for p in params], bucket_cap_bytes)
        self.buckets = [[params[i] for i in group] for group in groups]  # lists of parameters
        self.ready_params, self.next, self.pending = set(), 0, []  # pending: (bucket index, flat buffer, work)
        for p in params:
            p.register_post_accumulate_grad_hook(self.ready)

    def forward(self, *args, **kwargs):
        """The wrapped module's forward."""
        return self.module(*args, **kwargs)

    def ready(self, param: nn.Parameter) -> None:
        """The hook: param.grad is final. Mark it ready, then launch each full bucket whose turn has come, in order."""
        if not self.ready_params:  # the first gradient of this backward: finish() runs once the backward is done
            engine_callback(self.finish)
        self.ready_params.add(param)
        while self.next < len(self.buckets) and all(p in self.ready_params for p in self.buckets[self.next]):
            self.launch(self.next)  # every rank launches the buckets in this one order
            self.next += 1

    def launch(self, k: int) -> None:
        """Flatten bucket k's gradients into one buffer, divided by the world size, and start its all-reduce."""
        flat = torch.cat([p.grad.flatten() for p in self.buckets[k]]) / dist.get_world_size()
        self.pending.append((k, flat, dist.all_reduce(flat, async_op=True)))  # returns at once: the backward goes on

    def finish(self) -> None:
        """After the backward: wait for every all-reduce and copy the averaged gradients back into .grad."""
        for k, flat, work in self.pending:
            work.wait()
            offset = 0
            for p in self.buckets[k]:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        self.ready_params, self.next, self.pending = set(), 0, []
