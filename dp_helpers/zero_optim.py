"""ZeRO stages 1 and 2 behind torch's optimizer interface: `ZeroOptimizer(params, torch.optim.AdamW, stage=2, lr=...)`.

Like `torch.distributed.optim.ZeroRedundancyOptimizer`, it takes parameters or parameter groups and any
`torch.optim` optimizer class with its keyword arguments, and it is a `torch.optim.Optimizer` (`param_groups`,
`add_param_group`, `state_dict`/`load_state_dict` in the plain optimizer's format, consolidated on one rank).
Unlike it, it reduces the gradients itself, so it is used on the plain model and refuses a DDP-wrapped one:

- the trained parameters of each group are laid out in flat buckets of about `bucket_cap_mb` (last layer first,
  the order the backward produces gradients), each padded to a multiple of world_size; rank r owns chunk r of
  every bucket, and the inner optimizer steps only those chunks (elementwise optimizers: SGD, Adam, AdamW, ...);
- stage 1 keeps the full local gradients and reduce-scatters them at `step`;
- stage 2 reduce-scatters each bucket **during the backward**, as soon as its last gradient is ready, and frees
  the full gradients once they are copied into the bucket: between steps a rank holds only its chunks of them;
- `step` then all-gathers every bucket, so each rank's model holds the new full parameters.
Taught in notebook 08 (its ZeroAdam is the same idea around Adam alone); it runs inside a process group.
"""

from __future__ import annotations

import gc

import torch
import torch.distributed as dist
from torch import nn

from .mini_ddp import assign_buckets, ddp_caps, engine_callback
from .zero import Flat, all_gather_flat, reduce_scatter_flat


class Bucket:
    """Trained parameters of one group that share a flat buffer; this rank owns `shard`, chunk `rank` of it."""

    def __init__(self, params: list[nn.Parameter], group: int, rank: int, world_size: int):
        self.params, self.group, self.world_size = params, group, world_size
        self.flat = Flat([p.detach() for p in params], world_size)
        for p, view in zip(params, self.flat.views, strict=True):
            p.data = view  # the model reads its weights from the flat buffer, which the all-gather refreshes
        self.shard = nn.Parameter(self.flat.chunk(rank))  # stepping the shard updates this rank's chunk in place
        self.position = {p: i for i, p in enumerate(params)}
        self.full_grad, self.ready, self.work, self.mine = None, set(), None, None

    def collect(self, p: nn.Parameter) -> None:
        """Stage 2: move p's gradient into the bucket's full gradient and free it."""
        if self.full_grad is None:
            self.full_grad = torch.zeros_like(self.flat.buffer)
        self.flat.views_of(self.full_grad)[self.position[p]].add_(p.grad)
        p.grad = None  # the full gradient lives on only inside the bucket, until its reduce-scatter
        self.ready.add(p)

    def full(self) -> bool:
        """Whether every gradient of the bucket has arrived in this backward."""
        return len(self.ready) == len(self.params)

    def reduce(self, async_op: bool = False) -> None:
        """Reduce-scatter the full gradient (stage 1: from .grad) into this rank's chunk, summed over ranks."""
        if self.full_grad is None:  # stage 1, or a stage-2 bucket no gradient reached: zeros where .grad is None
            self.full_grad = torch.zeros_like(self.flat.buffer)
            for p, view in zip(self.params, self.flat.views_of(self.full_grad), strict=True):
                if p.grad is not None:
                    view.copy_(p.grad)
        self.mine = torch.empty_like(self.shard)
        self.work = reduce_scatter_flat(self.mine, self.full_grad, async_op=async_op)

    def finish(self) -> None:
        """Wait for the reduce-scatter, add the mean of this chunk to shard.grad, and free the full gradient."""
        if self.work is not None:
            self.work.wait()
        mean = self.mine.div_(self.world_size)  # as DDP's all-reduce divides by world_size
        self.shard.grad = mean if self.shard.grad is None else self.shard.grad.add_(mean)
        self.full_grad, self.ready, self.work, self.mine = None, set(), None, None


class ZeroOptimizer(torch.optim.Optimizer):
    """ZeRO-1 or -2 around any torch.optim optimizer, with torch's Optimizer interface (see the module docstring)."""

    def __init__(self, params, optimizer_class=torch.optim.Adam, stage: int = 1, bucket_cap_mb: float | None = None,
                 **defaults):
        if stage not in (1, 2):
            raise ValueError(f"ZeroOptimizer implements stages 1 and 2, not {stage!r} (stage 3 shards the model).")
        self.optimizer_class, self.stage, self.caps = optimizer_class, stage, ddp_caps(bucket_cap_mb)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.buckets, self.bucket_of, self.inner, self.pending, self.next = [], {}, None, False, 0
        self._consolidated = None
        super().__init__(params, defaults)  # torch builds the groups: it calls add_param_group for each
        refuse_ddp(self.bucket_of)

    def add_param_group(self, param_group: dict) -> None:
        """torch's add_param_group, and the group's trained parameters laid out in buckets stepped by the inner optimizer."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        trained = [p for p in reversed(group["params"]) if p.requires_grad]  # last layer first
        for p in trained:
            dist.broadcast(p.detach(), 0)  # every rank starts from rank 0's weights, as DDP's constructor does
        sizes = [p.numel() * p.element_size() for p in trained]
        new = [Bucket([trained[i] for i in g], len(self.param_groups) - 1, self.rank, self.world_size)
               for g in assign_buckets(sizes, self.caps)] if trained else []
        self.buckets += new
        for bucket in new:
            self.bucket_of.update({p: bucket for p in bucket.params})
            for p in bucket.params if self.stage == 2 else []:
                p.register_post_accumulate_grad_hook(self.collect)
        inner = {**{k: v for k, v in group.items() if k != "params"}, "params": [b.shard for b in new]}
        if self.inner is None:
            self.inner = self.optimizer_class([inner], **self.defaults)
        else:
            self.inner.add_param_group(inner)
        for key, value in self.inner.param_groups[-1].items():  # the inner class's defaults (betas, eps, ...)
            group.setdefault(key, value)

    def collect(self, p: nn.Parameter) -> None:
        """Stage 2's hook: p's gradient is final; reduce-scatter its bucket once the bucket is complete."""
        if not self.pending:  # the first gradient of this backward: finish every bucket when the backward ends
            engine_callback(self.finish_backward)
            self.pending = True
        self.bucket_of[p].collect(p)
        while self.next < len(self.buckets) and self.buckets[self.next].full():  # in order: every rank alike
            self.buckets[self.next].reduce(async_op=True)
            self.next += 1

    def finish_backward(self) -> None:
        """The end of a stage-2 backward: reduce what is left, in bucket order on every rank, and wait for all."""
        try:
            for bucket in self.buckets[self.next:]:  # parameters this backward did not reach on this rank: zeros
                bucket.reduce(async_op=True)
            for bucket in self.buckets:
                bucket.finish()
        finally:
            self.pending, self.next = False, 0

    def reduce_gradients(self) -> None:
        """Stage 1: reduce-scatter every bucket's gradients now (step does it if clip_grad_norm_ did not)."""
        if self.stage == 1 and any(b.shard.grad is None for b in self.buckets):
            for bucket in self.buckets:
                bucket.reduce()
                bucket.finish()

    @torch.no_grad()
    def step(self, closure=None):
        """Step this rank's chunks with the inner optimizer, then all-gather the new parameters into every bucket."""
        if closure is not None:
            raise ValueError("ZeroOptimizer.step takes no closure: every rank must run the same collectives.")
        self.reduce_gradients()
        for group, inner in zip(self.param_groups, self.inner.param_groups, strict=True):
            inner.update({k: v for k, v in group.items() if k != "params"})  # a scheduler changes the outer groups
        self.inner.step()
        for bucket in self.buckets:
            all_gather_flat(bucket.flat.buffer, bucket.shard.detach().clone())
        self.zero_grad_shards()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the full gradients and this rank's reduced chunks."""
        for bucket in self.buckets:
            for p in bucket.params:
                p.grad = None
        self.zero_grad_shards()

    def zero_grad_shards(self) -> None:
        """Forget the reduced chunks (after a step: the next backward starts afresh)."""
        for bucket in self.buckets:
            bucket.shard.grad = None

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Scale the reduced gradients to a global 2-norm of at most max_norm; the norm over every rank's chunks."""
        self.reduce_gradients()
        squares = torch.zeros((), dtype=torch.float32)
        for bucket in self.buckets:
            if bucket.shard.grad is not None:
                squares += bucket.shard.grad.float().pow(2).sum()
        dist.all_reduce(squares)  # the chunks partition the gradient (the padding adds zeros)
        norm = squares.sqrt()
        scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)  # as torch.nn.utils.clip_grad_norm_
        for bucket in self.buckets:
            if bucket.shard.grad is not None:
                bucket.shard.grad.mul_(scale)
        return norm

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gather the whole optimizer state on rank `to` (a collective: every rank calls it), for state_dict()."""
        index = {p: i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}
        state = {}
        for bucket in self.buckets:
            for key, value in self.inner.state.get(bucket.shard, {}).items():
                for p, part in zip(bucket.params, self.gathered(bucket, value), strict=True):
                    state.setdefault(index[p], {})[key] = part
        groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [index[p] for p in g["params"]]}
                  for g in self.param_groups]
        self._consolidated = {"state": state, "param_groups": groups} if self.rank == to else None

    def gathered(self, bucket: Bucket, value) -> list:
        """One state entry for each of the bucket's parameters: a chunked tensor all-gathered and cut, else copied."""
        if not (isinstance(value, torch.Tensor) and value.shape == bucket.shard.shape):
            return [value.clone() if isinstance(value, torch.Tensor) else value for _ in bucket.params]
        full = torch.empty_like(bucket.flat.buffer, dtype=value.dtype)
        all_gather_flat(full, value.detach().contiguous())
        return [view.clone() for view in bucket.flat.views_of(full)]

    def state_dict(self) -> dict:
        """The consolidated state, in the plain optimizer's format (after consolidate_state_dict, on that rank)."""
        if self._consolidated is None:
            raise RuntimeError("call consolidate_state_dict(to=rank) on every rank first, then state_dict() on that "
                               "rank: the state is sharded over the ranks.")
        return self._consolidated

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a plain optimizer's (or a consolidated) state dict on every rank: each keeps its own chunks."""
        params = [p for g in self.param_groups for p in g["params"]]
        for group, saved in zip(self.param_groups, state_dict["param_groups"], strict=True):
            group.update({k: v for k, v in saved.items() if k != "params"})
        full = {params[int(i)]: s for i, s in state_dict["state"].items()}
        for bucket in self.buckets:
            entries = [full.get(p, {}) for p in bucket.params]
            keys = {k for e in entries for k in e}
            self.inner.state[bucket.shard] = {k: self.chunk_of(bucket, [e.get(k) for e in entries]) for k in keys}

    def chunk_of(self, bucket: Bucket, values: list):
        """This rank's chunk of a per-parameter state entry laid out like the bucket (a scalar: the first one)."""
        shaped = [isinstance(v, torch.Tensor) and v.shape == p.shape and p.dim() > 0
                  for v, p in zip(values, bucket.params, strict=True)]
        if any(shaped):  # a parameter without this entry (never stepped) gets zeros
            full = [v.to(p.dtype) if s else torch.zeros_like(p) for v, s, p in zip(values, shaped, bucket.params, strict=True)]
            return Flat(full, self.world_size).chunk(self.rank).clone()
        first = next((v for v in values if v is not None), None)
        return first.clone() if isinstance(first, torch.Tensor) else first


def refuse_ddp(params) -> None:
    """One sentence before anything runs when these parameters belong to a DistributedDataParallel model."""
    from torch.nn.parallel import DistributedDataParallel

    ours = {id(p) for p in params}
    for obj in gc.get_objects():  # the models alive in this process; the usual order wraps first, then builds this
        if isinstance(obj, DistributedDataParallel) and any(id(p) in ours for p in obj.parameters()):
            raise ValueError("ZeroOptimizer reduces the gradients itself: build it over the plain model's parameters, "
                             "not a DistributedDataParallel model's, whose all-reduce would send every gradient twice.")
