"""Notebook 00, exercise 3: what an all-reduce (a sum, by default) leaves on every rank."""

from dp_helpers.course.checkers.exercises import check_answer

answer_3 = [10 + 6, 16 + 16]  # the sum over the ranks, on every rank: the loss sum and the sample count of both
assert check_answer("00 rank 1's total after the all-reduce", answer_3)
