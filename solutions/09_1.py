"""Notebook 09, exercise 1: the naive ring's time in the alpha-beta model, and which ring wins when."""

from dp_helpers.course.checkers.exercises import check_answer, check_naive_ring_time
from dp_helpers.scratch.collectives.ring import ring_time


def my_naive_ring_time(nbytes, world_size, latency, bandwidth):
    return (world_size - 1) * (latency + nbytes / bandwidth)  # N-1 hops, each a latency plus the whole tensor


assert check_naive_ring_time(my_naive_ring_time)
# half the latency terms, N/2 times the bytes: tiny messages favour the naive ring, large ones the ring
wins = {size: "naive" if my_naive_ring_time(n, 8, 10e-6, 10e9) < ring_time(n, 8, 10e-6, 10e9) else "ring"
        for size, n in (("8 B", 8), ("100 MB", 100e6))}
assert check_answer("09 faster ring on 8 ranks at 10 us and 10 GB/s", wins)
