"""Per-step fault tolerance from scratch (notebook 11): a step costs a dead replica's share, not a restart of everyone.

`Replica(model, optimizer, quorum, replica_id)` wraps one replica's training loop:
- `start_step()` meets the others at the quorum (quorum.py) and, when the membership changed or a member lags (it
  has just started again, or missed a step), builds a new gloo group of just those replicas over the same store (a
  replica started again holds no group, even when the members are the same ones as before); the laggard receives
  the model and optimizer state from the member with the most committed steps: healing, not a checkpoint.
- `step_if_agreed()` after the backward: the gradients averaged over the live members (their sum over the group,
  divided by how many they are), then `optimizer.step()` only if that all-reduce succeeded. A member that dies
  mid-step makes it fail on the others: they skip that one step, and the next quorum goes on without the dead one.
  The floating-point buffers (BatchNorm's running statistics) are averaged over the members in the same step, so
  every replica holds the same ones after every step it commits; integer buffers (BatchNorm's count of batches)
  advance alike on every member, one forward a step, and a healed replica copies them.
Supports: any model and optimizer (state_dicts), gloo on CPU, one process per replica. Refuses: nothing else checked.
Not handled: replica groups of several ranks (torchft's DDP or HSDP inside a replica), a replica that reaches the
store but not its peers (a partition: every all-reduce fails, the step is skipped again and again), a byzantine
replica (its gradients are averaged in), a parameter without a gradient (averaged as zeros, as here on every rank).
torchft 0.2.0 (Manager, OptimizerWrapper) does the same in the same case: a replica that fails before step 5 is left
out until it heals from a peer and counts again in that step (tests/test_fault_tolerance.py runs both).
"""

from __future__ import annotations

import io
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from dp_helpers.scratch.fault_tolerance.quorum import Members, Quorum


class Replica:
    """One replica's side of per-step fault tolerance: quorum, healing, and a step taken only when all agreed."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, quorum: Quorum, replica_id: int,
                 step_timeout_s: float = 5.0):
        self.model, self.optimizer, self.quorum, self.id = model, optimizer, quorum, replica_id
        self.timeout = timedelta(seconds=step_timeout_s)
        self.step = quorum.first_open_step()  # a replica that starts late meets the others where they are
        self.committed, self.members, self.group = 0, None, None

    def start_step(self) -> Members:
        """Meet at the next quorum this replica belongs to; heal if it lags; return the step's members."""
        while True:
            members = self.quorum.meet(self.step, self.id, self.committed)
            if self.id in members.replicas and self.join(members):
                return members
            self.step += 1  # arrived after the quorum had closed, or a member failed meanwhile: the next one

    def join(self, members: Members) -> bool:
        """Build a group of the members if they changed, and heal whoever lags; False if a member failed meanwhile."""
        lags = min(members.committed) < max(members.committed)  # every member reads the same counts: all rebuild
        try:
            if self.group is None or lags or members.replicas != self.members.replicas:
                prefix = dist.PrefixStore(f"group{self.step}/", self.quorum.store)  # a fresh group: fresh keys
                self.group = dist.ProcessGroupGloo(prefix, members.index(self.id), len(members.replicas), self.timeout)
            self.members = members
            if lags:
                self.heal(members)
            return True
        except RuntimeError:  # a member died between the quorum and here (gloo's connect or broadcast failed)
            self.group = None
            return False

    def heal(self, members: Members) -> None:
        """Every member takes part; the one with the most committed steps sends, the laggards load its state."""
        root = members.index(members.healthy)
        payload = state_bytes(self.model, self.optimizer) if self.id == members.healthy else torch.empty(0, dtype=torch.uint8)
        size = torch.tensor([payload.numel()])
        self.group.broadcast(size, root).wait()
        payload = payload if self.id == members.healthy else torch.empty(int(size), dtype=torch.uint8)
        self.group.broadcast(payload, root).wait()
        if self.committed < max(members.committed):
            load_state(self.model, self.optimizer, payload)
            self.committed = max(members.committed)

    def step_if_agreed(self) -> bool:
        """Average the gradients (and buffers) over the step's members, then step; False (no step) if one failed."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.model.parameters()]
        buffers = [b for b in self.model.buffers() if b.is_floating_point()]
        try:
            flat = self.averaged(grads)
            kept = self.averaged(buffers) if buffers else None
        except RuntimeError:  # a peer died or timed out: nobody trusts this step's sum
            self.group, self.step = None, self.step + 1
            return False
        for p, g in zip(self.model.parameters(), grads, strict=True):
            p.grad = g
        unflatten(flat, grads)
        if kept is not None:
            unflatten(kept, buffers)
        self.optimizer.step()
        self.committed, self.step = self.committed + 1, self.step + 1
        return True

    def averaged(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """The members' mean of these tensors, laid end to end in one flat tensor (one all-reduce)."""
        flat = torch.cat([t.detach().reshape(-1) for t in tensors])
        self.group.allreduce([flat]).wait()
        return flat.div_(len(self.members.replicas))


def unflatten(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    """Copy a flat tensor's values back into the tensors it was laid out from, in order."""
    offset = 0
    with torch.no_grad():
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()


def replay(model: nn.Module, optimizer: torch.optim.Optimizer, loss_of, schedule) -> None:
    """The one-process reference: for each (step, members) that committed, the members' mean gradient, one step."""
    # each member's forward starts from the step's buffers, and the step keeps the members' mean of the floating-point
    # ones, as the replicas do (integer ones, a count of forwards, advance once)
    buffers = list(model.buffers())
    for step, members in schedule:
        optimizer.zero_grad()
        start, after = [b.clone() for b in buffers], []
        for replica in members:
            for b, first in zip(buffers, start, strict=True):
                b.copy_(first)
            (loss_of(model, step, replica) / len(members)).backward()
            after.append([b.clone() for b in buffers])
        for i, b in enumerate(buffers):
            if b.is_floating_point():
                b.copy_(torch.stack([a[i] for a in after]).mean(0))
        optimizer.step()


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> torch.Tensor:
    """The model's and the optimizer's state_dicts, serialised into one byte tensor."""
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def load_state(model: nn.Module, optimizer: torch.optim.Optimizer, payload: torch.Tensor) -> None:
    """Load what state_bytes sent."""
    state = torch.load(io.BytesIO(payload.numpy().tobytes()), weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
