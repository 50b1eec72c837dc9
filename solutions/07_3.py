"""Notebook 07, exercise 3: the epoch a restarted group starts at when nothing was saved."""

from dp_helpers.course.checkers.exercises import check_answer

answer_3 = 1  # torchrun starts fresh processes; with no snapshot they know nothing of epochs 1-4 and start over
assert check_answer("07 epoch a restart without --checkpoint starts at", answer_3)
