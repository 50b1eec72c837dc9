"""DistributedDataParallel built from scratch, one step at a time, each checked against torch's (a later notebook teaches it).

1. `broadcast_state`: every rank starts from rank 0's parameters and buffers.
2. `HookAllReduce`: a hook per parameter all-reduces its gradient the moment `.grad` is final.
3. `AsyncAllReduce`: the same all-reduce started asynchronously, waited for once the backward is done.
4. `assign_buckets` + `MiniDDP`: gradients grouped into flat buckets of about `bucket_cap_mb`, one all-reduce
   per bucket, first in the reverse of registration order, then rebuilt once in the order the backward produced them.
5. `MiniDDP(find_unused_parameters=True)`: `unreached` walks the forward's graph, and the parameters it misses
   (or the backward never reached) are marked ready contributing zeros, so every bucket is still all-reduced;
   a parameter no rank used keeps its `.grad`, as with DDP.
Steps 2 and 3 need every rank to produce every gradient in each backward (as DDP without find_unused_parameters):
a parameter used on some ranks only would leave its hook silent there, and the ranks' all-reduces would pair
different tensors. Step 5 lifts that. Supports: any module whose trained parameters share one device and dtype,
`no_sync()` for accumulation, buckets of any cap, activation checkpointing (the backward's end is queued from the
outputs, so a reentrant checkpoint's inner backward does not end it early). Refuses: a module with no trainable parameter (as torch's DDP), mixed dtypes or devices, a parameter
marked ready twice in one backward, a bucket left unreduced (an unused parameter without find_unused_parameters).
Not built: broadcast_buffers each step, static_graph, gradient_as_bucket_view, communication hooks.
All run inside a process group (a script under torchrun, or a test's rank pool).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_leaves


def broadcast_state(model: nn.Module, src: int = 0) -> None:
    """Overwrite every rank's parameters and buffers with rank `src`'s (what DDP's constructor does)."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor, src)


def engine_callback(fn) -> None:
    """Run fn once the current backward has finished (torch's autograd engine queue; DDP's reducer uses the same)."""
    torch.autograd.Variable._execution_engine.queue_callback(fn)


def let_go(p: nn.Parameter) -> None:
    """Remove the gradient hook an earlier wrapper left on p: the newest wrapper of a module is the one that reduces."""
    if getattr(p, "_dp_hook", None) is not None:
        p._dp_hook.remove()
        p._dp_hook = None


class HookAllReduce(nn.Module):
    """Step 2: a post-accumulate-grad hook per parameter averages its gradient across ranks, synchronously."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module, self.sync, self.allreduces = module, True, 0
        broadcast_state(module)
        for p in module.parameters():
            if p.requires_grad:
                let_go(p)  # of a wrapper made earlier over this module: its hook would all-reduce a second time
                # fires once .grad holds this backward's total; it receives the parameter, and must return None
                p._dp_hook = p.register_post_accumulate_grad_hook(self.reduce)

    def reduce(self, param: nn.Parameter) -> None:
        """Average param.grad over all ranks (skipped inside no_sync)."""
        if self.sync:
            param.grad.div_(dist.get_world_size())
            dist.all_reduce(param.grad)
            self.allreduces += 1

    def forward(self, *args, **kwargs):
        """The wrapped module's forward."""
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Gradients accumulate locally inside; the next backward outside reduces the whole sum."""
        self.sync = False
        try:
            yield
        finally:
            self.sync = True


class AsyncAllReduce(HookAllReduce):
    """Step 3: each hook starts its all-reduce and returns at once; the backward's end waits for all of them."""

    def __init__(self, module: nn.Module):
        super().__init__(module)
        self.pending, self.waiting = [], False

    def forward(self, *args, **kwargs):
        """The wrapped module's forward, its outputs watched for the start of their backward."""
        return self.watch(self.module(*args, **kwargs))

    def watch(self, out):
        """Hook the outputs: their gradients arrive first, in the backward that `loss.backward()` started."""
        if self.sync and torch.is_grad_enabled():
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(lambda grad: self.backward_starts())
        return out

    def backward_starts(self) -> None:
        """Queue the wait at the end of this backward, once; the output hooks call it first."""
        # not from a parameter's hook: in a reentrant checkpoint it would run when that inner backward ends
        if not self.waiting:
            engine_callback(self.finish_backward)
            self.waiting = True

    def reduce(self, param: nn.Parameter) -> None:
        """Param's gradient is final: launch its all-reduce (and queue the wait, if no output hook has)."""
        if not self.sync:
            return
        self.backward_starts()  # a loss that is not built from the outputs: queued here, by the first gradient
        self.launch(param)

    def launch(self, param: nn.Parameter) -> None:
        """Start the all-reduce of param.grad / world_size without waiting for it."""
        param.grad.div_(dist.get_world_size())
        self.pending.append(dist.all_reduce(param.grad, async_op=True))
        self.allreduces += 1

    def finish_backward(self) -> None:
        """The engine callback: wait for this backward's all-reduces; the next backward queues it again."""
        try:
            self.wait()
        finally:  # also after an error, so that the next backward starts afresh
            self.waiting, self.pending = False, []

    def wait(self) -> None:
        """Block until every all-reduce of this backward is done (before optimizer.step can run)."""
        for work in self.pending:
            work.wait()
        self.pending = []


def assign_buckets(sizes: list[int], caps: int | list[int]) -> list[list[int]]:
    """Group byte sizes greedily, in order: a bucket closes once it holds >= its cap (caps[k] for bucket k, then caps[-1])."""
    caps = [caps] if isinstance(caps, int) else list(caps)
    buckets, current, filled = [], [], 0
    for i, size in enumerate(sizes):
        current.append(i)
        filled += size
        if filled >= caps[min(len(buckets), len(caps) - 1)]:
            buckets.append(current)
            current, filled = [], 0
    return buckets + ([current] if current else [])


class Bucket:
    """Parameters whose gradients travel together: one flat buffer, one all-reduce once all of them are ready."""

    def __init__(self, params: list[nn.Parameter]):
        self.params, self.ready, self.work = params, set(), None
        self.buffer = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)

    def slices(self):
        """(parameter, its view of the buffer) pairs."""
        offset = 0
        for p in self.params:
            yield p, self.buffer[offset:offset + p.numel()].view_as(p)
            offset += p.numel()

    def full(self) -> bool:
        """Whether every gradient of the bucket is ready."""
        return len(self.ready) == len(self.params)

    def launch(self, world_size: int) -> None:
        """Copy the gradients in (divided by world_size; zeros where this rank has none) and start the all-reduce."""
        for p, view in self.slices():
            if p.grad is None:  # a parameter this rank's forward or backward did not reach
                view.zero_()
            else:
                view.copy_(p.grad).div_(world_size)
        self.work = dist.all_reduce(self.buffer, async_op=True)

    def finish(self, unused_everywhere=frozenset()) -> None:
        """Wait for the all-reduce and write the averaged gradients into .grad (untouched where no rank used the parameter)."""
        if self.work is None:  # DDP's find_unused_parameters=True exists for this case
            missing = len(self.params) - len(self.ready)
            raise RuntimeError(f"a bucket of {len(self.params)} parameter(s) was never all-reduced: {missing} got no "
                               "gradient in this backward (an unused parameter: see find_unused_parameters).")
        self.work.wait()
        for p, view in self.slices():
            if p in unused_everywhere:
                continue
            if p.grad is None:
                p.grad = view.clone()
            else:
                p.grad.copy_(view)


def ddp_caps(bucket_cap_mb: float | None) -> list[int]:
    """DDP's bucket caps in bytes: under the default (None: 25 MiB) a first bucket of only 1 MiB, else the cap throughout."""
    if bucket_cap_mb is None:
        return [dist._DEFAULT_FIRST_BUCKET_BYTES, 25 * 2**20]
    if not isinstance(bucket_cap_mb, (int, float)) or bucket_cap_mb <= 0:
        raise ValueError(f"bucket_cap_mb must be a positive number of MiB or None (DDP's default), got {bucket_cap_mb!r}.")
    return [int(bucket_cap_mb * 2**20)]


class MiniDDP(AsyncAllReduce):
    """Step 4: the hooks fill buckets of ~bucket_cap_mb; full buckets are all-reduced in order, rebuilt once as DDP's."""

    # Where it differs from DDP: DDP's first iteration puts every parameter in one bucket (ours start from the reverse
    # of registration order); ours copies gradients into its buckets (no gradient_as_bucket_view), needs one dtype
    # and device, has no communication hooks, and does not broadcast rank 0's buffers before each forward (DDP's
    # forward_sync_buffers: BatchNorm's running statistics stay each rank's own here). As with DDP, a parameter frozen
    # when the module is wrapped stays out: after unfreezing it, wrap the module again (the new wrapper takes over).

    def __init__(self, module: nn.Module, bucket_cap_mb: float | None = None, find_unused_parameters: bool = False):
        super().__init__(module)
        self.params = [p for p in module.parameters() if p.requires_grad]  # a tied weight once; frozen ones not at all
        if len({(p.dtype, p.device) for p in self.params}) > 1:  # DDP keeps a bucket per dtype and device; ours does not
            raise ValueError("MiniDDP needs every trained parameter on one device with one dtype.")
        self.caps, self.find_unused, self.unused, self.order = ddp_caps(bucket_cap_mb), find_unused_parameters, [], []
        self.index, self.seen = {p: i for i, p in enumerate(self.params)}, set()
        self.names = {p: name for name, p in module.named_parameters()}  # for messages
        groups = assign_buckets([p.numel() * p.element_size() for p in self.params], self.caps)
        self.make_buckets([[self.params[i] for i in group] for group in reversed(groups)])  # DDP's first guess
        self.rebuilt = find_unused_parameters  # find_unused: never rebuilt (DDP, without static_graph)

    def make_buckets(self, groups: list[list[nn.Parameter]]) -> None:
        """Buckets for these groups of parameters, all-reduced in this order."""
        if not groups:  # torch's DDP refuses the same module
            raise ValueError("MiniDDP has nothing to average: no parameter of this module requires a gradient.")
        self.buckets, self.next = [Bucket(group) for group in groups], 0
        self.bucket_of = {p: b for b in self.buckets for p in b.params}

    def rebuild(self) -> None:
        """Regroup along the order observed in the last backward, rank 0's on every rank (DDP's one rebuild)."""
        order = torch.tensor([self.index[p] for p in self.order], device=self.params[0].device)  # nccl: on the GPU
        dist.broadcast(order, 0)  # ranks may see different orders; all must bucket alike
        params = [self.params[i] for i in order.tolist()]
        groups = assign_buckets([p.numel() * p.element_size() for p in params], self.caps)
        self.make_buckets([[params[i] for i in group] for group in groups])
        self.rebuilt, self.order, self.seen = True, [], set()

    def launch(self, param: nn.Parameter) -> None:
        """Mark param ready; all-reduce every full bucket whose turn has come (all ranks must launch in one order)."""
        bucket = self.bucket_of[param]
        if param in bucket.ready:  # DDP: "Expected to mark a variable ready only once"
            raise RuntimeError(f"{self.names[param]} was marked ready twice in one backward: it got a gradient although "
                               "the last forward did not use it (two forwards before one backward?).")
        bucket.ready.add(param)
        if not self.rebuilt and param not in self.seen:  # the first backward's order, each parameter once
            self.order.append(param)
            self.seen.add(param)
        while self.next < len(self.buckets) and self.buckets[self.next].full():
            bucket = self.buckets[self.next]
            bucket.launch(dist.get_world_size())
            self.allreduces, self.next = self.allreduces + 1, self.next + 1

    def wait(self) -> None:
        """Finish this backward's all-reduces in launch order (a no-op when none is pending); then every bucket is empty."""
        if not any(b.ready for b in self.buckets):
            return  # no backward since the last wait: waiting again changes nothing
        try:
            skipped = self.unused_everywhere() if self.find_unused else frozenset()
            for bucket in self.buckets:
                bucket.finish(skipped)
        finally:
            self.empty_buckets()

    def empty_buckets(self) -> None:
        """Every bucket back to empty, none launched: how each backward starts."""
        for bucket in self.buckets:
            bucket.ready, bucket.work = set(), None
        self.next = 0

    def finish_backward(self) -> None:
        """The engine callback; with find_unused_parameters, what this backward never reached counts as unused first."""
        if self.find_unused:  # e.g. behind a forward output that the loss ignored
            for p in [p for p in self.params if p not in self.bucket_of[p].ready]:
                self.launch(p)
        super().finish_backward()

    def unused_everywhere(self) -> frozenset:
        """The parameters no rank has a gradient for (one all-reduce of a flag per parameter, as DDP's used map)."""
        flags = torch.tensor([float(p.grad is not None) for p in self.params], device=self.params[0].device)
        dist.all_reduce(flags)
        return frozenset(p for p, f in zip(self.params, flags.tolist(), strict=True) if f == 0)

    def forward(self, *args, **kwargs):
        """The module's forward: rebuild first if a backward has shown the order; note what the graph does not reach."""
        if self.waiting:  # the last backward raised before its end: its callback never ran, so start afresh
            self.waiting, self.pending = False, []
            self.empty_buckets()
        if torch.is_grad_enabled() and self.sync and not self.rebuilt and self.order:
            self.rebuild()
        out = self.module(*args, **kwargs)
        if self.find_unused and torch.is_grad_enabled():
            self.unused = unreached(out, self.params)
        return self.watch(out)

    def reduce(self, param: nn.Parameter) -> None:
        """As before; on the backward's first hook, also mark the parameters the forward did not reach (as DDP)."""
        super().reduce(param)
        if self.sync and self.unused:
            unused, self.unused = self.unused, []  # this forward's set is used up: the next backward needs a new one
            for p in unused:
                self.launch(p)


def unreached(outputs, params: list[nn.Parameter]) -> list[nn.Parameter]:
    """The parameters that the autograd graph behind outputs never reaches (DDP's find_unused_parameters traversal)."""
    outs = [t for t in tree_leaves(outputs) if isinstance(t, torch.Tensor)]  # any nesting of lists, tuples, dicts
    stack, seen, reached = [t.grad_fn for t in outs if t.grad_fn is not None], set(), set()
    while stack:
        fn = stack.pop()
        if fn not in seen:
            seen.add(fn)
            if hasattr(fn, "variable"):  # an AccumulateGrad node: the gradient's way into a leaf's .grad
                reached.add(id(fn.variable))
            stack += [nxt for nxt, _ in fn.next_functions if nxt is not None]
    return [p for p in params if id(p) not in reached]
