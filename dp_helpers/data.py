"""The seed's dataset, synthetic data whose labels depend on the features, and the sampler arithmetic (taught in notebook 01)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class SimpleDataset(Dataset):
    """The seed's dataset: pairs of feature rows and targets."""

    def __init__(self, data: torch.Tensor, target: torch.Tensor):
        if len(data) != len(target):
            raise ValueError(f"data has {len(data)} rows but target has {len(target)}.")
        self.data, self.target = data, target

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, idx):
        return self.data[idx], self.target[idx]


def make_synthetic(samples: int, dim: int, seed: int, noise: float = 0.5) -> SimpleDataset:
    """Features ~ N(0, 1) and labels from a hidden linear rule plus noise, so a model can learn them."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, dim, generator=gen)
    w_true = torch.randn(dim, generator=gen)
    logits = x @ w_true + noise * torch.randn(samples, generator=gen)
    return SimpleDataset(x, (logits > 0).float())


def make_loader(dataset: Dataset, batch_size: int, rank: int, world_size: int, seed: int,
                drop_last: bool = False) -> tuple[DataLoader, DistributedSampler]:
    """A DataLoader over this rank's shard; call sampler.set_epoch(epoch) before each epoch."""
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=seed, drop_last=drop_last)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler), sampler


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

    @property
    def equivalent_to_large_batch(self) -> bool:
        """True when W ranks x batch B see exactly what one process with batch W*B sees."""
        return self.samples % (self.world_size * self.batch_size) == 0

    def explain(self) -> str:
        """One sentence on what differs from one process with the global batch, or that nothing does."""
        if self.equivalent_to_large_batch:
            return (f"{self.samples} samples divide into global batches of {self.world_size}x{self.batch_size}: "
                    "identical to one process with the global batch.")
        parts = []
        if self.padded:
            parts.append(f"the sampler pads {self.padded} repeated sample(s) so every rank gets {self.per_rank}")
        if self.last_batch != self.batch_size:
            parts.append(f"each rank's last batch has {self.last_batch} sample(s), not {self.batch_size}")
        return ("not identical to one process with the global batch: " + "; ".join(parts) + ".")


def shard_plan(samples: int, world_size: int, batch_size: int) -> ShardPlan:
    """The DistributedSampler arithmetic (drop_last=False) for one epoch."""
    per_rank = math.ceil(samples / world_size)
    steps = math.ceil(per_rank / batch_size)
    last = per_rank - (steps - 1) * batch_size
    return ShardPlan(samples, world_size, batch_size, per_rank, per_rank * world_size - samples, steps, last)
