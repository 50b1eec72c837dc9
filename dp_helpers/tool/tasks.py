"""What `train` learns: the source article's synthetic problem (BCE) or scikit-learn's digits (cross-entropy, held-out accuracy) (notebook 07)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from dp_helpers.tool.config import TrainConfig
from dp_helpers.tool.data import load_digits_split, make_synthetic
from dp_helpers.tool.training import bce_loss


def train_set(cfg: TrainConfig):
    """The training data: the synthetic samples, or the digits' fixed training split."""
    return load_digits_split("train") if cfg.data == "digits" else make_synthetic(cfg.samples, cfg.dim, cfg.seed)


def held_out_set(cfg: TrainConfig):
    """The digits' 297 held-out images (None for the synthetic task, which is scored by its training loss)."""
    return load_digits_split("held_out") if cfg.data == "digits" else None


def loss_function(cfg: TrainConfig):
    """Mean BCE on probabilities for the synthetic task, mean cross-entropy on logits for the digits' 10 classes."""
    return nn.functional.cross_entropy if cfg.data == "digits" else bce_loss


def held_out_scores(model: nn.Module, dataset, world_size: int, rank: int) -> dict:
    """Loss and accuracy over the whole held-out set: every rank scores a stride, the sums are all-reduced (a collective)."""
    rows = list(range(rank, len(dataset), world_size))  # every image exactly once: no sampler padding
    device, training = next(model.parameters()).device, model.training
    model.eval()  # no BatchNorm statistics or dropout while scoring
    with torch.no_grad():
        logits = model(dataset.data[rows].to(device)).double()
        targets = dataset.target[rows].to(device)
        sums = torch.stack([nn.functional.cross_entropy(logits, targets, reduction="sum"),
                            (logits.argmax(1) == targets).sum(), torch.tensor(len(rows), device=device)]).double()
    model.train(training)
    if world_size > 1:
        dist.all_reduce(sums)
    return {"loss": (sums[0] / sums[2]).item(), "accuracy": (sums[1] / sums[2]).item(), "samples": int(sums[2])}
