"""Notebook 11, exercise 1: the MB one Streaming DiLoCo synchronisation sends for 1e9 fp32 parameters in 4 fragments."""

from dp_helpers.course.checkers.exercises import check_answer

answer_1 = 10**9 * 4 / 4 / 1e6  # 4 bytes a value, a quarter of the values per synchronisation, in MB: 1000
assert check_answer("11 Streaming DiLoCo's MB per synchronisation for 1e9 fp32 parameters in 4 fragments", answer_1)
