"""Notebook 05, exercise 3: MB each rank sends per step in a ring all-reduce, fp32 and fp16 gradients."""

from dp_helpers.course.checkers.exercises import check_answer

# 25e6 gradients x 4 bytes = 100 MB; the ring sends 2 (W - 1) / W of it: 2 x 7 / 8 x 100 = 175 MB; fp16 halves it
answer_3 = {"fp32": 2 * 7 / 8 * 100, "fp16": 2 * 7 / 8 * 50}
assert check_answer("05 ring MB per rank for 25e6 gradients on 8", answer_3)
