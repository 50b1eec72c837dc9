"""Streaming DiLoCo from scratch: DiLoCo whose outer step moves one fragment of the parameters at a time (its notebook is still to be written).

The trained parameters are split into P fragments: P contiguous runs of about equal size, or the modules you name
(a transformer's blocks, say). Fragment f lands every H steps, after steps (f+1) H/P + kH (floor, counted from 1),
so each synchronisation sends about 1/P of the values DiLoCo sends at once (Douillard et al. 2025, arXiv
2501.18512). Its pseudo-gradient (agreed - local) leaves `delay` steps earlier (tau in the paper) in an all-reduce
that does not block; the inner steps go on meanwhile, and when it lands the outer optimizer steps that fragment's
agreed weights and each rank keeps `alpha` of its own weights for it, taking 1 - alpha of the agreed ones (alpha = 0:
the agreed weights, as DiLoCo does). This is torchft 0.2.0's schedule and merge (tests/test_streaming_diloco.py runs
both); with one fragment and no delay it is DiLoCo, value for value.
Supports what DiLoCo supports (any model and inner optimizer, a plain model inside a process group). Refuses:
fewer than one fragment or more than the trained parameter tensors or than H, modules that do not hold every trained
parameter exactly once, delay < 0 or >= H // fragments (a fragment must land before it is sent again), alpha outside
[0, 1]. `finish()` lands what is in flight and then synchronises each fragment trained since it was sent, so the
ranks end on the same weights. Not handled: what DiLoCo does not.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from dp_helpers.scratch.communicating_less.local_sgd import DiLoCo


def split_evenly(sizes: list[int], parts: int) -> list[list[int]]:
    """Indices of `sizes` cut into `parts` contiguous, non-empty runs whose sums lie as near total/parts as cuts allow."""
    if not 1 <= parts <= len(sizes):
        raise ValueError(f"cannot cut {len(sizes)} tensors into {parts} non-empty fragments.")
    cumulative = torch.tensor(sizes, dtype=torch.float64).cumsum(0)
    ends = []  # the last index of each fragment but the last
    for k in range(1, parts):
        low, high = (ends[-1] + 1 if ends else 0), len(sizes) - 1 - (parts - k)  # room for the fragments after
        gaps = (cumulative[low:high + 1] - cumulative[-1] * k / parts).abs()
        ends.append(low + int(gaps.argmin()))
    bounds = [-1, *ends, len(sizes) - 1]
    return [list(range(a + 1, b + 1)) for a, b in zip(bounds, bounds[1:], strict=False)]


class StreamingDiLoCo(DiLoCo):
    """Call step() instead of the inner optimizer's: each fragment's outer step is sent when due and lands `delay` steps later."""

    def __init__(self, module: nn.Module, inner: torch.optim.Optimizer, period: int, fragments=2,
                 delay: int = 0, alpha: float = 0.0, outer_lr: float = 0.7, outer_momentum: float = 0.9):
        trained = [p for p in module.parameters() if p.requires_grad]
        # refused before DiLoCo's broadcast: every rank refuses alike, before any collective
        check(len(trained), period, fragments if isinstance(fragments, int) else len(fragments), delay, alpha)
        parts = fragment_indices(trained, fragments)
        super().__init__(module, inner, period, outer_lr, outer_momentum)
        self.fragments, self.delay, self.alpha = parts, delay, alpha
        # fragment f lands after steps floor(H (f+1) / P) + kH and is sent `delay` steps before
        self.offsets = [(period * (f + 1) // len(parts) - delay) % period for f in range(len(parts))]
        self.in_flight = {}  # fragment -> (the step its sum lands at, the all-reduce's work, its flat buffer)
        self.last_sent = [0] * len(parts)  # the step each fragment was last sent after
        self.largest = 0  # the most values one synchronisation sent

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
        flat = torch.cat([(self.agreed[i] - self.params[i]).reshape(-1) for i in self.fragments[f]])
        flat /= dist.get_world_size()
        work = dist.all_reduce(flat, async_op=True)
        self.in_flight[f], self.last_sent[f] = (self.steps + self.delay, work, flat), self.steps
        self.sent, self.calls, self.largest = self.sent + flat.numel(), self.calls + 1, max(self.largest, flat.numel())

    @torch.no_grad()
    def land(self, f: int) -> None:
        """Wait for fragment f's sum, step its agreed weights with it, and mix them into the local ones."""
        _, work, flat = self.in_flight.pop(f)
        work.wait()
        offset = 0
        for i in self.fragments[f]:
            self.agreed[i].grad = flat[offset:offset + self.agreed[i].numel()].view_as(self.agreed[i])
            offset += self.agreed[i].numel()
        self.outer.step()  # SGD skips the agreed tensors without a grad: only this fragment moves
        for i in self.fragments[f]:
            self.params[i].mul_(self.alpha).add_(self.agreed[i], alpha=1 - self.alpha)
            self.agreed[i].grad = None

    @torch.no_grad()
    def finish(self) -> None:
        """After the last step: land what is in flight, synchronise each fragment trained since it was sent, end agreed."""
        for f in list(self.in_flight):
            self.land(f)
        self.alpha = 0.0
        for f in range(len(self.fragments)):
            if self.last_sent[f] < self.steps:
                self.send(f)
                self.land(f)
        for p, a in zip(self.params, self.agreed, strict=True):  # where alpha kept some local weights
            p.copy_(a)

    def outer_step(self) -> None:
        """Not used: the fragments step one at a time."""
        raise NotImplementedError("StreamingDiLoCo steps fragments in land(); DiLoCo's outer_step is not called.")


def fragment_indices(trained: list, fragments) -> list[list[int]]:
    """The trained parameters' indices per fragment: `fragments` even runs, or the parameters of each module given."""
    if isinstance(fragments, int):
        return split_evenly([p.numel() for p in trained], fragments)
    position = {id(p): i for i, p in enumerate(trained)}
    parts = [[position.get(id(p), -1) for p in m.parameters() if p.requires_grad] for m in fragments]
    if sorted(i for part in parts for i in part) != list(range(len(trained))) or not all(parts):
        raise ValueError("StreamingDiLoCo's fragment modules must hold every trained parameter of the model once.")
    return parts


def check(tensors: int, period: int, fragments: int, delay: int, alpha: float) -> None:
    """Refuse a schedule that cannot run, in one sentence."""
    if not 1 <= fragments <= min(tensors, period):
        raise ValueError(f"StreamingDiLoCo needs 1 <= fragments <= min(trained tensors {tensors}, period {period}), "
                         f"not {fragments}.")
    if not 0 <= delay < period // fragments:
        raise ValueError(f"StreamingDiLoCo needs 0 <= delay < period // fragments = {period // fragments} (a fragment "
                         f"must land before the next is sent), not {delay}.")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"StreamingDiLoCo needs 0 <= alpha <= 1 (the share of its own weights a rank keeps), not {alpha}.")
