"""The DistributedSampler arithmetic: samples per rank, padding, steps and what one process would do (notebooks 01, 03).

Torch-free, so the CLI's checks use it before anything starts; the training script and the checkers use it too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ShardPlan:
    """How many samples each rank sees per epoch, the padding, and the batch sizes that follow."""

    samples: int
    world_size: int
    batch_size: int
    per_rank: int
    padded: int
    steps_per_epoch: int
    last_batch: int
    grad_accum_steps: int = 1

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps per epoch: the micro-batches grouped grad_accum_steps at a time."""
        return math.ceil(self.steps_per_epoch / self.grad_accum_steps)

    @property
    def last_group(self) -> int:
        """Micro-batches in the epoch's last optimizer step."""
        return self.steps_per_epoch - (self.optimizer_steps - 1) * self.grad_accum_steps

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step over all ranks: world_size x batch_size x grad_accum_steps."""
        return self.world_size * self.batch_size * self.grad_accum_steps

    @property
    def mixes_micro_batch_sizes(self) -> bool:
        """True when the last optimizer step accumulates a short micro-batch with full ones (each weighted by its size)."""
        return self.last_batch != self.batch_size and self.last_group > 1

    @property
    def equivalent_to_large_batch(self) -> bool:
        """True when the run sees exactly the batches one process with the global batch sees, weighted alike."""
        return self.padded == 0  # micro-batches of unequal size are weighted by their size, as one large batch

    def explain(self) -> str:
        """One sentence on whether this run matches one process with the global batch, and why."""
        w, g = self.world_size, self.global_batch
        if self.padded:
            verb = "does" if self.samples == 1 else "do"
            times = "twice" if self.padded <= self.samples else "more than once"  # the sampler repeats from the start
            return (f"not identical to one process with batch {g}: {plural(self.samples, 'sample')} {verb} not split "
                    f"evenly over {w} ranks, so the sampler repeats {self.padded} sample(s) every epoch "
                    f"and the last global batch ({w}x{self.last_batch}) counts them {times}.")
        same = f"identical to one process with batch {g}"
        whole, rest = divmod(self.samples, g)
        if not rest:
            return f"{same}: {self.samples} samples split into {plural(whole, 'whole global batch', 'whole global batches')}."
        return (f"{same}: one process's last batch holds the remaining {plural(rest, 'sample')}, and so does this "
                f"run's last optimizer step: {self.last_step()}.")

    def last_step(self) -> str:
        """How the epoch's last optimizer step is made up, in words (for explain)."""
        b, k = self.batch_size, self.last_group
        if self.last_batch == b:
            return f"it accumulates only {k} of {self.grad_accum_steps} micro-batches"
        if k == 1:
            return f"each rank's last batch is short ({plural(self.last_batch, 'sample')})"
        return (f"it accumulates {k} micro-batches ({plural(k - 1, 'full one', 'full ones')} of {b} samples and one "
                f"of {self.last_batch}), each weighted by its size, as one large batch weights every sample")


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 sample', '2 samples'; irregular plurals given: plural(2, 'process', 'processes')."""
    return f"{n} {word if n == 1 else many or word + 's'}"


def shard_plan(samples: int, world_size: int, batch_size: int, grad_accum_steps: int = 1) -> ShardPlan:
    """The DistributedSampler arithmetic (drop_last=False) for one epoch, micro-batches grouped for accumulation."""
    per_rank = math.ceil(samples / world_size)
    steps = math.ceil(per_rank / batch_size)
    last = per_rank - (steps - 1) * batch_size
    return ShardPlan(samples, world_size, batch_size, per_rank, per_rank * world_size - samples, steps, last,
                     grad_accum_steps)
