"""Single-process reference training, the yardstick every parallel run is checked against (taught in notebook 03)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .config import TrainConfig
from .data import make_loader
from .models import build_model
from .tasks import loss_function, train_set
from .training import make_optimizer, seed_everything, train_step


@dataclass
class ReferenceResult:
    """The reference model's final weights and its loss at every step."""

    state_dict: dict[str, torch.Tensor]
    losses: list[float]


def train_reference(cfg: TrainConfig, world_size: int = 1) -> ReferenceResult:
    """Train in this process with the global batch world_size * cfg.batch_size, over the same permutation DDP uses."""
    cfg = replace(cfg, batch_size=world_size * cfg.batch_size)
    seed_everything(cfg.seed)
    model = build_model(cfg.model, cfg.dim, cfg.seed)
    loader, sampler = make_loader(train_set(cfg), cfg.batch_size, rank=0, world_size=1, seed=cfg.seed)
    optimizer, losses = make_optimizer(model, cfg.lr, cfg.momentum), []
    for epoch in range(cfg.epochs):
        sampler.set_epoch(epoch)
        losses += [train_step(model, x, y, optimizer, loss_fn=loss_function(cfg)).item() for x, y in loader]
    return ReferenceResult({k: v.detach().clone() for k, v in model.state_dict().items()}, losses)
