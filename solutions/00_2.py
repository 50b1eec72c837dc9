"""Notebook 00, exercise 2: the one-device batch that 4 ranks of 8 equal."""

from dp_helpers.course.checkers.exercises import check_answer

answer_2 = 4 * 8  # every step, the 4 ranks together see 4 x 8 samples: the one-device batch
assert check_answer("00 one-device batch for 4 ranks of 8", answer_2)
