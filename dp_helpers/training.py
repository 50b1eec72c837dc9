"""The training step shared by the DDP script and the single-process reference (taught in notebooks 03 and 04)."""

from __future__ import annotations

import contextlib

import torch
from torch import nn


def make_optimizer(model: nn.Module, lr: float, momentum: float = 0.0) -> torch.optim.Optimizer:
    """SGD, plain as in the seed unless momentum > 0 (then the optimizer has state a checkpoint must keep)."""
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)


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


def accumulate_step(model: nn.Module, micro_batches: list, optimizer: torch.optim.Optimizer,
                    no_sync=None, after_backward=None) -> torch.Tensor:
    """One optimizer step over K micro-batches of loss/K; with DDP only the last backward synchronises."""
    optimizer.zero_grad(set_to_none=True)
    total, k = torch.zeros(()), len(micro_batches)
    for j, (inputs, targets) in enumerate(micro_batches):
        # no_sync: gradients accumulate locally, the all-reduce waits for the last micro-batch
        quiet = no_sync() if (no_sync is not None and j < k - 1) else contextlib.nullcontext()
        with quiet:
            outputs = model(inputs)
            loss = nn.functional.binary_cross_entropy(outputs, targets.unsqueeze(1)) / k
            loss.backward()
        total = total + loss.detach().cpu()
    if after_backward is not None:
        after_backward(model)
    optimizer.step()
    return total


def loss_gradients(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """The gradient of the mean BCE loss on this batch, per parameter name (model.grad is left zeroed)."""
    model.zero_grad(set_to_none=True)
    nn.functional.binary_cross_entropy(model(inputs), targets.unsqueeze(1)).backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return grads
