"""Notebook 10, exercise 1: how many times fewer values PowerSGD at rank 8 sends for a 4096 x 4096 gradient."""

from dp_helpers.course.checkers.exercises import check_answer

answer_1 = 256.0  # DDP: 4096 * 4096 values; PowerSGD: P and Q, (4096 + 4096) * 8; the ratio is 4096 / 16
assert check_answer("10 PowerSGD saving for a 4096 x 4096 matrix at rank 8", answer_1)
