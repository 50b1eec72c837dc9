"""Notebook 08, exercise 2: GB per rank for 1e9 parameters, fp32 Adam, ZeRO-2 on 8."""

from dp_helpers.course.checkers.exercises import check_answer

answer_2 = 5.5  # parameters 4 GB in full; gradients 4/8 and Adam's state 8/8 GB: 4 + 0.5 + 1
assert check_answer("08 GB per rank for 1e9 parameters, ZeRO-2 on 8", answer_2)
