"""Notebook 06, exercise 1: the statistics BatchNorm normalises with, per rank and synchronised."""

import torch

from dp_helpers.course.checkers.exercises import check_answer

own, both = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 3.0, 5.0, 7.0, 9.0])
answer_1 = {"rank 0 mean": own.mean().item(), "rank 0 variance": own.var(unbiased=False).item(),  # 2 and 2/3
            "global mean": both.mean().item(), "global variance": both.var(unbiased=False).item()}  # 4.5 and 7.92
assert check_answer("06 BatchNorm statistics of [1, 2, 3] and [5, 7, 9]", answer_1)
