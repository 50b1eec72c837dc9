"""Notebook 06, exercise 3: an exact mean over every validation sample, each scored once across the ranks."""

import torch

from dp_helpers.course.checkers.exercises import check_exact_eval


def my_exact_mean(samples, score, rank, world_size, all_reduce):
    mine = range(rank, samples, world_size)  # rank r scores r, r + W, ...: every sample once, no padding
    totals = torch.tensor([sum(score(i) for i in mine), len(mine)], dtype=torch.float64)
    all_reduce(totals)  # every rank calls it, also one with no samples
    return (totals[0] / totals[1]).item()  # divide once, at the end


assert check_exact_eval(my_exact_mean)
