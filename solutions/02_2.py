"""Notebook 02, exercise 2: whether the mean of 8 shard means is the batch's mean loss."""

from dp_helpers.course.checkers.exercises import check_answer

answer_2 = False  # shards of 4,4,4,4,4,4,4,2 rows: the plain mean over-weights the 2-row shard (notebook 01)
assert check_answer("02 mean of shard means is the batch loss", answer_2)
