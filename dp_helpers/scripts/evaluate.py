"""Distributed evaluation two ways: over DistributedSampler's padded shards, and over exact shards (notebook 06)."""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from dp_helpers import dist as dph
from dp_helpers.data import make_synthetic, sampler_indices
from dp_helpers.models import build_model
from dp_helpers.training import bce_loss


def sums(model, data, indices: list[int], device) -> torch.Tensor:
    """[summed loss, correct predictions, samples] over these indices."""
    x, y = data.data[indices].to(device), data.target[indices].to(device)
    with torch.no_grad():
        p = model(x).squeeze(1)
    loss = bce_loss(p, y, reduction="sum")
    return torch.stack([loss, ((p > 0.5).float() == y).sum(), torch.tensor(float(len(indices)), device=device)])


def evaluate(samples: int, info: dph.DistInfo) -> dict:
    """Padded: average each rank's mean (what a sampler-based loop reports). Exact: all-reduce sums and counts."""
    data, model = make_synthetic(samples, 10, seed=0), build_model("linear", 10, seed=0).to(info.device)
    padded = sums(model, data, sampler_indices(samples, info.world_size, shuffle=False)[info.rank], info.device)
    means = torch.stack([padded[0] / padded[2], padded[1] / padded[2], padded[2]])
    dist.all_reduce(means)  # mean of the ranks' means, over samples that include repeats
    exact = sums(model, data, list(range(info.rank, samples, info.world_size)), info.device)
    dist.all_reduce(exact)  # sums and counts: no sample twice, any shard sizes
    w = info.world_size
    return {"padded": {"loss": (means[0] / w).item(), "accuracy": (means[1] / w).item(), "samples": int(means[2])},
            "exact": {"loss": (exact[0] / exact[2]).item(), "accuracy": (exact[1] / exact[2]).item(),
                      "samples": int(exact[2])}}


def main(info: dph.DistInfo) -> None:
    """Evaluate on every rank; rank 0 writes eval.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=10)
    args = parser.parse_args()
    dph.gather_to_file(info, evaluate(args.samples, info), "eval.json")


if __name__ == "__main__":
    dph.worker(main)
