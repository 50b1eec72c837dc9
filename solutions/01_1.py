"""Notebook 01, exercise 1: rows per device when DataParallel scatters 17 rows over 5 devices."""

from dp_helpers.course.checkers.exercises import check_answer

answer_1 = [4, 4, 4, 4, 1]  # ceil(17 / 5) = 4 rows per piece; the last piece gets what is left
assert check_answer("01 rows for 17 on 5", answer_1)
