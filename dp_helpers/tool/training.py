"""The training step shared by the DDP script and the single-process reference (run in notebook 03; notebook 05 teaches accumulation with a plain-torch script; mixed precision in 09)."""

from __future__ import annotations

import contextlib
import random

import torch
from torch import nn

PRECISIONS = ("fp32", "fp16", "bf16")


def seed_everything(seed: int) -> None:
    """Seed Python's and torch's global RNGs with the same value on every rank (data and model use their own seeded generators)."""
    random.seed(seed)
    torch.manual_seed(seed)


def bce_loss(probs: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Binary cross-entropy of a sigmoid model's outputs (probabilities) against 0/1 targets of any matching size."""
    # mean reduction: DDP averages gradients across ranks, so the mean of equal-sized shards' means is the global mean
    try:
        return nn.functional.binary_cross_entropy(probs, targets.reshape(probs.shape), reduction=reduction)
    except RuntimeError as exc:  # "all elements of input should be between 0 and 1": a NaN output, said plainly
        if torch.isnan(probs).any():
            raise FloatingPointError("the model's output became NaN: training diverged (too large a learning rate?)") \
                from exc
        raise


def make_optimizer(model: nn.Module, lr: float, momentum: float = 0.0) -> torch.optim.Optimizer:
    """SGD, plain as in the source article unless momentum > 0 (then the optimizer has state a checkpoint must keep)."""
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)


def train_step(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
               optimizer: torch.optim.Optimizer, after_backward=None, loss_fn=bce_loss) -> torch.Tensor:
    """One SGD step on a mean loss (BCE unless told), calling after_backward(model) between backward and step."""
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model(inputs), targets)
    loss.backward()
    if after_backward is not None:
        after_backward(model)
    optimizer.step()
    return loss.detach()


def accumulate_step(model: nn.Module, micro_batches: list, optimizer: torch.optim.Optimizer,
                    no_sync=None, after_backward=None, loss_fn=bce_loss) -> torch.Tensor:
    """One optimizer step over K micro-batches, each mean loss weighted by its share of the samples; under DDP only the last syncs."""
    optimizer.zero_grad(set_to_none=True)
    total, k, samples = torch.zeros(()), len(micro_batches), sum(len(targets) for _, targets in micro_batches)
    for j, (inputs, targets) in enumerate(micro_batches):
        # no_sync: gradients accumulate locally, the all-reduce waits for the last micro-batch
        quiet = no_sync() if (no_sync is not None and j < k - 1) else contextlib.nullcontext()
        with quiet:
            # n_j / N, not 1 / K: the shares add up to the mean over all N samples, a short last micro-batch included
            loss = loss_fn(model(inputs), targets) * (len(targets) / samples)
            loss.backward()
        total = total + loss.detach().cpu()
    if after_backward is not None:
        after_backward(model)
    optimizer.step()
    return total


def loss_gradients(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """The gradient of the mean BCE loss on this batch, per parameter name (model.grad is left zeroed)."""
    model.zero_grad(set_to_none=True)
    bce_loss(model(inputs), targets).backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return grads


def precision_problem(device: torch.device, precision: str) -> str | None:
    """Why `precision` cannot run on `device` (one sentence), or None when it can."""
    if precision not in PRECISIONS:
        return f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}."
    # native bfloat16 arithmetic starts with compute capability 8.0 (Ampere); older GPUs only emulate it, slowly
    if precision == "bf16" and device.type != "cpu" and torch.cuda.get_device_capability(device) < (8, 0):
        return f"{torch.cuda.get_device_name(device)} has no native bfloat16 (compute capability < 8.0)."
    return None


def autocast(device: torch.device, precision: str):
    """The autocast region for fp16/bf16 (a no-op for fp32): matmuls run in the low precision, reductions in fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.float16 if precision == "fp16" else torch.bfloat16)


def grad_scaler(device: torch.device, precision: str) -> torch.amp.GradScaler:
    """A GradScaler, enabled for fp16 only: fp16 gradients underflow without it, bf16 has fp32's range."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")


def mixed_precision_step(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                         optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                         precision: str) -> torch.Tensor:
    """train_step under autocast with loss scaling; fp32 with a disabled scaler is exactly train_step."""
    optimizer.zero_grad(set_to_none=True)
    with autocast(inputs.device, precision):
        outputs = model(inputs)
    # binary_cross_entropy is unsafe in fp16 (autocast refuses it on GPUs): compute it in fp32, outside
    loss = bce_loss(outputs.float(), targets)
    scaler.scale(loss).backward()
    scaler.step(optimizer)  # unscales first; skips the step if a gradient is inf/nan
    scaler.update()
    return loss.detach()


def train_steps(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, steps: int, lr: float,
                precision: str | None = None) -> nn.Module:
    """`steps` full-batch SGD steps: train_step when precision is None, else mixed_precision_step (notebook 09)."""
    optimizer, scaler = make_optimizer(model, lr), grad_scaler(inputs.device, precision or "fp32")
    for _ in range(steps):
        if precision is None:
            train_step(model, inputs, targets, optimizer)
        else:
            mixed_precision_step(model, inputs, targets, optimizer, scaler, precision)
    return model


def layout_change(state: dict, world_size: int, batch_size: int, grad_accum_steps: int) -> dict | None:
    """How a resumed run's layout differs from its checkpoint's (world size, batch, accumulation), or None if alike."""
    theirs = {k: state.get(k, v) for k, v in (("world_size", world_size), ("batch_size", batch_size),
                                              ("grad_accum_steps", grad_accum_steps))}
    if theirs == {"world_size": world_size, "batch_size": batch_size, "grad_accum_steps": grad_accum_steps}:
        return None
    return {**theirs, "global_batch_size": theirs["world_size"] * theirs["batch_size"] * theirs["grad_accum_steps"],
            "epoch": int(state["epoch"])}
