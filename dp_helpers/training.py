"""The training step shared by the DDP script and the single-process reference (taught in notebook 03)."""

from __future__ import annotations

import torch
from torch import nn


def make_optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """Plain SGD, as in the seed."""
    return torch.optim.SGD(model.parameters(), lr=lr)


def train_step(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
               optimizer: torch.optim.Optimizer, after_backward=None) -> torch.Tensor:
    """One SGD step on a mean BCE loss, calling after_backward(model) between backward and step; returns the loss."""
    optimizer.zero_grad(set_to_none=True)
    outputs = model(inputs)
    # mean reduction: DDP averages gradients across ranks, so mean-of-means == global mean
    loss = nn.functional.binary_cross_entropy(outputs, targets.unsqueeze(1))
    loss.backward()
    if after_backward is not None:
        after_backward(model)
    optimizer.step()
    return loss.detach()


def loss_gradients(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """The gradient of the mean BCE loss on this batch, per parameter name (model.grad is left zeroed)."""
    model.zero_grad(set_to_none=True)
    nn.functional.binary_cross_entropy(model(inputs), targets.unsqueeze(1)).backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return grads
