"""ZeRO stages 1 and 2 from scratch, in two steps of one line of code (notebook 08; stage 3 extends it: zero3.py).

1. `Flat`: tensors laid out in one buffer padded to a multiple of world_size; rank r owns chunk r, and `pieces(r)`
   says which part of which tensor that chunk holds. `reduce_chunk` and `gather_chunks` are the two collectives of
   every stage: a reduce-scatter hands each rank the sum of its chunk, an all-gather brings every chunk back.
2. `ZeroAdam(model, stage=1|2)`: the first version, the ZeRO paper's picture. Every rank keeps full parameters (views
   of one Flat); Adam's state exists only for its own chunk, stepped as one tensor; `step` reduce-scatters the
   gradients, steps the chunk and all-gathers the parameters. Stage 2 also drops the full gradients once reduced.
   Adam alone, one dtype and device; a parameter unused on every rank still takes Adam's step on its zeros.
3. `ZeroOptimizer(params, optimizer_class, stage=1|2, **defaults)`: the same two collectives on the same `Flat`s,
   grown into torch's optimizer interface, as `torch.distributed.optim.ZeroRedundancyOptimizer` has it:
   - the trained parameters of each group go into flat buckets of about `bucket_cap_mb` (last layer first, the order
     the backward produces gradients; a bucket per dtype and device); the part of a parameter in this rank's chunk is
     a tensor of its own for the inner optimizer (`Bucket.pieces`), so the optimizer keeps each parameter's state
     and skips a parameter no rank had a gradient for, as one process would. It must update each element on its own
     (`ELEMENTWISE`: SGD, Adam, AdamW, ...); Adafactor, Muon, LBFGS and SparseAdam are refused at once, and so is a
     sparse gradient; keys the inner optimizer writes into its groups are copied back after each step;
   - stage 1 keeps the full local gradients and reduce-scatters them at `step`; stage 2 reduce-scatters each bucket
     **during the backward**, as soon as its last gradient is ready, frees each parameter's `.grad` once it is in its
     bucket, and each bucket's full gradient once the next bucket is launched; under `optimizer.no_sync()` a backward
     only accumulates into `.grad` (accumulation sends once per step, as DDP's);
   - `state_dict`/`load_state_dict` in the plain optimizer's format, consolidated on one rank.
   It reduces the gradients itself, so it is used on the plain model and refuses a DDP-wrapped one. Limits: clip with
   `optimizer.clip_grad_norm_` (torch.nn.utils' sees no stage-2 gradients and stage 1's unreduced ones); `GradScaler`
   is refused at its first step; a parameter frozen when the optimizer is built stays out of it (build the optimizer
   again after unfreezing: the new one takes over the old one's hooks); the buckets keep the reverse registration
   order, so a model whose gradients become ready in another order still trains the same but launches its stage-2
   buckets later (MiniDDP, like DDP, rebuilds its buckets in the observed order).
All run inside a process group (a script under torchrun, or a test's rank pool); `group` restricts the collectives to
a subgroup (hybrid.py shards within one).
"""

from __future__ import annotations

import gc
import itertools
import warnings

import torch
import torch.distributed as dist
from torch import nn

from dp_helpers.scratch.ddp.mini_ddp import (
    HookAllReduce,
    assign_buckets,
    broadcast_state,
    ddp_caps,
    engine_callback,
    let_go,
)


def padded(numel: int, world_size: int) -> int:
    """numel rounded up to a multiple of world_size: the flat buffer that splits into equal chunks."""
    return -(-numel // world_size) * world_size


class Flat:
    """Tensors copied into one buffer padded to a multiple of world_size; `views` alias it, `chunk(r)` is rank r's part."""

    def __init__(self, tensors: list[torch.Tensor], world_size: int):
        if len({(t.dtype, t.device) for t in tensors}) > 1:
            raise ValueError("a flat buffer holds tensors of one dtype on one device.")
        self.shapes = [t.shape for t in tensors]
        self.offsets = list(itertools.accumulate((t.numel() for t in tensors), initial=0))  # where each one starts
        self.size = padded(sum(t.numel() for t in tensors), world_size) // world_size
        self.buffer = torch.zeros(self.size * world_size, dtype=tensors[0].dtype, device=tensors[0].device)
        self.views = self.views_of(self.buffer)
        for view, t in zip(self.views, tensors, strict=True):
            view.copy_(t)

    def views_of(self, buffer: torch.Tensor) -> list[torch.Tensor]:
        """Views of a buffer laid out like this one, one per original tensor, in order."""
        return [self.view_of(buffer, i) for i in range(len(self.shapes))]

    def view_of(self, buffer: torch.Tensor, i: int) -> torch.Tensor:
        """The view of a buffer laid out like this one that holds tensor i."""
        return buffer[self.offsets[i]:self.offsets[i + 1]].view(self.shapes[i])

    def chunk(self, rank: int) -> torch.Tensor:
        """Rank's equal share of the buffer (a view)."""
        return self.buffer[rank * self.size:(rank + 1) * self.size]

    def pieces(self, rank: int) -> list[tuple[int, slice, slice]]:
        """(index, slice of rank's chunk, slice of the flattened tensor) for each tensor with values in that chunk."""
        out, start, stop = [], rank * self.size, (rank + 1) * self.size
        for i, (offset, end) in enumerate(itertools.pairwise(self.offsets)):
            lo, hi = max(offset, start), min(end, stop)
            if lo < hi:
                out.append((i, slice(lo - start, hi - start), slice(lo - offset, hi - offset)))
        return out


def all_gather_flat(out: torch.Tensor, mine: torch.Tensor, async_op: bool = False, group=None):
    """out = every rank's `mine`, concatenated in rank order (with async_op, returns the work to wait for)."""
    if hasattr(dist, "all_gather_single"):
        return dist.all_gather_single(out, mine, async_op=async_op, group=group)
    # older torch releases have only this name (torch 2.13 deprecates it)
    return dist.all_gather_into_tensor(out, mine, async_op=async_op, group=group)


def reduce_scatter_flat(mine: torch.Tensor, full: torch.Tensor, async_op: bool = False, group=None):
    """mine = the sum over ranks of this rank's chunk of `full` (with async_op, returns the work to wait for)."""
    if hasattr(dist, "reduce_scatter_single"):
        return dist.reduce_scatter_single(mine, full, async_op=async_op, group=group)
    # older torch releases have only this name (torch 2.13 deprecates it)
    return dist.reduce_scatter_tensor(mine, full, async_op=async_op, group=group)


def flat_grads(flat: Flat, params, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The parameters' gradients laid out like flat (zeros for a parameter without one, and in the padding)."""
    full = torch.zeros(flat.buffer.shape, dtype=dtype or flat.buffer.dtype, device=flat.buffer.device)
    for p, view in zip(params, flat.views_of(full), strict=True):
        if p.grad is not None:
            view.add_(dense(p.grad))
    return full


def dense(grad: torch.Tensor) -> torch.Tensor:
    """A gradient that can be laid out flat; a sparse one is refused in one sentence."""
    if grad.is_sparse:
        raise ValueError("ZeRO needs dense gradients: build nn.Embedding without sparse=True.")
    return grad


def reduce_chunk(flat: Flat, full: torch.Tensor, async_op: bool = False, group=None):
    """Reduce-scatter a buffer laid out like flat: (this rank's chunk of the sum over ranks, the work to wait for)."""
    mine = torch.empty(flat.size, dtype=full.dtype, device=full.device)
    return mine, reduce_scatter_flat(mine, full, async_op=async_op, group=group)


def gather_chunks(flat: Flat, mine: torch.Tensor, async_op: bool = False, group=None):
    """All-gather every rank's chunk into flat's buffer, which the parameters read (`mine` must not be a view of it)."""
    return all_gather_flat(flat.buffer, mine.to(flat.buffer.dtype), async_op=async_op, group=group)


class ZeroAdam:
    """ZeRO stage 1 or 2 from scratch: full parameters everywhere, Adam's state and the update for 1/W of them per rank."""

    def __init__(self, model: nn.Module, stage: int = 1, group=None, **adam):
        if stage not in (1, 2):
            raise ValueError(f"ZeroAdam implements stages 1 and 2, not {stage!r}.")
        broadcast_state(model)  # every rank starts from rank 0's weights, as DDP does
        self.model, self.stage, self.group = model, stage, group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.flat = Flat([p.detach() for p in self.params], self.world_size)
        for p, view in zip(self.params, self.flat.views, strict=True):
            p.data = view  # the model now reads its weights from the flat buffer
        self.shard = nn.Parameter(self.flat.chunk(self.rank))  # shares the buffer: stepping it updates the model
        self.adam = torch.optim.Adam([self.shard], **adam)
        self.sent = {"reduce_scatter": 0, "all_gather": 0}  # bytes handed to each collective by this rank

    def step(self) -> None:
        """Reduce-scatter the gradients, step this rank's chunk, all-gather the parameters."""
        full = flat_grads(self.flat, self.params)  # an unused parameter contributes zeros
        mine, _ = reduce_chunk(self.flat, full, group=self.group)
        self.shard.grad = self.average(mine)  # this chunk's mean gradient, as DDP's all-reduce gives
        if self.stage == 2:
            for p in self.params:
                p.grad = None  # stage 2 keeps only its own chunk of the gradient
        self.adam.step()
        gather_chunks(self.flat, self.shard.detach().clone(), group=self.group)
        self.count(full)
        if self.stage == 1:
            self.shard.grad = None  # stage 1 keeps the full gradients instead

    def average(self, summed: torch.Tensor) -> torch.Tensor:
        """The sum over the ranks, divided by their number (hybrid.py adds the replicas first)."""
        return summed.div_(self.world_size)

    def count(self, full: torch.Tensor) -> None:
        """Add one step's bytes to `sent`: the full gradient handed to the reduce-scatter, the buffer gathered."""
        self.sent["reduce_scatter"] += full.numel() * full.element_size()
        self.sent["all_gather"] += self.flat.buffer.numel() * self.flat.buffer.element_size()

    def zero_grad(self) -> None:
        """Forget the last step's gradients."""
        for p in self.params:
            p.grad = None

    def full_weights(self) -> list[torch.Tensor]:
        """Every parameter in full: each rank already holds them (the all-gather after each step)."""
        return [p.detach() for p in self.params]


# torch's optimizers whose update of an element reads that element's gradient and state alone (and the step count):
# they may step 1-D pieces of a parameter. Adafactor (row and column statistics, the parameter's RMS), Muon (whole
# matrices), LBFGS (a closure, global directions) and SparseAdam (sparse gradients) may not. A subclass counts as its
# base; add your own class here if its update is elementwise too.
ELEMENTWISE = {torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adamax, torch.optim.NAdam,
               torch.optim.RAdam, torch.optim.Adagrad, torch.optim.Adadelta, torch.optim.RMSprop, torch.optim.Rprop,
               torch.optim.ASGD}


def refuse_not_elementwise(optimizer_class: type, who: str) -> None:
    """One sentence when an optimizer class is not known to update each element on its own."""
    if not any(issubclass(optimizer_class, known) for known in ELEMENTWISE):
        raise ValueError(f"{who} shards each parameter into 1-D pieces, so it steps only optimizers whose update is "
                         f"elementwise (SGD, Adam, AdamW, ...: zero.ELEMENTWISE), and "
                         f"{optimizer_class.__name__} is not among them: use torch's ZeroRedundancyOptimizer, which "
                         "keeps whole tensors, or add the class to ELEMENTWISE if its update is elementwise.")


def divide_factors(world_size: int, dtype: torch.dtype) -> tuple[float, float]:
    """(pre, post): divide by pre before the sum over ranks and by post after, pre * post = world_size (FSDP2's rule)."""
    if dtype in (torch.float32, torch.bfloat16):  # no overflow to fear: all of it after
        return 1, world_size
    pre = 1  # fp16 and the rest: a power of two near sqrt(world_size) before, the remainder after
    while world_size % pre == 0 and world_size / pre > pre:
        pre *= 2
    return pre, world_size / pre


class Bucket:
    """Parameters that travel together in one Flat, and this rank's pieces of them: one optimizer tensor each."""

    def __init__(self, params: list[nn.Parameter], rank: int, world_size: int, own_shard: bool = False):
        self.params, self.world_size, self.own_shard = params, world_size, own_shard
        self.flat = Flat([p.detach() for p in params], world_size)
        self.position = {p: i for i, p in enumerate(params)}
        # the chunk the pieces view: the flat buffer's own (ZeroOptimizer: the model reads it), or a copy with its
        # own storage that outlives the buffer (Zero3Module frees the buffer between uses)
        self.shard = self.flat.chunk(rank).clone() if own_shard else self.flat.chunk(rank)
        # p -> (its piece: a tensor for the optimizer, viewing the chunk; the piece's slice of the chunk; the same
        # values' slice of p flattened)
        self.pieces = {params[i]: (nn.Parameter(self.shard[where]), where, span)
                       for i, where, span in self.flat.pieces(rank)}
        self.grad_dtype = self.flat.buffer.dtype  # what the reduce-scatter sums in
        self.full_grad, self.ready, self.work, self.mine, self.had_grad = None, set(), None, None, set()
        self.sent = {"reduce_scatter": 0, "all_gather": 0}  # bytes this rank handed to each collective

    def collect(self, p: nn.Parameter) -> None:
        """Add p's gradient (final for this backward) to the bucket's full gradient and free it."""
        if self.full_grad is None:
            self.full_grad = torch.zeros(self.flat.buffer.shape, dtype=self.grad_dtype, device=self.flat.buffer.device)
        self.flat.view_of(self.full_grad, self.position[p]).add_(dense(p.grad))  # one view: called per parameter
        p.grad = None  # the full gradient lives on only inside the bucket, until its reduce-scatter
        self.ready.add(p)
        self.had_grad.add(p)

    def reset(self) -> None:
        """Forget a backward that raised before its end: its partial full gradient, and a reduce-scatter under way."""
        if self.work is not None:
            self.work.wait()  # every rank started it: let it land before dropping it
        self.full_grad, self.ready, self.work, self.mine = None, set(), None, None

    def full(self) -> bool:
        """Whether every gradient of the bucket has arrived in this backward."""
        return len(self.ready) == len(self.params)

    def reduce(self, async_op: bool = False, group=None) -> None:
        """Reduce-scatter the full gradient (stage 1: from .grad) so this rank gets its chunk, summed over ranks."""
        if self.full_grad is None:  # stage 1, or a stage-2 bucket no gradient reached: zeros where .grad is None
            self.had_grad |= {p for p in self.params if p.grad is not None}
            self.full_grad = flat_grads(self.flat, self.params, self.grad_dtype)
        pre, _ = divide_factors(self.world_size, self.grad_dtype)
        if pre != 1:  # fp16: part of the division before the sum, so that the sum cannot overflow (FSDP2's split)
            self.full_grad.div_(pre)
        self.mine, self.work = reduce_chunk(self.flat, self.full_grad, async_op, group)
        self.sent["reduce_scatter"] += self.full_grad.numel() * self.full_grad.element_size()
        self.full_grad = None  # a gradient arriving meanwhile starts a new full gradient

    def finish(self) -> None:
        """Wait for the reduce-scatter and add the mean of each piece to its .grad (a view of the reduced chunk)."""
        if self.mine is None:  # finished already (or never reduced): nothing to add
            return
        if self.work is not None:
            self.work.wait()
        _, post = divide_factors(self.world_size, self.grad_dtype)  # the rest of the division, after the sum
        mean = self.mine.div_(post).to(self.shard.dtype)  # reduced in grad_dtype, kept in the shard's (fp32 master)
        for piece, where, _ in self.pieces.values():
            piece.grad = mean[where] if piece.grad is None else piece.grad.add_(mean[where])  # / world_size: as DDP
        self.ready, self.work, self.mine = set(), None, None

    def gather(self, async_op: bool = False, group=None):
        """All-gather every rank's chunk into the flat buffer, which the parameters read."""
        self.sent["all_gather"] += self.flat.buffer.numel() * self.flat.buffer.element_size()
        # a chunk that is a view of the output buffer goes as a copy: the collective's input never aliases its output
        mine = self.shard.detach() if self.own_shard else self.shard.detach().clone()
        return gather_chunks(self.flat, mine, async_op, group)


class ZeroOptimizer(torch.optim.Optimizer):
    """ZeRO-1 or -2 around any torch.optim optimizer, with torch's Optimizer interface (see the module docstring)."""

    def __init__(self, params, optimizer_class=torch.optim.Adam, stage: int = 1, bucket_cap_mb: float | None = None,
                 **defaults):
        if isinstance(params, torch.Tensor):  # torch.optim's own refusal: iterating a tensor would yield its rows
            raise TypeError("params argument given to the optimizer should be an iterable of Tensors or dicts, "
                            f"but got {torch.typename(params)}")
        if stage not in (1, 2):
            raise ValueError(f"ZeroOptimizer implements stages 1 and 2, not {stage!r} (stage 3 shards the model).")
        refuse_not_elementwise(optimizer_class, "ZeroOptimizer")
        self.optimizer_class, self.stage, self.caps = optimizer_class, stage, ddp_caps(bucket_cap_mb)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.buckets, self.bucket_of, self.inner = [], {}, None
        self.pending, self.next, self.reduced, self._consolidated, self.sync = False, 0, False, None, True
        params = [{**g, "params": as_list(g["params"])} if isinstance(g, dict) else g for g in params]
        refuse_ddp([q for g in params for q in (g["params"] if isinstance(g, dict) else [g])])  # before any change
        super().__init__(params, defaults)  # torch builds the groups: it calls add_param_group for each

    def add_param_group(self, param_group: dict) -> None:
        """torch's add_param_group; the group's trained parameters go into buckets, their pieces to the inner optimizer."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        trained = [p for p in reversed(group["params"]) if p.requires_grad]  # last layer first
        for p in trained:
            dist.broadcast(p.detach(), 0)  # every rank starts from rank 0's weights, as DDP's constructor does
        new = []
        for kind in dict.fromkeys((p.dtype, p.device) for p in trained):  # a bucket per dtype and device, as DDP's
            same = [p for p in trained if (p.dtype, p.device) == kind]
            sizes = [p.numel() * p.element_size() for p in same]
            new += [Bucket([same[i] for i in g], self.rank, self.world_size) for g in assign_buckets(sizes, self.caps)]
        for bucket in new:
            self.buckets.append(bucket)
            for p, view in zip(bucket.params, bucket.flat.views, strict=True):
                p.data = view  # the model reads its weights from the bucket's buffer, as ZeroAdam's from its Flat
                self.bucket_of[p] = bucket
                let_go(p)  # a newer ZeroOptimizer (or MiniDDP) takes over from an older one: one reduction
                p._dp_hook = p.register_post_accumulate_grad_hook(self.collect) if self.stage == 2 else None
        pieces = [piece for b in new for piece, _, _ in b.pieces.values()]
        inner = {**{k: v for k, v in group.items() if k != "params"}, "params": pieces}
        if self.inner is None:
            self.inner = self.optimizer_class([inner], **self.defaults)
        else:
            self.inner.add_param_group(inner)
        for key, value in self.inner.param_groups[-1].items():  # the inner class's defaults (betas, eps, ...)
            group.setdefault(key, value)

    no_sync = HookAllReduce.no_sync  # the same switch: stage 2's hook leaves gradients in .grad while sync is off

    @property
    def sent(self) -> dict:
        """Bytes this rank has handed to each collective so far."""
        return {k: sum(b.sent[k] for b in self.buckets) for k in ("reduce_scatter", "all_gather")}

    def pieces(self) -> list[nn.Parameter]:
        """This rank's pieces of every parameter, the tensors the inner optimizer steps."""
        return [piece for b in self.buckets for piece, _, _ in b.pieces.values()]

    def collect(self, p: nn.Parameter) -> None:
        """Stage 2's hook: p's gradient is final; reduce-scatter its bucket once the bucket is complete."""
        if not self.sync:  # accumulation: the gradient stays in .grad, and the next synced backward adds to it
            return
        if not self.pending:  # the first gradient of this backward: finish every bucket when the backward ends
            engine_callback(self.finish_backward)
            self.pending = True
        self.bucket_of[p].collect(p)
        while self.next < len(self.buckets) and self.buckets[self.next].full():  # in order: every rank alike
            self.buckets[self.next].reduce(async_op=True)
            if self.next > 0:  # the previous bucket's full gradient goes as soon as its chunk has arrived
                self.buckets[self.next - 1].finish()
            self.next += 1

    def finish_backward(self) -> None:
        """The end of a stage-2 backward: reduce what is left, in bucket order on every rank, and wait for all."""
        try:
            for bucket in self.buckets[self.next:]:  # parameters this backward did not reach on this rank: zeros,
                for p in bucket.params:  # or the gradient they accumulated under no_sync
                    if p not in bucket.ready and p.grad is not None:
                        bucket.collect(p)
                bucket.reduce(async_op=True)
            for bucket in self.buckets:
                bucket.finish()
        finally:
            self.pending, self.next = False, 0

    def reduce_gradients(self) -> None:
        """Reduce every bucket once per step (stage 1 here; stage 2 did it in the backward), then drop unused ones."""
        if self.reduced:
            return
        if self.stage == 1:
            for bucket in self.buckets:
                bucket.reduce()
                bucket.finish()
        drop_unused(self.buckets)
        self.reduced = True

    _step_supports_amp_scaling = True  # so that a GradScaler hands step() its scale, which step() then refuses

    @torch.no_grad()
    def step(self, closure=None):
        """Step this rank's pieces with the inner optimizer, then all-gather the new parameters on every rank."""
        if closure is not None:
            raise ValueError("ZeroOptimizer.step takes no closure: every rank must run the same collectives.")
        # a GradScaler sets found_inf (and grad_scale, unless unscale_ ran first): each rank would find infs in its own
        # gradients only, and stage 2's gradients are not in .grad for unscale_ to see
        if getattr(self, "grad_scale", None) is not None or hasattr(self, "found_inf"):
            raise ValueError("ZeroOptimizer does not support GradScaler: train in bfloat16 (autocast), which needs no "
                             "loss scaling, or use Zero3Module with torch's ShardedGradScaler.")
        self.reduce_gradients()
        for group, inner in zip(self.param_groups, self.inner.param_groups, strict=True):
            inner.update({k: v for k, v in group.items() if k != "params"})  # a scheduler changes the outer groups
        self.inner.step()
        for group, inner in zip(self.param_groups, self.inner.param_groups, strict=True):
            group.update({k: v for k, v in inner.items() if k != "params"})  # what the optimizer wrote, as torch's
        for bucket in self.buckets:
            bucket.gather()
        self.zero_grad_pieces()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the full gradients (zeroed in place with set_to_none=False) and this rank's reduced pieces."""
        for p in self.bucket_of:
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad.zero_()
        self.pending, self.next = False, 0  # a backward that raised never reached its end: start afresh
        for bucket in self.buckets:
            bucket.reset()
        self.zero_grad_pieces()

    def zero_grad_pieces(self) -> None:
        """Forget the reduced pieces and which parameters had gradients: the next backward starts afresh."""
        for bucket in self.buckets:
            bucket.had_grad = set()
            for piece, _, _ in bucket.pieces.values():
                piece.grad = None
        self.reduced = False

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Scale the reduced gradients to a global 2-norm of at most max_norm; the norm over every rank's pieces."""
        self.reduce_gradients()
        return clip_pieces_(self.pieces(), max_norm, self.buckets[0].flat.buffer.device)

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gather the whole optimizer state on rank `to` (a collective: every rank calls it), for state_dict()."""
        params = [p for g in self.param_groups for p in g["params"]]
        index = {p: i for i, p in enumerate(params)}
        mine = {index[p]: {key: (span, value.cpu() if isinstance(value, torch.Tensor) else value)
                           for key, value in self.inner.state.get(piece, {}).items()}
                for b in self.buckets for p, (piece, _, span) in b.pieces.items()}
        everyone = [None] * self.world_size if self.rank == to else None
        dist.gather_object(mine, everyone, dst=to)  # only rank `to` ever holds the whole state
        groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [index[p] for p in g["params"]]}
                  for g in self.param_groups]
        self._consolidated = {"state": assemble(everyone, params), "param_groups": groups} if self.rank == to else None

    def state_dict(self) -> dict:
        """The consolidated state, in the plain optimizer's format (after consolidate_state_dict, on that rank)."""
        if self._consolidated is None:
            raise RuntimeError("call consolidate_state_dict(to=rank) on every rank first, then state_dict() on that "
                               "rank: the state is sharded over the ranks.")
        return self._consolidated

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a plain optimizer's (or a consolidated) state dict on every rank: each keeps its own pieces."""
        params = [p for g in self.param_groups for p in g["params"]]
        for group, saved in zip(self.param_groups, state_dict["param_groups"], strict=True):
            group.update({k: v for k, v in saved.items() if k != "params"})
        for i, entry in state_dict["state"].items():
            p = params[int(i)]
            if p in self.bucket_of and p in self.bucket_of[p].pieces:
                piece, _, span = self.bucket_of[p].pieces[p]
                self.inner.state[piece] = {k: on_piece(piece_of(p, v, k, span), piece, k) for k, v in entry.items()}


def per_element(key: str, value, length: int) -> bool:
    """Whether a piece's state entry holds one value per element of the piece (a step count does not)."""
    return isinstance(value, torch.Tensor) and key != "step" and value.dim() == 1 and value.numel() == length


def assemble(everyone: list[dict], params: list[nn.Parameter]) -> dict:
    """Each parameter's state from every rank's pieces of it: a per-element entry made whole, the rest taken once."""
    state: dict[int, dict] = {}
    for rank_state in everyone:
        for i, entries in rank_state.items():
            p = params[i]
            for key, (span, value) in entries.items():
                entry = state.setdefault(i, {})
                if per_element(key, value, span.stop - span.start):
                    whole = entry.setdefault(key, torch.zeros(p.shape, dtype=value.dtype, device=p.device))
                    whole.view(-1)[span] = value.to(p.device)
                else:
                    entry.setdefault(key, value.to(p.device) if isinstance(value, torch.Tensor) else value)
    return state


def piece_of(p: nn.Parameter, value, key: str, span: slice):
    """This rank's piece of one state entry of p (a per-element tensor), or the entry itself (a step count)."""
    if not (isinstance(value, torch.Tensor) and value.shape == p.shape and (p.dim() > 0 or key != "step")):
        return value.clone() if isinstance(value, torch.Tensor) else value
    return value.reshape(-1)[span].clone()


def on_piece(value, piece: nn.Parameter, key: str):
    """A loaded state entry on the piece's device (and dtype, for per-element floats), as a plain optimizer casts it."""
    if not isinstance(value, torch.Tensor):
        return value
    if key != "step" and value.is_floating_point() and value.shape == piece.shape:
        return value.to(device=piece.device, dtype=piece.dtype)
    return value.to(piece.device) if value.dim() else value  # a step count may stay where torch keeps it


def as_list(params) -> list:
    """A parameter group's "params": one tensor, or an iterable (a generator is read once, here)."""
    return [params] if isinstance(params, torch.Tensor) else list(params)


def drop_unused(buckets: list[Bucket]) -> None:
    """Pieces of parameters no rank had a gradient for get .grad None, so the optimizer skips them as one process."""
    used = used_anywhere(buckets)
    for bucket in buckets:
        for p, (piece, _, _) in bucket.pieces.items():  # the ranks whose chunk holds part of p
            if not used[p]:
                piece.grad = None


def used_anywhere(buckets: list[Bucket]) -> dict:
    """Parameter -> whether any rank had a gradient for it (one small all-reduce, as DDP's map of used parameters)."""
    params = [p for b in buckets for p in b.params]
    flags = torch.tensor([float(p in b.had_grad) for b in buckets for p in b.params],
                         device=buckets[0].flat.buffer.device)
    dist.all_reduce(flags)
    return {p: bool(f) for p, f in zip(params, flags.tolist(), strict=True)}


def clip_pieces_(pieces: list[nn.Parameter], max_norm: float, device) -> torch.Tensor:
    """Scale the pieces' gradients to a global 2-norm of at most max_norm: the norm over every rank's pieces."""
    grads = [s.grad for s in pieces if s.grad is not None]
    squares = sum((g.float().pow(2).sum() for g in grads), torch.zeros((), device=device))
    dist.all_reduce(squares)  # the pieces partition every gradient
    norm = squares.sqrt()
    for g in grads:
        g.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))  # as torch.nn.utils.clip_grad_norm_
    return norm


def refuse_ddp(params) -> None:
    """One sentence before anything runs when these parameters belong to a DistributedDataParallel model."""
    from torch.nn.parallel import DistributedDataParallel

    ours = {id(p) for p in params}
    # the models alive in this process (the usual order wraps first, then builds this); the plain nn.Module test
    # first: DistributedDataParallel is also an abc class, whose isinstance is ~10x slower over every object
    with warnings.catch_warnings():  # the scan touches torch's deprecated module aliases, which warn when looked at
        warnings.simplefilter("ignore", FutureWarning)
        ddp = [obj for obj in gc.get_objects() if isinstance(obj, nn.Module) and isinstance(obj, DistributedDataParallel)]
    for obj in ddp:
        if any(id(p) in ours for p in obj.parameters()):
            raise ValueError("ZeroOptimizer reduces the gradients itself: build it over the plain model's parameters, "
                             "not a DistributedDataParallel model's, whose all-reduce would send every gradient twice.")
