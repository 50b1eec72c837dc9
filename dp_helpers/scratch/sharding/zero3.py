"""ZeRO stage 3 from scratch, built on zero.py's Bucket: `model = Zero3Module(model)`, then any elementwise optimizer.

nn.Module in, nn.Module out, as torch's `fully_shard`. Each module that owns parameters is a unit (modules that share a
parameter form one unit, as `fully_shard([a, b])` asks): its parameters are views of one `Flat` buffer that exists only
while needed, and this rank keeps its chunk of it (the fp32 master values) as the pieces that `parameters()` returns,
one per parameter with values in the chunk, for the user's own optimizer. The schedule, step by step:

1. before a unit's forward its buffer's storage is refilled and all-gathered (`Unit.gather`); after the forward it is
   freed again (the storage resized to 0 bytes: autograd's saved references to the parameters see it refilled);
2. before the unit's backward it is gathered again; once its backward is over (the gradient has reached the module's
   inputs: FSDP2's post-backward, the same moment on every rank) its gradients are reduce-scattered into this rank's
   pieces, a parameter this rank did not use adding zeros; at the end of the backward the units whose inputs needed
   no gradient (the first) are reduced too, and a parameter no rank had a gradient for keeps `.grad = None` on its
   pieces, so the optimizer skips it as it would in one process;
3. what makes it fast: the next unit's all-gather starts (is prefetched) while the current one computes, in the
   order the first forward ran (backwards during the backward), and each reduce-scatter runs while the backward goes
   on (`async_op=True`, waited for one unit later); `prefetch=False` turns the first off, to time what it hides;
4. mixed precision (`MixedPrecision`): gathered and computed in param_dtype, reduced in reduce_dtype, the pieces
   and their updates in the parameters' own dtype (fp32 master weights).
A parameter used outside its own module's forward (a GPT's head `F.linear(h, self.emb.weight)` in the parent's
forward) is gathered where it is used, and its unit is then held full until the backward ends and reduced there, as
FSDP2 does when the embedding sits in the root's group (`GatherOnUse` sees every op of the forward).
Every rank must run the same units in its forward and in its backward (as with FSDP: a unit used, or fed into the loss,
on some ranks only would leave their all-gathers unmatched). Not supported: a second backward through a retained graph
(its gradients would reach the next step). A module whose input is a leaf tensor that requires grad (a reentrant
activation checkpoint's detached copy) is reduced when the backward ends, not after its own backward: the leaf's
gradient may land before the module's weight gradients. The end of the backward is queued from a hook on the
wrapper's outputs, so a reentrant checkpoint's inner backward does not end it early. A rank whose chunks hold padding alone gets one
empty piece, so that an optimizer built over `parameters()` has a parameter on every rank. The pieces are 1-D, so the optimizer must update each element on its own (`zero.ELEMENTWISE`);
an optimizer that is not (Adafactor, Muon, LBFGS) is refused at its first step. Clip with `model.clip_grad_norm_` (the
norm over every rank's pieces); `full_state_dict()` gathers every weight by its original name, a state dict the plain
model loads. Outside a unit's forward its parameters are freed (reading `model.module.fc.weight` then fails, as FSDP2
leaves DTensor shards there). Under a `GradScaler`, use torch's `ShardedGradScaler`, which agrees on infs across
ranks. A module is wrapped once. It runs inside a process group. Taught in notebook 08.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from dp_helpers.scratch.ddp.mini_ddp import broadcast_state, engine_callback, let_go
from dp_helpers.scratch.sharding.zero import (
    Bucket,
    all_gather_flat,
    clip_pieces_,
    refuse_not_elementwise,
    used_anywhere,
)

STEP_CHECK = []  # the one optimizer step pre-hook of this process that checks what steps Zero3Module shards


def check_optimizers() -> None:
    """From now on, an optimizer stepping Zero3Module shards refuses in one sentence unless its update is elementwise."""
    if not STEP_CHECK:  # torch's global hook: the wrapper never sees the optimizer built over its parameters
        STEP_CHECK.append(register_optimizer_step_pre_hook(refuse_on_shards))


def refuse_on_shards(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
    """The step pre-hook: an optimizer over Zero3Module pieces must be elementwise (zero.ELEMENTWISE)."""
    if any(getattr(p, "_zero3_shard", False) for group in optimizer.param_groups for p in group["params"]):
        refuse_not_elementwise(type(optimizer), "Zero3Module")


@dataclass(frozen=True)
class MixedPrecision:
    """Compute with parameters in param_dtype, reduce gradients in reduce_dtype; the shards stay in their fp32."""

    param_dtype: torch.dtype | None = None  # the full parameters, gathered and computed with (None: as the shards)
    reduce_dtype: torch.dtype | None = None  # what the reduce-scatter sums (None: param_dtype's)
    output_dtype: torch.dtype | None = None  # the forward's floating outputs cast to it (None: left as computed)


def needing_grad(tree) -> list[torch.Tensor]:
    """The tensors in a nest of lists, tuples and dicts (a module's inputs or outputs) that take part in autograd."""
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor) and t.requires_grad]


def free(buffer: torch.Tensor) -> None:
    """Release a buffer's memory but keep its storage object, so views and autograd's saved tensors can see it refilled."""
    buffer.untyped_storage().resize_(0)


class Unit:
    """One or more modules' own parameters, views of one Flat buffer: full only between a gather and the next free."""

    def __init__(self, modules: list[nn.Module], params: list[torch.Tensor], rank: int, world_size: int,
                 mp: MixedPrecision):
        self.modules, self.work = modules, None
        self.bucket = Bucket(params, rank, world_size, own_shard=True)  # this rank's chunk: the fp32 master values
        flat, dtype = self.bucket.flat, mp.param_dtype or params[0].dtype
        self.bucket.grad_dtype = mp.reduce_dtype or dtype
        if flat.buffer.dtype != dtype:  # the gathered parameters live in param_dtype; the pieces stay as they were
            flat.buffer = flat.buffer.to(dtype)
            flat.views = flat.views_of(flat.buffer)
        for p, view in zip(params, flat.views, strict=True):
            p.data = view  # the module computes with the buffer's values, whenever they are there
        self.nbytes = flat.buffer.untyped_storage().nbytes()
        self.full = True  # as built; released until the first forward
        self.held = False  # used outside its modules' forward: full from that use until the backward's end
        for p in params:
            p._zero3_unit = self  # what GatherOnUse looks for
        self.release()

    def start_gather(self) -> None:
        """Refill the buffer's storage and start the all-gather of every rank's chunk (no-op if under way or done)."""
        if self.full or self.work is not None:
            return
        self.bucket.flat.buffer.untyped_storage().resize_(self.nbytes)
        self.work = self.bucket.gather(async_op=True)  # sent in param_dtype

    def gather(self) -> None:
        """The full parameters, now: wait for the all-gather (starting it if needed); the module computes with them."""
        self.start_gather()
        if self.work is not None:
            self.work.wait()
            for p, view in zip(self.bucket.params, self.bucket.flat.views, strict=True):
                p.data = view  # a parameter released to an empty tensor reads the buffer again
            self.work, self.full = None, True

    def free(self) -> None:
        """Free the full parameters between a forward and its backward (views of a storage the next gather refills)."""
        if self.work is not None:
            self.gather()  # a prefetch under way must land before its storage goes
        free(self.bucket.flat.buffer)
        self.full = False

    def release(self) -> None:
        """Free the full parameters for good: until the next gather they are empty tensors (printing them is safe)."""
        self.free()
        for p in self.bucket.params:
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)


class GatherOnUse(TorchFunctionMode):
    """During the forward: an op given a parameter whose unit is not full gathers that unit and holds it."""

    def __init__(self, wrapper: Zero3Module):
        super().__init__()
        self.wrapper = wrapper

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for t in tree_leaves((args, kwargs)):
            unit = getattr(t, "_zero3_unit", None) if isinstance(t, torch.Tensor) else None
            if unit is not None and not unit.full:  # every rank runs the same forward: the same gathers
                self.wrapper.hold(unit)
        return func(*args, **kwargs)


class Zero3Module(nn.Module):
    """ZeRO-3 from scratch behind nn.Module: parameters() are this rank's shards; forward gathers unit by unit."""

    def __init__(self, module: nn.Module, mixed_precision: MixedPrecision | None = None, prefetch: bool = True):
        super().__init__()
        if getattr(module, "_zero3_wrapped", False):
            raise ValueError("this module is already wrapped by a Zero3Module: its parameters are shards of the first one")
        broadcast_state(module)  # every rank starts from rank 0's weights and buffers
        self.rank, self.world_size, self.mp = dist.get_rank(), dist.get_world_size(), mixed_precision or MixedPrecision()
        self.names = [(name, p) for name, p in module.named_parameters(remove_duplicate=False)]
        self.units = [Unit(mods, params, self.rank, self.world_size, self.mp) for mods, params in units_of(module)]
        self.unit_of = {p: u for u in self.units for p in u.bucket.params}
        pieces = [piece for u in self.units for piece, _, _ in u.bucket.pieces.values()]
        # a rank whose chunks hold padding alone (a tiny model on many ranks): one empty piece, so that every rank's
        # optimizer has a parameter (torch refuses an empty list) and the ranks run the same collectives
        self.pieces = nn.ParameterList(pieces or [nn.Parameter(self.units[0].bucket.shard[:0])])
        for piece in self.pieces:
            piece._zero3_shard = True  # what refuse_on_shards looks for
        check_optimizers()
        hide_parameters(module)  # the wrapper's parameters are the shards alone
        object.__setattr__(module, "_zero3_wrapped", True)
        self.module, self.order, self.pending, self.waiting, self.launched = module, [], False, [], None
        self.prefetching = prefetch  # False: a unit is gathered only when it is needed (notebook 08 times both)
        for unit in self.units:
            for m in unit.modules:
                m.register_forward_pre_hook(lambda _, args, u=unit: unwatched(self.before_forward, u, args))
                m.register_forward_hook(lambda _, args, out, u=unit: unwatched(self.after_forward, u, out))
            for p in unit.bucket.params:
                let_go(p)  # a MiniDDP or ZeroOptimizer made earlier over these parameters reduces no more
                p._dp_hook = p.register_post_accumulate_grad_hook(self.grad_ready)

    def forward(self, *args, **kwargs):
        """The wrapped module's forward, its units gathered and freed as it goes (inputs cast to param_dtype)."""
        if self.pending:  # the last backward raised before its end: its callback never ran, so start afresh
            self.pending, self.waiting, self.launched = False, [], None
            for unit in self.units:
                unit.bucket.reset()
        for unit in self.units:  # left full (a prefetch whose unit did not run, torch.autograd.grad): stale after a step
            unit.release()
        args, kwargs = cast_floats((args, kwargs), self.mp.param_dtype)
        with GatherOnUse(self):
            out = self.module(*args, **kwargs)
        for unit in self.units:
            if unit.held and unit not in self.waiting:  # no backward will come for it (no_grad, eval)
                unit.release()
        for t in needing_grad(out):  # the outputs' gradients arrive first, in the backward loss.backward() started
            t.register_hook(lambda grad: self.start_backward())
        return cast_floats(out, self.mp.output_dtype)

    def start_backward(self) -> None:
        """Queue the end of this backward, once; the output hooks call it first."""
        # not from a unit's hook: in a reentrant checkpoint it would run when that inner backward ends
        if not self.pending:
            engine_callback(self.finish_backward)
            self.pending, self.before = True, {piece: piece.grad is None for piece in self.pieces}

    def hold(self, unit: Unit) -> None:
        """Gather a unit used outside its modules' forward; keep it full and reduce it when the backward ends."""
        unit.gather()
        unit.held = True
        if torch.is_grad_enabled() and unit not in self.waiting:
            self.waiting.append(unit)

    def before_forward(self, unit: Unit, args) -> None:
        """Gather this unit; prefetch the next one in the first forward's order (recorded then); book its post-backward."""
        if unit not in self.order:
            self.order.append(unit)
        unit.gather()
        self.prefetch(unit, +1)
        inputs = needing_grad(args)
        # once the gradient reaches the inputs, the module's backward is over (FSDP2's post-backward); but a leaf
        # input's gradient (a reentrant checkpoint's detached copy, a learner's own tensor) may land before the
        # module's weight gradients: such a unit is reduced when the whole backward ends
        if inputs and not any(t.is_leaf for t in inputs):
            torch.autograd.graph.register_multi_grad_hook(inputs, lambda grads: self.post_backward(unit))

    def prefetch(self, unit: Unit, direction: int) -> None:
        """Start the gather of the unit that runs next in this direction (+1 forward, -1 backward)."""
        k = self.order.index(unit) + direction
        if self.prefetching and 0 <= k < len(self.order) and len(self.order) == len(self.units):
            self.order[k].start_gather()

    def after_forward(self, unit: Unit, out) -> None:
        """Free the unit; gather it again (prefetching the previous one) just before its backward needs it."""
        needed = needing_grad(out)
        if not needed:  # no backward will come (no_grad, eval): nothing keeps the parameters
            unit.release()
            return
        if not unit.held:  # a held unit stays full for the use outside its modules, and their backward
            unit.free()  # the parameters stay views of the empty storage: autograd saved them
        if not (unit.held and unit in self.waiting):  # a held unit is reduced once, when the backward ends
            self.waiting.append(unit)  # its gradients are to be reduced, at its post-backward or the backward's end
        for t in needed:
            t.register_hook(lambda grad, u=unit: self.before_backward(u))

    def before_backward(self, unit: Unit) -> None:
        """Gather this unit for its backward; prefetch the unit whose backward comes next."""
        self.start_backward()  # a loss not built from the outputs: queued here, by the first unit's backward
        unit.gather()
        self.prefetch(unit, -1)

    def grad_ready(self, p: torch.Tensor) -> None:
        """A gradient is final: move it into its unit's full gradient, freeing the parameter's."""
        self.unit_of[p].bucket.collect(p)

    def post_backward(self, unit: Unit) -> None:
        """A module's backward is over: reduce-scatter its unit (zeros for what it did not use), the same on every rank."""
        if unit in self.waiting and not unit.held:  # a held unit's other uses may send gradients later
            self.waiting.remove(unit)
            if unit not in self.waiting:  # a module called twice ends its backward twice: reduce after the last
                self.reduce(unit)

    def reduce(self, unit: Unit) -> None:
        """Start the unit's reduce-scatter and free its parameters; the one started before it lands meanwhile."""
        unit.bucket.finish()  # a unit reduced twice in one backward (two modules share it): the first lands first
        unit.bucket.reduce(async_op=True)
        unit.release()
        if self.launched is not None and self.launched is not unit:
            self.launched.bucket.finish()
        self.launched = unit

    def finish_backward(self) -> None:
        """Reduce the units whose inputs needed no gradient (the first ones), wait for all, leave unused shards' .grad None."""
        try:
            for unit in self.waiting[::-1]:
                self.reduce(unit)
            for unit in self.units:
                unit.bucket.finish()
                unit.release()
            self.drop_unused()
        finally:
            self.pending, self.waiting, self.launched = False, [], None

    def drop_unused(self) -> None:
        """Pieces of parameters no rank had a gradient for in this backward go back to .grad = None (if it was)."""
        used = used_anywhere([u.bucket for u in self.units])
        for unit in self.units:
            for p, (piece, _, _) in unit.bucket.pieces.items():
                if not used[p] and self.before[piece]:
                    piece.grad = None
        for unit in self.units:
            unit.bucket.had_grad = set()

    @property
    def sent(self) -> dict:
        """Bytes this rank has handed to each collective so far."""
        return {k: sum(u.bucket.sent[k] for u in self.units) for k in ("reduce_scatter", "all_gather")}

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Scale the pieces' gradients to a global 2-norm of at most max_norm (the norm over every rank's pieces)."""
        return clip_pieces_(list(self.pieces), max_norm, self.units[0].bucket.shard.device)

    def full_values(self, unit: Unit) -> list[torch.Tensor]:
        """A unit's parameters in full at the pieces' precision: under mixed precision the fp32 master values."""
        bucket = unit.bucket
        if bucket.shard.dtype == bucket.flat.buffer.dtype:
            unit.gather()
            return [p.detach().clone() for p in bucket.params]
        full = torch.empty(bucket.flat.buffer.numel(), dtype=bucket.shard.dtype, device=bucket.shard.device)
        all_gather_flat(full, bucket.shard.detach())
        return [v.clone() for v in bucket.flat.views_of(full)]

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every parameter in full by its original name, and the persistent buffers: a collective, every rank gets all."""
        names = {}
        for name, p in self.names:
            names.setdefault(p, []).append(name)  # a tied weight under each of its names, as the plain model's
        state = {}
        for unit in self.units:  # one unit full at a time
            for p, value in zip(unit.bucket.params, self.full_values(unit), strict=True):
                state.update({name: value for name in names.pop(p)})
            unit.release()
        rest = self.module.state_dict()  # what is left: frozen parameters and persistent buffers
        return {**{k: v.detach().clone() for k, v in rest.items()}, **state}


def unwatched(hook, *args) -> None:
    """Run one of the wrapper's own forward hooks out of GatherOnUse's sight: its gathers and frees are no use."""
    with torch._C.DisableTorchFunction():
        hook(*args)


def cast_floats(tree, dtype: torch.dtype | None):
    """Every floating-point tensor in a nest of lists, tuples and dicts cast to dtype (None: the tree itself)."""
    if dtype is None:
        return tree
    from torch.utils._pytree import tree_map

    return tree_map(lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t, tree)


def units_of(module: nn.Module) -> list[tuple[list[nn.Module], list[torch.Tensor]]]:
    """Modules with parameters of their own, those that share a parameter merged: (modules, their distinct params)."""
    groups: list[tuple[list[nn.Module], list[torch.Tensor]]] = []
    for m in module.modules():
        own = [p for p in m.parameters(recurse=False) if p.requires_grad]
        if not own:
            continue
        joined = [g for g in groups if any(q is p for p in own for q in g[1])]
        mods, params = [m], list(own)
        for g in joined:
            groups.remove(g)
            mods, params = g[0] + mods, g[1] + [p for p in params if all(p is not q for q in g[1])]
        groups.append((mods, params))
    return groups


def hide_parameters(module: nn.Module) -> None:
    """Turn the trained parameters into plain tensor attributes, so the wrapper's parameters are only its shards."""
    for m in module.modules():
        for name, p in list(m._parameters.items()):
            if p is not None and p.requires_grad:
                del m._parameters[name]
                object.__setattr__(m, name, p)
