"""Notebook 01, exercise 3: the sample DistributedSampler repeats for 11 samples on 4 ranks, and who gets it."""

from dp_helpers.course.checkers.exercises import check_answer

answer_3 = {"samples": [0], "ranks": [0, 3]}  # 12 slots: index 0 fills slot 11 = rank 3's last; rank 0 had it first
assert check_answer("01 repeated sample of 11 on 4", answer_3)
