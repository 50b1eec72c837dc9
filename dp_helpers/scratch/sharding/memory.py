"""What a rank holds, counted from storages, and the formulas each sharding strategy must match (notebook 08).

- `held_bytes`: parameters, gradients and optimizer state, from storages (a view or a padded shard counts what it
  really keeps); `activation_bytes`: what autograd keeps for the backward of one forward.
- `zero_bytes`: the fp32 analogue of the ZeRO paper's arithmetic (the paper's is for mixed precision, 2 + 2 + 12):
  4 bytes of parameter, 4 of gradient, 8 of Adam state per parameter, 16 psi in all, divided per stage, with the
  padding a flat buffer split into world_size equal chunks needs; `fsdp2_bytes`: FSDP2's, for its dim-0 shards.
"""

from __future__ import annotations

import torch
from torch import nn

from dp_helpers.scratch.sharding.zero import Flat, padded

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


def local(t: torch.Tensor | None) -> torch.Tensor | None:
    """A DTensor's local shard (FSDP2's parameters, gradients and Adam state), any other tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def held_bytes(params: list[torch.Tensor], grads: list[torch.Tensor], optimizer: torch.optim.Optimizer) -> dict:
    """What this rank holds: parameters, gradients and optimizer state, in bytes, counted from storages."""
    state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    return {name: storage_bytes([local(t) for t in tensors])
            for name, tensors in (("parameters", params), ("gradients", grads), ("optimizer state", state))}


def zero_bytes(units: list, world_size: int, stage: int, rank: int = 0) -> dict:
    """Bytes on `rank` for fp32 Adam at a ZeRO stage (0: DDP), for flat units of these sizes (numels)."""
    # units: stage 0 one per parameter tensor, stages 1-2 one (ZeroAdam: the whole model, Adam over its chunk, one
    # step counter), stage 3 one per module, each a list of its parameters' numels (Zero3Module: each is padded as
    # one flat buffer, and Adam keeps state, with a step counter, for each parameter's piece of this rank's chunk)
    if stage == 3:
        return zero3_bytes([u if isinstance(u, list) else [u] for u in units], world_size, rank)
    numel, chunks = sum(units), [padded(n, world_size) // world_size for n in units]
    full, chunk = 4 * world_size * sum(chunks), 4 * sum(chunks)
    if stage == 0:
        return {"parameters": 4 * numel, "gradients": 4 * numel, "optimizer state": ADAM_STATE_BYTES * numel + 4 * len(units)}
    # stage 1 keeps autograd's own (unpadded) gradients, stage 2 only this rank's chunk of them
    return {"parameters": full, "gradients": 4 * numel if stage == 1 else chunk,
            "optimizer state": ADAM_STATE_BYTES * sum(chunks) + 4 * len(units)}


def zero3_bytes(units: list[list[int]], world_size: int, rank: int) -> dict:
    """Zero3Module's bytes on `rank`: each unit's chunk of parameters and of the reduced gradient, Adam per piece."""
    held = {"parameters": 0, "gradients": 0, "optimizer state": 0}
    for numels in units:
        flat = Flat([torch.empty(n, device="meta") for n in numels], world_size)  # the layout alone, no memory
        owned = flat.pieces(rank)
        if owned:  # held_bytes counts through the pieces: a chunk of padding alone, which no piece views, is not counted
            held["parameters"] += 4 * flat.size
            held["gradients"] += 4 * flat.size
        held["optimizer state"] += sum(ADAM_STATE_BYTES * (w.stop - w.start) + 4 for _, w, _ in owned)
    return held


def fsdp2_bytes(shapes: list[torch.Size], world_size: int, rank: int) -> dict:
    """FSDP2's bytes on `rank` for fp32 Adam (dim-0 shards; the state unpadded, plus a step counter per parameter)."""
    # parameters and gradients keep ceil(rows / W) rows on every rank (padding); Adam's state only the rows it owns
    padded_rows = [-(-s[0] // world_size) * (s.numel() // s[0]) for s in shapes]
    owned = [max(0, min(s[0], (rank + 1) * -(-s[0] // world_size)) - rank * -(-s[0] // world_size)) * (s.numel() // s[0])
             for s in shapes]
    return {"parameters": 4 * sum(padded_rows), "gradients": 4 * sum(padded_rows),
            "optimizer state": ADAM_STATE_BYTES * sum(owned) + 4 * len(shapes)}
