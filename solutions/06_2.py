"""Notebook 06, exercise 2: samples evaluated, and repeated, for 10 on 4 ranks."""

from dp_helpers.course.checkers.exercises import check_answer

answer_2 = {"evaluated": 12, "twice": [0, 1]}  # 4 x ceil(10 / 4) = 12 slots, padded with indices 0 and 1
assert check_answer("06 evaluated and repeated for 10 on 4", answer_2)
