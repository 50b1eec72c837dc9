"""Notebook 07, exercise 1: where a resumed run starts counting steps, and how many it takes."""

from dp_helpers.course.checkers.exercises import check_answer

per_epoch = 100 // (2 * 10)  # 50 samples per rank in batches of 10: 5 optimizer steps per epoch
answer_1 = {"resumes at step": 3 * per_epoch, "steps after resuming": (6 - 3) * per_epoch}
assert check_answer("07 steps when resuming after 3 of 6 epochs", answer_1)
