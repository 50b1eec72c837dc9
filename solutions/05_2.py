"""Notebook 05, exercise 2: DDP's buckets for the wide MLP at bucket_cap_mb=2, after the rebuild."""

from dp_helpers.course.checkers.exercises import check_answer

# ready order, head first: head bias, head weight (tiny), then each 512-wide layer's bias (2 KiB) and weight (1 MiB).
# A bucket closes at the first tensor that crosses 2 MiB: head bias, head weight, bias, 1 MiB, bias, 1 MiB -> 6 tensors
# (2.01 MiB); the next bucket again takes two layers (2.00 MiB), the last the rest (1.5 MiB): 3 all-reduces a step.
answer_2 = {"all-reduces per step": 3, "tensors in the first bucket": 6}
assert check_answer("05 buckets of the wide MLP at bucket_cap_mb=2", answer_2)
