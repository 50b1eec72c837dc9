"""Notebook 05, exercise 1: gradient accumulation under no_sync equal to one step on the whole batch."""

import contextlib

import torch

from dp_helpers.course.checkers.exercises import check_accumulate


def my_accumulate(model, micro_batches, optimizer, no_sync):
    optimizer.zero_grad()  # the previous step's gradients must not leak into this one
    total = sum(len(inputs) for inputs, _ in micro_batches)
    for j, (inputs, targets) in enumerate(micro_batches):
        last = j == len(micro_batches) - 1
        with contextlib.nullcontext() if last else no_sync():  # the forward inside too
            loss = torch.nn.functional.binary_cross_entropy(model(inputs), targets.unsqueeze(1))
            (loss * len(inputs) / total).backward()  # weighted by size: the mean over the whole batch
    optimizer.step()


assert check_accumulate(my_accumulate)
