"""Notebook 04, exercise 2: all-reduces per step for gradients of 4, 1, 1, 4, 0.5 MiB under a 5 MiB cap."""

from dp_helpers.course.checkers.exercises import check_answer

answer_2 = 2  # last layer first: 0.5 + 4 + 1 crosses 5 MiB, then 1 + 4 reaches it (first layer first would give 3)
assert check_answer("04 all-reduces per step for 4,1,1,4,0.5 MiB at 5", answer_2)
