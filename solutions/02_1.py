"""Notebook 02, exercise 1: the bytes DataParallel copies per forward to replicate 1e6 parameters on 4 devices."""

from torch import nn

from dp_helpers.course.checkers.exercises import check_answer
from dp_helpers.scratch.dataparallel import scatter_gather as dp

answer_1 = 3 * 1_000_000 * 4  # (4 - 1) copies x 1e6 parameters x 4 bytes; device 0 keeps the original
assert check_answer("02 bytes replicated for 1e6 on 4", answer_1)
assert answer_1 == dp.replication_bytes(nn.Linear(1000, 1000, bias=False), 4)
