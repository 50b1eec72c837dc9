"""Sharded data parallelism built from scratch: ZeRO-1, -2 and -3 around Adam, with exact bytes per rank (notebook 08).

- `held_bytes`: what a rank holds, counted from storages (a view or a padded shard counts what it really keeps).
- `zero_bytes`: the fp32 analogue of the ZeRO paper's arithmetic (the paper's is for mixed precision, 2 + 2 + 12):
  4 bytes of parameter, 4 of gradient, 8 of Adam state per parameter, 16 Ψ in all, divided per stage, with the
  padding a flat buffer split into world_size equal shards needs.
- `Flat`: tensors laid out in one buffer padded to a multiple of world_size; rank r owns chunk r.
- `ZeroAdam(model, stage=1|2)`: every rank keeps full parameters; Adam's state exists only for its own chunk;
  gradients are reduce-scattered (each rank receives the sum of its chunk), the chunk is stepped, and an all-gather
  rebuilds the parameters. Stage 2 also drops the full gradients once they are reduced.
- `Zero3(model)`: parameters sharded too. Each module with parameters is a `Unit` whose full parameters exist only
  between an all-gather (before its forward, and again before its backward) and the free that follows; its
  gradients are reduce-scattered once its backward is over (the gradient has reached its inputs), or at the
  backward's end for the first units, whose inputs need none.
All run inside a process group (a script under torchrun, or a test's rank pool).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_leaves

from dp_helpers.scratch.ddp.mini_ddp import broadcast_state, engine_callback

ADAM_STATE_BYTES = 8  # exp_avg and exp_avg_sq, fp32, per parameter


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind tensors (views of one buffer count once, with its padding)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if t is not None}
    return sum(storages.values())


def activation_bytes(model: nn.Module, inputs: torch.Tensor) -> int:
    """Bytes autograd keeps for the backward of one forward (the activations), parameters left out (notebook 08)."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        model(inputs)  # every tensor the backward will need passes through the pack hook
    return storage_bytes(t for t in saved if t.untyped_storage().data_ptr() not in weights)


def needing_grad(tree) -> list[torch.Tensor]:
    """The tensors in a nest of lists, tuples and dicts (a module's inputs or outputs) that take part in autograd."""
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor) and t.requires_grad]


def local(t: torch.Tensor | None) -> torch.Tensor | None:
    """A DTensor's local shard (FSDP2's parameters, gradients and Adam state), any other tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def held_bytes(params: list[torch.Tensor], grads: list[torch.Tensor], optimizer: torch.optim.Optimizer) -> dict:
    """What this rank holds: parameters, gradients and optimizer state, in bytes, counted from storages."""
    state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    return {name: storage_bytes([local(t) for t in tensors])
            for name, tensors in (("parameters", params), ("gradients", grads), ("optimizer state", state))}


def padded(numel: int, world_size: int) -> int:
    """numel rounded up to a multiple of world_size: the flat buffer that splits into equal chunks."""
    return -(-numel // world_size) * world_size


def zero_bytes(units: list[int], world_size: int, stage: int) -> dict:
    """Bytes per rank for fp32 Adam at a ZeRO stage (0: DDP), for flat units of these sizes (numels)."""
    # units: stage 0 one per parameter tensor, stages 1-2 one (the whole model), stage 3 one per module; each unit
    # is padded to a multiple of world_size, and Adam adds a 4-byte step counter per tensor it steps (one per unit)
    numel, chunks = sum(units), [padded(n, world_size) // world_size for n in units]
    full, chunk = 4 * world_size * sum(chunks), 4 * sum(chunks)
    if stage == 0:
        return {"parameters": 4 * numel, "gradients": 4 * numel, "optimizer state": ADAM_STATE_BYTES * numel + 4 * len(units)}
    state = ADAM_STATE_BYTES * sum(chunks) + 4 * len(units)
    # stage 1 keeps autograd's own (unpadded) gradients; from stage 2 on only this rank's chunks of them
    return {"parameters": full if stage < 3 else chunk, "gradients": 4 * numel if stage == 1 else chunk,
            "optimizer state": state}


def fsdp2_bytes(shapes: list[torch.Size], world_size: int, rank: int) -> dict:
    """FSDP2's bytes on `rank` for fp32 Adam (dim-0 shards; the state unpadded, plus a step counter per parameter)."""
    # parameters and gradients keep ceil(rows / W) rows on every rank (padding); Adam's state only the rows it owns
    padded_rows = [-(-s[0] // world_size) * (s.numel() // s[0]) for s in shapes]
    owned = [max(0, min(s[0], (rank + 1) * -(-s[0] // world_size)) - rank * -(-s[0] // world_size)) * (s.numel() // s[0])
             for s in shapes]
    return {"parameters": 4 * sum(padded_rows), "gradients": 4 * sum(padded_rows),
            "optimizer state": ADAM_STATE_BYTES * sum(owned) + 4 * len(shapes)}


class Flat:
    """Tensors copied into one buffer padded to a multiple of world_size; `views` alias it, `chunk(r)` is rank r's part."""

    def __init__(self, tensors: list[torch.Tensor], world_size: int):
        if len({(t.dtype, t.device) for t in tensors}) > 1:
            raise ValueError("a flat buffer holds tensors of one dtype on one device.")
        self.shapes = [t.shape for t in tensors]
        self.size = padded(sum(t.numel() for t in tensors), world_size) // world_size
        self.buffer = torch.zeros(self.size * world_size, dtype=tensors[0].dtype, device=tensors[0].device)
        self.views = self.views_of(self.buffer)
        for view, t in zip(self.views, tensors, strict=True):
            view.copy_(t)

    def views_of(self, buffer: torch.Tensor) -> list[torch.Tensor]:
        """Views of a buffer laid out like this one, one per original tensor, in order."""
        views, offset = [], 0
        for shape in self.shapes:
            numel = shape.numel()
            views.append(buffer[offset:offset + numel].view(shape))
            offset += numel
        return views

    def chunk(self, rank: int) -> torch.Tensor:
        """Rank's equal share of the buffer (a view)."""
        return self.buffer[rank * self.size:(rank + 1) * self.size]


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


class ZeroAdam:
    """ZeRO stage 1 or 2 from scratch: full parameters everywhere, Adam's state and the update for 1/W of them per rank."""

    def __init__(self, model: nn.Module, stage: int = 1, **adam):
        if stage not in (1, 2):
            raise ValueError(f"ZeroAdam implements stages 1 and 2, not {stage!r}.")
        broadcast_state(model)  # every rank starts from rank 0's weights, as DDP does
        self.model, self.stage, self.rank, self.world_size = model, stage, dist.get_rank(), dist.get_world_size()
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.flat = Flat([p.detach() for p in self.params], self.world_size)
        for p, view in zip(self.params, self.flat.views, strict=True):
            p.data = view  # the model now reads its weights from the flat buffer
        self.shard = nn.Parameter(self.flat.chunk(self.rank))  # shares the buffer: stepping it updates the model
        self.adam = torch.optim.Adam([self.shard], **adam)
        self.sent = {"reduce_scatter": 0, "all_gather": 0}  # bytes handed to each collective by this rank

    def step(self) -> None:
        """Reduce-scatter the gradients, step this rank's chunk, all-gather the parameters."""
        full = torch.zeros_like(self.flat.buffer)
        for p, view in zip(self.params, self.flat.views_of(full), strict=True):
            if p.grad is not None:  # an unused parameter contributes zeros
                view.copy_(p.grad)
        self.shard.grad = torch.empty_like(self.shard)
        reduce_scatter_flat(self.shard.grad, full)
        self.shard.grad.div_(self.world_size)  # the mean gradient of this chunk, as DDP's all-reduce gives
        if self.stage == 2:
            for p in self.params:
                p.grad = None  # stage 2 keeps only its own chunk of the gradient
        self.adam.step()
        all_gather_flat(self.flat.buffer, self.shard.detach().clone())
        self.sent["reduce_scatter"] += full.numel() * full.element_size()
        self.sent["all_gather"] += self.flat.buffer.numel() * self.flat.buffer.element_size()
        if self.stage == 1:
            self.shard.grad = None  # stage 1 keeps the full gradients instead

    def zero_grad(self) -> None:
        """Forget the last step's gradients."""
        for p in self.params:
            p.grad = None

    def held(self) -> dict:
        """Bytes this rank holds now (call it after step)."""
        return held_bytes(self.params, [p.grad for p in self.params] + [self.shard.grad], self.adam)

    def full_weights(self) -> list[torch.Tensor]:
        """Every parameter in full: each rank already holds them (the all-gather after each step)."""
        return [p.detach() for p in self.params]


def free(buffer: torch.Tensor) -> None:
    """Release a buffer's memory but keep its storage object, so views and autograd's saved tensors can see it refilled."""
    buffer.untyped_storage().resize_(0)


class Unit:
    """ZeRO-3's unit: one module's own parameters as a flat buffer that exists only while needed, plus this rank's chunk."""

    def __init__(self, module: nn.Module, owner: Zero3):
        self.owner, self.params = owner, list(module.parameters(recurse=False))
        self.flat = Flat([p.detach() for p in self.params], owner.world_size)
        self.shard = nn.Parameter(self.flat.chunk(owner.rank).clone())  # its own storage: the only copy kept
        self.nbytes = self.flat.buffer.untyped_storage().nbytes()
        self.release()
        module.register_forward_pre_hook(self.before_forward)
        module.register_forward_hook(self.after_forward)

    def gather(self) -> None:
        """Refill the full parameters from every rank's chunk (nothing to do if they are there already)."""
        if self.flat.buffer.untyped_storage().nbytes() == self.nbytes:
            return
        self.flat.buffer.untyped_storage().resize_(self.nbytes)
        all_gather_flat(self.flat.buffer, self.shard.detach())
        self.owner.sent["all_gather"] += self.nbytes
        for p, view in zip(self.params, self.flat.views, strict=True):
            p.data = view  # the module computes with the full parameters

    def before_forward(self, module, args) -> None:
        """Gather the parameters; a backward reaching the inputs later means this module's backward is over."""
        self.gather()
        inputs = needing_grad(args)
        if inputs:  # FSDP2's post-backward: once the inputs' gradients exist, so do the parameters'
            torch.autograd.graph.register_multi_grad_hook(inputs, lambda grads: self.owner.post_backward(self))

    def after_forward(self, module, args, out):
        """Free the parameters; gather them again just before this module's backward needs them."""
        needed = needing_grad(out)
        if not needed:  # no backward will come (no_grad, eval): nothing keeps the parameters
            self.release()
            return
        free(self.flat.buffer)  # the parameters stay views of the empty storage: autograd saved them
        self.owner.waiting.append(self)  # its gradients are to be reduced
        for t in needed:
            t.register_hook(lambda grad: self.owner.pre_backward(self))  # before the gradient reaches its backward

    def reduce(self) -> None:
        """Reduce-scatter the unit's gradients into this rank's chunk (added to any there), then free them."""
        full = torch.zeros(self.flat.buffer.shape, dtype=self.shard.dtype, device=self.shard.device)
        for p, view in zip(self.params, self.flat.views_of(full), strict=True):
            if p.grad is not None:  # a parameter this rank did not use adds zeros (FSDP2 can be told to do the same)
                view.copy_(p.grad)
            p.grad = None
        mine = torch.empty_like(self.shard)
        reduce_scatter_flat(mine, full)
        mine.div_(self.owner.world_size)
        self.shard.grad = mine if self.shard.grad is None else self.shard.grad.add_(mine)  # accumulation: the sum
        self.owner.sent["reduce_scatter"] += self.nbytes
        self.release()

    def release(self) -> None:
        """Free the full parameters; outside a forward or backward they are empty tensors (printing them is safe)."""
        free(self.flat.buffer)
        for p in self.params:
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)


class Zero3:
    """ZeRO stage 3 from scratch: each module's parameters live as 1/W chunks, gathered for its forward and its backward."""

    # Supports: any module tree whose parameters are all trained, each owned by one module, that every rank runs
    # alike; a parameter unused on some ranks or all (it adds zeros); accumulation over several backwards.
    # Refuses: frozen and shared (tied) parameters. Adam only, without prefetching (Zero3Module has both).

    def __init__(self, model: nn.Module, **adam):
        params = list(model.parameters())
        if not all(p.requires_grad for p in params) or len({id(p) for p in params}) < sum(
                len(list(m.parameters(recurse=False))) for m in model.modules()):
            raise ValueError("Zero3 trains every parameter, each owned by one module: no frozen or shared (tied) ones.")
        broadcast_state(model)
        self.model, self.rank, self.world_size = model, dist.get_rank(), dist.get_world_size()
        self.sent = {"reduce_scatter": 0, "all_gather": 0}
        self.waiting, self.in_backward = [], False  # units whose gradients are still to be reduced, in forward order
        self.units = [Unit(m, self) for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
        self.adam = torch.optim.Adam([u.shard for u in self.units], **adam)

    def pre_backward(self, unit: Unit) -> None:
        """A unit's backward is next: gather its parameters (and, at the backward's start, book its end)."""
        if not self.in_backward:
            engine_callback(self.finish_backward)
            self.in_backward = True
        unit.gather()

    def post_backward(self, unit: Unit) -> None:
        """A unit's backward is over: reduce-scatter its gradients, used or not, as every rank does at this point."""
        if unit in self.waiting:
            self.waiting.remove(unit)
            if unit not in self.waiting:  # a module called twice ends its backward twice: reduce after the last
                unit.reduce()

    def finish_backward(self) -> None:
        """The backward's end: reduce the units whose inputs needed no gradient (the first), last one first."""
        for unit in self.waiting[::-1]:
            unit.reduce()
        self.waiting, self.in_backward = [], False

    def step(self) -> None:
        """Adam on this rank's chunks (the next forward gathers the new parameters)."""
        self.adam.step()

    def zero_grad(self) -> None:
        """Forget the last step's gradient chunks (and a backward that raised before its end)."""
        self.adam.zero_grad()
        self.waiting, self.in_backward = [], False

    def held(self) -> dict:
        """Bytes this rank holds now."""
        params = [p for u in self.units for p in u.params] + [u.shard for u in self.units]
        return held_bytes(params, [u.shard.grad for u in self.units], self.adam)

    def full_weights(self) -> list[torch.Tensor]:
        """Every parameter in full, gathered on every rank (a collective: all ranks call it)."""
        out = []
        for u in self.units:
            u.gather()
            out += [p.detach().clone() for p in u.params]
            u.release()
        return out


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
