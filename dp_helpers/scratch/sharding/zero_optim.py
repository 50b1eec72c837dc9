"""ZeRO stages 1 and 2 behind torch's optimizer interface: `ZeroOptimizer(params, torch.optim.AdamW, stage=2, lr=...)`.

Like `torch.distributed.optim.ZeroRedundancyOptimizer`, it takes parameters or parameter groups and any
`torch.optim` optimizer class with its keyword arguments, and it is a `torch.optim.Optimizer` (`param_groups`,
`add_param_group`, `state_dict`/`load_state_dict` in the plain optimizer's format, consolidated on one rank).
Unlike it, it reduces the gradients itself, so it is used on the plain model and refuses a DDP-wrapped one:

- the trained parameters of each group are laid out in flat buckets of about `bucket_cap_mb` (last layer first,
  the order the backward produces gradients; a bucket per dtype and device), each padded to a multiple of
  world_size; rank r owns chunk r of every bucket, and the inner optimizer steps only those chunks, so it must be
  elementwise (`ELEMENTWISE`: SGD, Adam, AdamW, ...); Adafactor, Muon, LBFGS and SparseAdam are refused at once,
  and so is a sparse gradient; keys the inner optimizer writes into its groups are copied back after each step;
- stage 1 keeps the full local gradients and reduce-scatters them at `step`;
- stage 2 reduce-scatters each bucket **during the backward**, as soon as its last gradient is ready, frees each
  parameter's `.grad` once it is in its bucket, and each bucket's full gradient once the next bucket is launched:
  at most two buckets' full gradients at a time, and between steps a rank holds only its chunks of them; under
  `optimizer.no_sync()` a backward only accumulates into `.grad` (accumulation sends once per step, as DDP's);
- `step` then all-gathers every bucket, so each rank's model holds the new full parameters.
Limits: clip with `optimizer.clip_grad_norm_` (torch.nn.utils' sees no stage-2 gradients and stage 1's unreduced
ones); `GradScaler` is refused at its first step; a parameter frozen when the optimizer is built stays out of it
(build the optimizer again after unfreezing: the new one takes over the old one's hooks); the buckets keep the
reverse registration order, so a model whose gradients become ready in another order still trains the same but
launches its stage-2 buckets later (MiniDDP, like DDP, rebuilds its buckets in the observed order).
Taught in notebook 08 (its ZeroAdam is the same idea around Adam alone); it runs inside a process group.
"""

from __future__ import annotations

import gc

import torch
import torch.distributed as dist
from torch import nn

from dp_helpers.scratch.ddp.mini_ddp import (
    HookAllReduce,
    assign_buckets,
    ddp_caps,
    engine_callback,
    let_go,
)
from dp_helpers.scratch.sharding.zero import all_gather_flat, padded, reduce_scatter_flat

# torch's optimizers whose update of an element reads that element's gradient and state alone (and the step count):
# they may step 1-D chunks of a parameter. Adafactor (row and column statistics, the parameter's RMS), Muon (whole
# matrices), LBFGS (a closure, global directions) and SparseAdam (sparse gradients) may not. A subclass counts as its
# base; add your own class here if its update is elementwise too.
ELEMENTWISE = {torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adamax, torch.optim.NAdam,
               torch.optim.RAdam, torch.optim.Adagrad, torch.optim.Adadelta, torch.optim.RMSprop, torch.optim.Rprop,
               torch.optim.ASGD}


def refuse_not_elementwise(optimizer_class: type, who: str) -> None:
    """One sentence when an optimizer class is not known to update each element on its own."""
    if not any(issubclass(optimizer_class, known) for known in ELEMENTWISE):
        raise ValueError(f"{who} shards each parameter into 1-D chunks, so it steps only optimizers whose update is "
                         f"elementwise (SGD, Adam, AdamW, ...: zero_optim.ELEMENTWISE), and "
                         f"{optimizer_class.__name__} is not among them: use torch's ZeroRedundancyOptimizer, which "
                         "keeps whole tensors, or add the class to ELEMENTWISE if its update is elementwise.")


class Bucket:
    """Trained parameters of one group that travel together; rank r owns chunk r of each, a shard per parameter."""

    def __init__(self, params: list[nn.Parameter], rank: int, world_size: int):
        self.params, self.world_size = params, world_size
        self.sizes = [padded(p.numel(), world_size) // world_size for p in params]  # each parameter's chunk
        # rank-major layout: [rank 0's chunks of every parameter | rank 1's | ...], so that one reduce-scatter hands
        # each rank its chunk of every parameter, and one all-gather brings every chunk back
        self.buffer = torch.zeros(world_size * sum(self.sizes), dtype=params[0].dtype, device=params[0].device)
        self.shards = [nn.Parameter(chunk.clone()) for chunk in self.chunks_of(self.layout([p.detach() for p in params]), rank)]
        self.nbytes = self.buffer.untyped_storage().nbytes()
        self.buffer.untyped_storage().resize_(0)  # the gather's landing place: memory only while gathering
        self.position, self.grad_dtype = {p: i for i, p in enumerate(params)}, self.buffer.dtype  # dtype reduced in
        self.full_grad, self.sending, self.ready, self.work, self.mine, self.had_grad = None, None, set(), None, None, set()
        self.sent = {"reduce_scatter": 0, "all_gather": 0}  # bytes this rank handed to each collective

    def layout(self, tensors: list[torch.Tensor], dtype: torch.dtype | None = None) -> torch.Tensor:
        """Tensors shaped like the parameters, placed in a new rank-major buffer (each padded to world_size chunks)."""
        out = torch.zeros(self.buffer.shape, dtype=dtype or self.buffer.dtype, device=self.buffer.device)
        for i, t in enumerate(tensors):
            self.add_into(out, i, t)
        return out

    def add_into(self, buffer: torch.Tensor, i: int, t: torch.Tensor) -> None:
        """Add a tensor shaped like parameter i into its world_size chunks of a rank-major buffer."""
        if t.is_sparse:
            raise ValueError("ZeroOptimizer needs dense gradients: build nn.Embedding without sparse=True.")
        size, offset = self.sizes[i], sum(self.sizes[:i])
        buffer.view(self.world_size, -1)[:, offset:offset + size] += padded_chunks(t.to(buffer.dtype), self.world_size)

    def chunks_of(self, row: torch.Tensor, rank: int | None = None) -> list[torch.Tensor]:
        """Rank's row of a rank-major buffer cut into one chunk per parameter (row alone: it is that row already)."""
        if rank is not None:
            row = row.view(self.world_size, -1)[rank]
        return list(row.split(self.sizes))

    def unlayout(self, buffer: torch.Tensor) -> list[torch.Tensor]:
        """The parameters' full values from a rank-major buffer (the inverse of layout)."""
        rows, out, offset = buffer.view(self.world_size, -1), [], 0
        for p, size in zip(self.params, self.sizes, strict=True):
            out.append(rows[:, offset:offset + size].reshape(-1)[:p.numel()].view_as(p))
            offset += size
        return out

    def collect(self, p: nn.Parameter) -> None:
        """Stage 2: add p's gradient to the bucket's full gradient and free it."""
        if self.full_grad is None:
            self.full_grad = torch.zeros(self.buffer.shape, dtype=self.grad_dtype, device=self.buffer.device)
        self.add_into(self.full_grad, self.position[p], p.grad)
        p.grad = None  # the full gradient lives on only inside the bucket, until its reduce-scatter
        self.ready.add(p)
        self.had_grad.add(p)

    def full(self) -> bool:
        """Whether every gradient of the bucket has arrived in this backward."""
        return len(self.ready) == len(self.params)

    def reduce(self, async_op: bool = False) -> None:
        """Reduce-scatter the full gradient (stage 1: from .grad) so this rank gets its chunks, summed over ranks."""
        if self.full_grad is None:  # stage 1, or a stage-2 bucket no gradient reached: zeros where .grad is None
            self.had_grad |= {p for p in self.params if p.grad is not None}
            self.full_grad = self.layout([torch.zeros_like(p) if p.grad is None else p.grad for p in self.params],
                                         self.grad_dtype)
        pre, _ = divide_factors(self.world_size, self.grad_dtype)
        if pre != 1:  # fp16: part of the division before the sum, so that the sum cannot overflow (FSDP2's split)
            self.full_grad.div_(pre)
        self.mine = torch.empty(sum(self.sizes), dtype=self.grad_dtype, device=self.buffer.device)
        self.work = reduce_scatter_flat(self.mine, self.full_grad, async_op=async_op)
        self.sent["reduce_scatter"] += self.full_grad.numel() * self.full_grad.element_size()
        self.sending, self.full_grad = self.full_grad, None  # a gradient arriving meanwhile starts a new full gradient

    def finish(self) -> None:
        """Wait for the reduce-scatter and add the mean of each chunk to its shard's .grad; free the full gradient."""
        if self.mine is None:  # finished already (or never reduced): nothing to add
            return
        if self.work is not None:
            self.work.wait()
        _, post = divide_factors(self.world_size, self.grad_dtype)  # the rest of the division, after the sum
        for shard, mean in zip(self.shards, self.chunks_of(self.mine.div_(post)), strict=True):
            mean = mean.to(shard.dtype)  # reduced in grad_dtype, kept in the shard's (fp32 master) dtype
            shard.grad = mean.clone() if shard.grad is None else shard.grad.add_(mean)  # / world_size: as DDP
        self.sending, self.ready, self.work, self.mine = None, set(), None, None

    def gather(self) -> None:
        """All-gather every rank's chunks and write the new full values into the parameters."""
        self.buffer.untyped_storage().resize_(self.nbytes)
        all_gather_flat(self.buffer, torch.cat([s.detach() for s in self.shards]))
        self.sent["all_gather"] += self.nbytes
        for p, value in zip(self.params, self.unlayout(self.buffer), strict=True):
            p.data.copy_(value)
        self.buffer.untyped_storage().resize_(0)


class ZeroOptimizer(torch.optim.Optimizer):
    """ZeRO-1 or -2 around any torch.optim optimizer, with torch's Optimizer interface (see the module docstring)."""

    def __init__(self, params, optimizer_class=torch.optim.Adam, stage: int = 1, bucket_cap_mb: float | None = None,
                 **defaults):
        if stage not in (1, 2):
            raise ValueError(f"ZeroOptimizer implements stages 1 and 2, not {stage!r} (stage 3 shards the model).")
        refuse_not_elementwise(optimizer_class, "ZeroOptimizer")
        self.optimizer_class, self.stage, self.caps = optimizer_class, stage, ddp_caps(bucket_cap_mb)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.buckets, self.bucket_of, self.shard_of, self.inner = [], {}, {}, None
        self.pending, self.next, self.reduced, self._consolidated, self.sync = False, 0, False, None, True
        super().__init__(params, defaults)  # torch builds the groups: it calls add_param_group for each
        refuse_ddp(self.bucket_of)

    def add_param_group(self, param_group: dict) -> None:
        """torch's add_param_group; the group's trained parameters go into buckets, their shards to the inner optimizer."""
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
            for p, shard in zip(bucket.params, bucket.shards, strict=True):
                self.bucket_of[p], self.shard_of[p] = bucket, shard
                let_go(p)  # a newer ZeroOptimizer (or MiniDDP) takes over from an older one: one reduction
                p._dp_hook = p.register_post_accumulate_grad_hook(self.collect) if self.stage == 2 else None
        inner = {**{k: v for k, v in group.items() if k != "params"}, "params": [s for b in new for s in b.shards]}
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
            if self.next > 0:  # the previous bucket's full gradient goes as soon as its chunks have arrived
                self.buckets[self.next - 1].finish()
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
        """Reduce every bucket once per step (stage 1 here; stage 2 did it in the backward), then drop unused ones."""
        if self.reduced:
            return
        if self.stage == 1:
            for bucket in self.buckets:
                bucket.reduce()
                bucket.finish()
        self.drop_unused()
        self.reduced = True

    def drop_unused(self) -> None:
        """Shards of parameters no rank had a gradient for get .grad None, so the inner optimizer skips them."""
        for p, used in used_anywhere(self.buckets).items():
            if not used:
                self.shard_of[p].grad = None

    _step_supports_amp_scaling = True  # so that a GradScaler hands step() its scale, which step() then refuses

    @torch.no_grad()
    def step(self, closure=None):
        """Step this rank's shards with the inner optimizer, then all-gather the new parameters on every rank."""
        if closure is not None:
            raise ValueError("ZeroOptimizer.step takes no closure: every rank must run the same collectives.")
        if getattr(self, "grad_scale", None) is not None:  # each rank would find infs in its own gradients only
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
        self.zero_grad_shards()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the full gradients (zeroed in place with set_to_none=False) and this rank's reduced chunks."""
        for p in self.bucket_of:
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad.zero_()
        self.pending, self.next = False, 0  # a backward that raised never reached its end: start afresh
        self.zero_grad_shards()

    def zero_grad_shards(self) -> None:
        """Forget the reduced chunks and which parameters had gradients: the next backward starts afresh."""
        for bucket in self.buckets:
            bucket.had_grad = set()
            for shard in bucket.shards:
                shard.grad = None
        self.reduced = False

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Scale the reduced gradients to a global 2-norm of at most max_norm; the norm over every rank's chunks."""
        self.reduce_gradients()
        return clip_chunks_(list(self.shard_of.values()), max_norm)

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gather the whole optimizer state on rank `to` (a collective: every rank calls it), for state_dict()."""
        index = {p: i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}
        state = {}
        for p, shard in self.shard_of.items():
            for key, value in sorted(self.inner.state.get(shard, {}).items()):
                state.setdefault(index[p], {})[key] = self.gathered(p, shard, value, to)
        groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [index[p] for p in g["params"]]}
                  for g in self.param_groups]
        self._consolidated = {"state": state, "param_groups": groups} if self.rank == to else None

    def gathered(self, p: nn.Parameter, shard: nn.Parameter, value, to: int):
        """One state entry of p on rank `to`: a per-element tensor gathered from every rank's chunk, else copied."""
        if not (isinstance(value, torch.Tensor) and value.shape == shard.shape):
            return value.clone() if isinstance(value, torch.Tensor) else value
        chunks = [torch.empty_like(value) for _ in range(self.world_size)] if self.rank == to else None
        dist.gather(value.detach().contiguous(), chunks, dst=to)  # only rank `to` ever holds the whole state
        return torch.cat(chunks)[:p.numel()].view_as(p).clone() if self.rank == to else None

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
        for i, entry in state_dict["state"].items():
            p = params[int(i)]
            if p in self.shard_of:
                shard = self.shard_of[p]
                self.inner.state[shard] = {k: on_shard(self.chunk_of(p, v, k), shard, k) for k, v in entry.items()}

    def chunk_of(self, p: nn.Parameter, value, key: str = ""):
        """This rank's chunk of one state entry of p (a per-element tensor), or the entry itself (a step count)."""
        if not (isinstance(value, torch.Tensor) and value.shape == p.shape and (p.dim() > 0 or key != "step")):
            return value.clone() if isinstance(value, torch.Tensor) else value
        return padded_chunks(value, self.world_size)[self.rank].clone()


def divide_factors(world_size: int, dtype: torch.dtype) -> tuple[float, float]:
    """(pre, post): divide by pre before the sum over ranks and by post after, pre * post = world_size (FSDP2's rule)."""
    if dtype in (torch.float32, torch.bfloat16):  # no overflow to fear: all of it after
        return 1, world_size
    pre = 1  # fp16 and the rest: a power of two near sqrt(world_size) before, the remainder after
    while world_size % pre == 0 and world_size / pre > pre:
        pre *= 2
    return pre, world_size / pre


def padded_chunks(t: torch.Tensor, world_size: int) -> torch.Tensor:
    """t flattened, padded with zeros to a multiple of world_size, as world_size rows: row r is rank r's chunk."""
    flat = torch.zeros(padded(t.numel(), world_size), dtype=t.dtype, device=t.device)
    flat[:t.numel()] = t.reshape(-1)
    return flat.view(world_size, -1)


def used_anywhere(buckets: list[Bucket]) -> dict:
    """Parameter -> whether any rank had a gradient for it (one small all-reduce, as DDP's map of used parameters)."""
    params = [p for b in buckets for p in b.params]
    flags = torch.tensor([float(p in b.had_grad) for b in buckets for p in b.params], device=params[0].device)
    dist.all_reduce(flags)
    return {p: bool(f) for p, f in zip(params, flags.tolist(), strict=True)}


def clip_chunks_(shards: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """Scale the shards' gradients to a global 2-norm of at most max_norm: the norm over every rank's chunks."""
    grads = [s.grad for s in shards if s.grad is not None]
    squares = sum((g.float().pow(2).sum() for g in grads), torch.zeros((), device=shards[0].device))
    dist.all_reduce(squares)  # the chunks partition every gradient (the padding adds zeros)
    norm = squares.sqrt()
    for g in grads:
        g.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))  # as torch.nn.utils.clip_grad_norm_
    return norm


def on_shard(value, shard: nn.Parameter, key: str):
    """A loaded state entry on the shard's device (and dtype, for per-element floats), as a plain optimizer casts it."""
    if not isinstance(value, torch.Tensor):
        return value
    if key != "step" and value.is_floating_point() and value.shape == shard.shape:
        return value.to(device=shard.device, dtype=shard.dtype)
    return value.to(shard.device) if value.dim() else value  # a step count may stay where torch keeps it


def refuse_ddp(params) -> None:
    """One sentence before anything runs when these parameters belong to a DistributedDataParallel model."""
    from torch.nn.parallel import DistributedDataParallel

    ours = {id(p) for p in params}
    # the models alive in this process (the usual order wraps first, then builds this); the plain nn.Module test
    # first: DistributedDataParallel is also an abc class, whose isinstance is ~10x slower over every object
    for obj in gc.get_objects():
        if isinstance(obj, nn.Module) and isinstance(obj, DistributedDataParallel) \
                and any(id(p) in ours for p in obj.parameters()):
            raise ValueError("ZeroOptimizer reduces the gradients itself: build it over the plain model's parameters, "
                             "not a DistributedDataParallel model's, whose all-reduce would send every gradient twice.")
