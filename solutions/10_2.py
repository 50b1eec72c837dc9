"""Notebook 10, exercise 2: the share of DDP's bytes per step that DiLoCo sends with H = 32 on 64 ranks."""

from dp_helpers.course.checkers.exercises import check_answer

answer_2 = 1 / 32  # the parameters (as many values as the gradients) once per 32 steps; the number of ranks cancels
assert check_answer("10 DiLoCo share of DDP's bytes at H = 32", answer_2)
