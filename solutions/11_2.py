"""Notebook 11, exercise 2: the steps every replica takes again when torchrun restarts from the step-1500 checkpoint."""

from dp_helpers.course.checkers.exercises import check_answer

answer_2 = 1740 - 1500  # steps 1501 to 1739 were done and are lost, and step 1740 never finished: 240
assert check_answer("11 steps every replica takes again after a restart from the step-1500 checkpoint", answer_2)
