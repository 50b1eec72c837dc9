"""Notebook 09, exercise 2: whether efficiency rises or falls when the communication time grows."""

from dp_helpers.course.checkers.exercises import check_answer

answer_2 = "lower"  # E = t_comp / (t_comp + t_comm): the denominator grows, the numerator does not
assert check_answer("09 efficiency when t_comm grows", answer_2)
