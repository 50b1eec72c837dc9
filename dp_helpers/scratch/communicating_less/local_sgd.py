"""Local SGD and DiLoCo from scratch: each rank trains alone for H steps, then the ranks meet once.

- `LocalSGD(model, period=H)`: after steps 0, H, 2H, ... (counted from 0, as torch's `PeriodicModelAverager`) the
  parameters are replaced by their mean over ranks; with H = 1 and plain SGD that is DDP's update. During
  `warmup_steps` it averages every step (torch's averager leaves those to DDP's post_localSGD_hook instead).
- `DiLoCo(model, inner, period=H)`: the inner optimizer (AdamW in the paper) takes H local steps; then the mean over
  ranks of how far each moved from the last agreed weights is a pseudo-gradient, which an outer SGD with Nesterov
  momentum applies to those weights (Douillard et al., 2023). Inner state stays on each rank.
Both send the parameters once per H steps, 1/H of DDP's gradients; `sent` counts the values handed to all-reduce.
They run inside a process group, on a plain (not DDP-wrapped) model; every rank must take the same number of steps,
and steps after the last average stay each rank's own. They average every trained parameter, so a parameter some
ranks leave unused is fine. Buffers (BatchNorm's statistics) and frozen parameters are not averaged.
Supports: any model and any inner optimizer (its state is never averaged), parameters on one device (mixed dtypes
are averaged in the dtype torch.cat promotes them to). Refuses: period < 1, warmup_steps < 0. Not handled: ranks that take different numbers of
steps (their all-reduces no longer match), a DDP-wrapped model (its own all-reduce would average every step).
Notebook 10 teaches both.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from dp_helpers.scratch.ddp.mini_ddp import broadcast_state


@torch.no_grad()
def average_(tensors: list[torch.Tensor], mean: bool = True) -> int:
    """Replace each tensor by its mean (or sum) over ranks, one all-reduce of them all flattened; return the values sent."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    if mean:
        flat /= dist.get_world_size()  # divided first, then summed: torch's average_parameters does the same
    dist.all_reduce(flat)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
    return flat.numel()


class LocalSGD:
    """Call after_step() after each optimizer step: every H-th call averages the parameters over the ranks."""

    def __init__(self, module: nn.Module, period: int, warmup_steps: int = 0):
        if period < 1 or warmup_steps < 0:
            raise ValueError(f"LocalSGD needs period >= 1 and warmup_steps >= 0, not {period} and {warmup_steps}.")
        broadcast_state(module)  # every rank starts from rank 0's weights
        self.params, self.period, self.warmup = [p for p in module.parameters() if p.requires_grad], period, warmup_steps
        self.step, self.sent, self.calls = 0, 0, 0

    def after_step(self) -> None:
        """Average the parameters if this step's turn has come (before warmup_steps: every step, as DDP would)."""
        if self.due(self.step):
            self.average()
        self.step += 1

    def due(self, step: int) -> bool:
        """Whether the parameters are averaged after this step (counted from 0)."""
        return step < self.warmup or (step - self.warmup) % self.period == 0

    def average(self) -> None:
        """Replace every trained parameter by its mean over ranks: the same tensors on every rank, gradient or not."""
        # torch's averager takes only the parameters with a .grad on this rank: where a rank leaves one unused, the
        # ranks flatten different lengths and the all-reduce fails (or, at equal lengths, mixes tensors silently)
        self.sent += average_([p.data for p in self.params])
        self.calls += 1

    def finish(self) -> None:
        """After the last step: average once more if the ranks have stepped alone since the last average."""
        if self.step and not self.due(self.step - 1):
            self.average()


class DiLoCo:
    """Call step() instead of the inner optimizer's: every H-th step applies the outer update on every rank."""

    def __init__(self, module: nn.Module, inner: torch.optim.Optimizer, period: int, outer_lr: float = 0.7,
                 outer_momentum: float = 0.9):
        if period < 1:
            raise ValueError(f"DiLoCo needs period >= 1, not {period}.")
        broadcast_state(module)
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.inner, self.period, self.steps, self.sent, self.calls = inner, period, 0, 0, 0
        self.agreed = [p.detach().clone() for p in self.params]  # the weights the ranks last agreed on
        self.outer = torch.optim.SGD(self.agreed, lr=outer_lr, momentum=outer_momentum, nesterov=outer_momentum > 0)

    def step(self) -> None:
        """One inner step; after each H-th, the outer step."""
        self.inner.step()
        self.steps += 1
        if self.steps % self.period == 0:
            self.outer_step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The inner optimizer's zero_grad: DiLoCo stands where the optimizer stood in a training loop."""
        self.inner.zero_grad(set_to_none=set_to_none)

    def finish(self) -> None:
        """After the last step: one outer step more if inner steps were taken since the last one."""
        if self.steps % self.period:
            self.outer_step()

    @torch.no_grad()
    def outer_step(self) -> None:
        """The ranks' mean pseudo-gradient (agreed - local) as the outer optimizer's gradient; everyone takes the result."""
        deltas = [a - p for a, p in zip(self.agreed, self.params, strict=True)]
        self.sent, self.calls = self.sent + average_(deltas), self.calls + 1
        for a, d in zip(self.agreed, deltas, strict=True):
            a.grad = d
        self.outer.step()
        for p, a in zip(self.params, self.agreed, strict=True):
            p.copy_(a)
