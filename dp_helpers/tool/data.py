"""The source article's dataset, synthetic data whose labels depend on the features, the digits split, and the sampler arithmetic (notebooks 01, 06, 07)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from dp_helpers.tool.request import DIGITS_HELD_OUT, UsageError


class SimpleDataset(Dataset):
    """The source article's dataset: pairs of feature rows and targets."""

    def __init__(self, data: torch.Tensor, target: torch.Tensor):
        if len(data) != len(target):
            raise UsageError(f"data has {len(data)} rows but target has {len(target)}.")
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


def chunk_sizes(rows: int, n_devices: int) -> list[int]:
    """Rows per device under DataParallel's scatter rule, torch.chunk: ceil(rows/n) each, maybe fewer pieces."""
    return [len(c) for c in torch.arange(rows).chunk(n_devices)]


def sampler_indices(samples: int, world_size: int, epoch: int = 0, seed: int = 0, shuffle: bool = True,
                    drop_last: bool = False, set_epoch: bool = True) -> list[list[int]]:
    """The sample indices DistributedSampler gives each rank in one epoch (no process group needed)."""
    table = []
    for rank in range(world_size):
        sampler = DistributedSampler(range(samples), num_replicas=world_size, rank=rank, shuffle=shuffle,
                                     seed=seed, drop_last=drop_last)
        if set_epoch:
            sampler.set_epoch(epoch)
        table.append(list(sampler))
    return table


def digits_arrays():
    """scikit-learn's bundled digits as load_digits(return_X_y=True) gives them: 1,797 rows of 64 pixels 0..16, labels."""
    # read from scikit-learn's own file when it is where load_digits reads it: importing scikit-learn costs each
    # process that loads the digits about 0.75 s of CPU, as much as importing torch
    spec = importlib.util.find_spec("sklearn")
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec and spec.origin else None
    if path is not None and path.is_file():
        import numpy as np

        data = np.loadtxt(path, delimiter=",")
        return data[:, :-1], data[:, -1].astype(int)
    from sklearn.datasets import load_digits

    return load_digits(return_X_y=True)


def load_digits_split(part: str) -> SimpleDataset:
    """scikit-learn's bundled 8x8 digits (no download): images (N, 1, 8, 8) in [0, 1], labels 0-9; a fixed split."""
    images, labels = digits_arrays()
    x = torch.tensor(images, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16
    y = torch.tensor(labels, dtype=torch.int64)
    # one fixed permutation, whatever --seed says: every run is scored on the same held-out images
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    rows = {"held_out": order[:DIGITS_HELD_OUT], "train": order[DIGITS_HELD_OUT:]}[part]
    return SimpleDataset(x[rows], y[rows])
