"""Single-process reference training, the yardstick every parallel run is checked against (taught in notebook 03)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from dp_helpers.tool.config import TrainConfig
from dp_helpers.tool.data import make_loader
from dp_helpers.tool.env import worker_numerics
from dp_helpers.tool.models import build_model
from dp_helpers.tool.tasks import held_out_scores, held_out_set, loss_function, train_set
from dp_helpers.tool.training import make_optimizer, seed_everything, train_step


@dataclass
class ReferenceResult:
    """The reference model's final weights, its loss at every step and (digits) its held-out accuracy after every epoch."""

    state_dict: dict[str, torch.Tensor]
    losses: list[float]
    held_out_accuracy: list[float] = field(default_factory=list)


@worker_numerics()  # the workers' thread count: another may sum a kernel in another order, on some CPUs visibly
def train_reference(cfg: TrainConfig, world_size: int = 1) -> ReferenceResult:
    """Train in this process with the global batch world_size * cfg.batch_size, over the same permutation DDP uses."""
    cfg = replace(cfg, batch_size=world_size * cfg.batch_size)
    seed_everything(cfg.seed)
    model = build_model(cfg.model, cfg.dim, cfg.seed)
    loader, sampler = make_loader(train_set(cfg), cfg.batch_size, rank=0, world_size=1, seed=cfg.seed)
    optimizer, losses, held_out, accuracy = make_optimizer(model, cfg.lr, cfg.momentum), [], held_out_set(cfg), []
    for epoch in range(cfg.epochs):
        sampler.set_epoch(epoch)
        losses += [train_step(model, x, y, optimizer, loss_fn=loss_function(cfg)).item() for x, y in loader]
        if held_out is not None:
            accuracy.append(held_out_scores(model, held_out, world_size=1, rank=0)["accuracy"])
    return ReferenceResult({k: v.detach().clone() for k, v in model.state_dict().items()}, losses, accuracy)
