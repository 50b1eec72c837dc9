"""Streaming DiLoCo from scratch: DiLoCo whose outer step moves one fragment of the parameters at a time (notebook 11).

The trained parameters are split into P fragments: P runs of their values laid end to end, equal to one value (a
tensor may be cut between two), or the modules you name (a transformer's blocks, say). Fragment f lands every H
steps, after steps floor(H (f+1) / P) + kH (counted from 1), so a synchronisation sends 1/P of the values DiLoCo
sends at once (Douillard et al. 2025, arXiv 2501.18512). Its pseudo-gradient (agreed - local) leaves `delay` steps
earlier (tau in the paper) in an all-reduce that does not block (with delay 0 it is waited for at once); the inner
steps go on, and when it lands the fragment's outer optimizer (SGD with Nesterov momentum, one per fragment, as
DiLoCo's) steps its agreed values and each rank keeps `alpha` of its own values, taking 1 - alpha of the agreed ones
(alpha = 0: the agreed values, as DiLoCo does). This is torchft 0.2.0's schedule and merge where P divides H and every
commit succeeds (torchft requires the first and retries a failed fragment; tests/test_streaming_diloco.py runs both);
one fragment without delay is DiLoCo, exactly.
Supports any model and inner optimizer, a plain model inside a process group, as DiLoCo. Refuses: fewer than one
fragment or more than the trained values or than H, modules that do not hold every trained parameter exactly once,
delay < 0 or >= H // P (one fragment in flight at a time: each lands before the next is sent), alpha outside [0, 1],
a parameter that is not contiguous. `finish()` lands what is in flight, then synchronises each fragment trained since
it was sent, so the ranks end on the same weights. Not handled: what DiLoCo does not (ranks taking different numbers
of steps).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from dp_helpers.scratch.ddp.mini_ddp import broadcast_state

Piece = tuple[int, int, int]  # (parameter index, first value, one past the last value) of that parameter, flattened


def equal_runs(sizes: list[int], parts: int) -> list[list[Piece]]:
    """The values of tensors of these sizes, laid end to end, cut into `parts` runs whose lengths differ by one at most."""
    total = sum(sizes)
    if not 1 <= parts <= total:
        raise ValueError(f"StreamingDiLoCo cannot cut {total} values into {parts} non-empty fragments.")
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    bounds = [(f * total // parts, (f + 1) * total // parts) for f in range(parts)]
    return [[(i, max(lo, s) - s, min(hi, s + n) - s) for i, (s, n) in enumerate(zip(starts, sizes, strict=True))
             if max(lo, s) < min(hi, s + n)] for lo, hi in bounds]


def module_pieces(trained: list[nn.Parameter], modules: list[nn.Module]) -> list[list[Piece]]:
    """Each module's trained parameters, whole; refused unless they hold every trained parameter once."""
    position = {id(p): i for i, p in enumerate(trained)}
    parts = [[position.get(id(p), -1) for p in m.parameters() if p.requires_grad] for m in modules]
    if sorted(i for part in parts for i in part) != list(range(len(trained))) or not all(parts):
        raise ValueError("StreamingDiLoCo's fragment modules must hold every trained parameter of the model once.")
    return [[(i, 0, trained[i].numel()) for i in part] for part in parts]


class StreamingDiLoCo:
    """Call step() instead of the inner optimizer's: each fragment is sent when due and lands `delay` steps later."""

    def __init__(self, module: nn.Module, inner: torch.optim.Optimizer, period: int, fragments=2,
                 delay: int = 0, alpha: float = 0.0, outer_lr: float = 0.7, outer_momentum: float = 0.9):
        self.params = [p for p in module.parameters() if p.requires_grad]
        count = fragments if isinstance(fragments, int) else len(fragments)
        check(self.params, period, count, delay, alpha)  # before the broadcast: every rank refuses alike
        self.pieces = equal_runs([p.numel() for p in self.params], fragments) if isinstance(fragments, int) \
            else module_pieces(self.params, fragments)
        broadcast_state(module)  # every rank starts from rank 0's weights
        self.inner, self.period, self.delay, self.alpha = inner, period, delay, alpha
        self.agreed = [self.local(f).clone() for f in range(count)]  # each fragment's agreed values, flat
        self.outer = [torch.optim.SGD([a], lr=outer_lr, momentum=outer_momentum, nesterov=outer_momentum > 0)
                      for a in self.agreed]
        # fragment f lands after steps floor(H (f+1) / P) + kH and is sent `delay` steps before
        self.offsets = [(period * (f + 1) // count - delay) % period for f in range(count)]
        self.in_flight = {}  # fragment -> (the step its sum lands at, the all-reduce's work, its flat buffer)
        self.steps, self.sent, self.calls, self.largest, self.last_sent = 0, 0, 0, 0, [0] * count

    def local(self, f: int) -> torch.Tensor:
        """This rank's current values of fragment f, flat (a copy)."""
        return torch.cat([self.params[i].detach().view(-1)[a:b] for i, a, b in self.pieces[f]])

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The inner optimizer's zero_grad: StreamingDiLoCo stands where the optimizer stood in a training loop."""
        self.inner.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        """One inner step; then the fragments due are sent, and those whose sums are due land."""
        self.inner.step()
        self.steps += 1
        for f, offset in enumerate(self.offsets):
            if self.steps % self.period == offset:
                self.send(f)
        for f in [f for f, (lands, _, _) in self.in_flight.items() if lands == self.steps]:
            self.land(f)

    @torch.no_grad()
    def send(self, f: int) -> None:
        """Start the all-reduce of fragment f's pseudo-gradient, divided by the ranks first, without waiting for it."""
        flat = (self.agreed[f] - self.local(f)) / dist.get_world_size()
        work = dist.all_reduce(flat, async_op=True)
        self.in_flight[f], self.last_sent[f] = (self.steps + self.delay, work, flat), self.steps
        self.sent, self.calls, self.largest = self.sent + flat.numel(), self.calls + 1, max(self.largest, flat.numel())

    @torch.no_grad()
    def land(self, f: int) -> None:
        """Wait for fragment f's sum, step its agreed values with it, and mix them into the local ones."""
        _, work, flat = self.in_flight.pop(f)
        work.wait()
        self.agreed[f].grad = flat
        self.outer[f].step()
        self.agreed[f].grad = None
        self.mix(f, self.alpha)

    @torch.no_grad()
    def mix(self, f: int, alpha: float) -> None:
        """Fragment f's local values become alpha x themselves + (1 - alpha) x the agreed ones, in place."""
        offset = 0
        for i, a, b in self.pieces[f]:
            mine = self.params[i].detach().view(-1)[a:b]  # a view of the parameter: written in place
            mine.mul_(alpha).add_(self.agreed[f][offset:offset + b - a], alpha=1 - alpha)
            offset += b - a

    def finish(self) -> None:
        """After the last step: land what is in flight, synchronise each fragment trained since it was sent, end agreed."""
        for f in list(self.in_flight):
            self.land(f)
        self.alpha = 0.0  # from here on every rank takes the agreed values
        for f in range(len(self.pieces)):
            if self.last_sent[f] < self.steps:
                self.send(f)
                self.land(f)
            else:  # sent after the last step and landed: alpha may have kept some local values
                self.mix(f, 0.0)


def check(params: list[nn.Parameter], period: int, fragments: int, delay: int, alpha: float) -> None:
    """Refuse a schedule that cannot run, in one sentence."""
    values = sum(p.numel() for p in params)
    if not 1 <= fragments <= min(values, period):
        raise ValueError(f"StreamingDiLoCo needs 1 <= fragments <= min(trained values {values}, period {period}), "
                         f"not {fragments}.")
    if not 0 <= delay < period // fragments:
        raise ValueError(f"StreamingDiLoCo needs 0 <= delay < period // fragments = {period // fragments} (one fragment in "
                         f"flight at a time: each lands before the next is sent), not {delay}.")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"StreamingDiLoCo needs 0 <= alpha <= 1 (the share of its own weights a rank keeps), not {alpha}.")
    if not all(p.is_contiguous() for p in params):
        raise ValueError("StreamingDiLoCo writes fragments into the parameters in place: make them contiguous first.")
