"""A training step's time from its compute and its collectives on a ring (taught in notebook 04, fitted in 09).

Supports: DDP's bucket all-reduces issued after the backward or overlapped with it, on one serial link; a fit of
the ring's latency alpha and bandwidth beta to measured all-reduce times. Assumes what it says: a bucket's gradients
take a share of the backward proportional to their bytes, and the link carries one collective at a time. Refuses
nothing it cannot compute; it does not model contention between ranks for CPU or memory, or a GPU's streams.
"""

from __future__ import annotations

import torch

from dp_helpers.scratch.collectives.ring import ring_time


def fit_alpha_beta(nbytes: list[float], seconds: list[float], world_size: int) -> tuple[float, float]:
    """Least-squares alpha (s per step) and beta (bytes/s) of the ring model to measured all-reduce times."""
    steps, share = 2 * (world_size - 1), 2 * (world_size - 1) / world_size
    a = torch.tensor([[steps, share * n] for n in nbytes], dtype=torch.float64)
    (alpha, inverse_beta), = torch.linalg.lstsq(a, torch.tensor(seconds, dtype=torch.float64)[:, None]).solution.T
    return max(float(alpha), 0.0), 1 / float(inverse_beta)


def after_backward(compute: float, buckets: list[int], world_size: int, alpha: float, beta: float) -> float:
    """Seconds per step when every all-reduce starts once the backward is done: compute, then the link."""
    return compute + sum(ring_time(b, world_size, alpha, beta) for b in buckets)


def overlapped(forward: float, backward: float, buckets: list[int], world_size: int, alpha: float,
               beta: float) -> float:
    """Seconds per step when each bucket (in the order it fills) is all-reduced as soon as its gradients exist."""
    ready = link_free = forward
    total = sum(buckets)
    for size in buckets:
        ready += backward * size / total  # its share of the backward
        link_free = max(ready, link_free) + ring_time(size, world_size, alpha, beta)
    return max(forward + backward, link_free)
