"""Notebook 09, exercise 3: the most the emulated DataParallel reaches with a third of a step parallel (Amdahl)."""

from dp_helpers.course.checkers.exercises import check_answer

answer_3 = 1.5  # 1 / ((1 - f) + f / N) -> 1 / (1 - f) = 1 / (2/3) as N grows
assert check_answer("09 DataParallel emulation limit at f = 1/3", answer_3)
