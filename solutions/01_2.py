"""Notebook 01, exercise 2: how many of 8 devices get work for a batch of 9."""

from dp_helpers.course.checkers.exercises import check_answer

answer_2 = 5  # ceil(9 / 8) = 2 rows per piece: 2, 2, 2, 2, 1 -- three GPUs idle
assert check_answer("01 devices with work for 9 on 8", answer_2)
