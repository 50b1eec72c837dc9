"""Notebook 10, exercise 3: PowerSGD's rank-r picture of one matrix, on one rank."""

import torch

from dp_helpers.course.checkers.exercises import check_low_rank


def my_low_rank(m, q):
    p = torch.linalg.qr(m @ q).Q  # orthonormal columns spanning M Q; any sign of them gives the same picture
    return p @ (m.T @ p).T  # P Q^T with Q = M^T P


assert check_low_rank(my_low_rank)
