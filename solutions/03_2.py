"""Notebook 03, exercise 2: the MB each of 8 ranks sends for 100 MB with the ring and with the naive ring."""

from dp_helpers.course.checkers.exercises import check_answer
from dp_helpers.scratch.collectives.ring import naive_ring_bytes, ring_bytes

answer_2 = {"ring": 175.0, "naive": 700.0}  # 2 x 7/8 x 100 MB and 7 x 100 MB
assert check_answer("03 naive and ring MB for 100 MB on 8", answer_2)
assert answer_2 == {"ring": ring_bytes(25_000_000, 4, 8, 0) / 1e6, "naive": naive_ring_bytes(25_000_000, 4, 8) / 1e6}
