"""A training step's time from its compute and its collectives on a ring (taught in notebook 04, fitted in 09).

Supports: DDP's bucket all-reduces issued after the backward or overlapped with it, and ZeRO-3's gathers and
reduce-scatters with or without prefetching, each collective holding the link for a fixed time too (notebook 08), all
on one serial link; a fit of the ring's latency alpha and bandwidth beta to measured all-reduce times. Assumes what it
says: a bucket's gradients take a share of the backward proportional to their bytes, and the link carries one
collective at a time. Refuses nothing it cannot compute; not modelled: contention for CPU or memory, a GPU's streams.
"""

from __future__ import annotations

import torch

from dp_helpers.scratch.collectives.ring import collective_time, ring_time


def fit_alpha_beta(nbytes: list[float], seconds: list[float], world_size: int) -> tuple[float, float]:
    """Least-squares alpha (s per step) and beta (bytes/s) of the ring model to measured all-reduce times."""
    steps, share = 2 * (world_size - 1), 2 * (world_size - 1) / world_size
    a = torch.tensor([[steps, share * n] for n in nbytes], dtype=torch.float64)
    (alpha, inverse_beta), = torch.linalg.lstsq(a, torch.tensor(seconds, dtype=torch.float64)[:, None]).solution.T
    return max(float(alpha), 0.0), 1 / float(inverse_beta)


class SerialLink:
    """One collective at a time: each starts once it is issued and the link is free."""

    def __init__(self):
        self.free = 0.0

    def send(self, issued: float, seconds: float) -> float:
        """When a collective issued at `issued` that takes `seconds` is done."""
        self.free = max(issued, self.free) + seconds
        return self.free


def after_backward(compute: float, buckets: list[int], world_size: int, alpha: float, beta: float) -> float:
    """Seconds per step when every all-reduce starts once the backward is done: compute, then the link."""
    return compute + sum(ring_time(b, world_size, alpha, beta) for b in buckets)


def overlapped(forward: float, backward: float, buckets: list[int], world_size: int, alpha: float,
               beta: float) -> float:
    """Seconds per step when each bucket (in the order it fills) is all-reduced as soon as its gradients exist."""
    link, ready, total = SerialLink(), forward, sum(buckets)
    for size in buckets:
        ready += backward * size / total  # its share of the backward
        link.send(ready, ring_time(size, world_size, alpha, beta))
    return max(forward + backward, link.free)


def through_units(start: float, order: list[int], compute: list[float], gather: list[float], link: SerialLink,
                  prefetch: bool, scatter: list[float] | None = None) -> float:
    """When a pass over the units in `order` ends: each waits for its gather, computes, then sends its scatter."""
    t, done = start, link.send(start, gather[order[0]])
    for i, k in enumerate(order):
        t, following = max(t, done), order[i + 1] if i + 1 < len(order) else None
        if prefetch and following is not None:  # the next unit's gather leaves while this one computes
            done = link.send(t, gather[following])
        t += compute[k]
        if scatter is not None:
            link.send(t, scatter[k])
        if not prefetch and following is not None:  # asked for only when the next unit starts
            done = link.send(t, gather[following])
    return t


def zero3_step(forward: float, backward: float, units: list[int], world_size: int, alpha: float, beta: float,
               prefetch: bool = True, overhead: float = 0.0) -> float:
    """Seconds of a ZeRO-3 forward and backward: each unit (bytes) gathered for both, reduce-scattered after its backward."""
    # overhead: seconds each collective holds the link besides its ring time (behind notebook 04's emulated link,
    # gloo's own collective runs first, then the ring's time)
    total, link = sum(units), SerialLink()
    gather = [overhead + collective_time("all_gather", n, world_size, alpha, beta) for n in units]
    scatter = [overhead + collective_time("reduce_scatter", n, world_size, alpha, beta) for n in units]
    order = list(range(len(units)))
    t = through_units(0.0, order, [forward * n / total for n in units], gather, link, prefetch)
    t = through_units(t, order[::-1], [backward * n / total for n in units], gather, link, prefetch, scatter)
    return max(t, link.free)
