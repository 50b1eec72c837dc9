"""Notebook 04's exercise: the heart of DDP. Write ready() and launch(); everything else is given.

check_my_ddp("my_ddp_core.py") runs this MyDDP on 2 gloo ranks next to torch's DistributedDataParallel.
"""

import torch  # noqa: F401 (for your code)
import torch.distributed as dist  # noqa: F401 (for your code)
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
        raise NotImplementedError  # your code: add param to self.ready_params; launch buckets self.next, ... while full

    def launch(self, k: int) -> None:
        """Flatten bucket k's gradients into one buffer, divided by the world size, and start its all-reduce."""
        raise NotImplementedError  # your code: one flat buffer, dist.all_reduce(..., async_op=True), self.pending

    def finish(self) -> None:
        """After the backward: wait for every all-reduce and copy the averaged gradients back into .grad."""
        for k, flat, work in self.pending:
            work.wait()
            offset = 0
            for p in self.buckets[k]:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        self.ready_params, self.next, self.pending = set(), 0, []
