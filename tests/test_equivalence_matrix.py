"""Every data-parallel strategy against one process on the global batch, case by case, on 1 to 4 ranks.

The cases are what a user's own model and loop bring (tests/matrix.py): tied weights, a weight used outside its
module (a GPT's tied head), activation checkpointing (reentrant or not), frozen parameters, a
parameter unused in some steps, an output the loss ignores, an unused parameter inside a layer, a parameter some
ranks use and others not, a short last batch, accumulation over unequal micro-batches normalised by the step's
sample count, AdamW with weight decay, clipping by the global norm, Adafactor (not elementwise: refused by the
strategies that shard into 1-D chunks, and by fully_shard's DTensors).
Tolerances, per cell: on 1 rank every strategy is bitwise one process (rtol = atol = 0), but for clipping, where our
ZeRO stages sum the squares of their chunks and torch takes the norm of per-tensor norms (ZeRO-3: 1e-8 seen); on 2-4 ranks a
float32 sum over ranks runs in another order than one sum over the batch, so rtol 1e-6 and atol 1e-7 (3e-8 seen).
"""

import pytest
import torch

from tests import matrix

# what a strategy refuses, with its own message: the matrix says so instead of leaving the cell out
REFUSED = {("fully_shard", "tied weights"): "is shared with a parameter already managed by another FSDP group",
           # a unit of its own per module: the head reads the first layer's DTensor shard outside that module's
           # forward. FSDP2's way is to leave that layer in the root's group (fully_shard the blocks, then the root)
           ("fully_shard", "a weight used outside its module (a tied head)"): "got mixed torch.Tensor and DTensor",
           # torch 2.13's DTensor refuses Adafactor's in-place row and column statistics on dim-0 shards
           ("fully_shard", "Adafactor, not elementwise"): "in-place operations that require placement changes",
           **{(ours, "Adafactor, not elementwise"): "Adafactor is not among them"
              for ours in ("ZeRO-1 (ours)", "ZeRO-2 (ours)", "ZeRO-3 (ours)")}}


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, *(pytest.param(w, marks=pytest.mark.long) for w in (3, 4))])
def test_every_strategy_equals_one_process_in_every_case(pools, world):
    ranks = pools.get(world).run(matrix.every_cell)
    exact = {"rtol": 0, "atol": 0} if world == 1 else {"rtol": 1e-6, "atol": 1e-7}
    references = {case: matrix.reference(case) for case in matrix.CASES}
    for (strategy, case), got in ranks[0].items():
        if (strategy, case) in REFUSED:
            assert REFUSED[strategy, case] in got.get("error", ""), (strategy, case, got)
            continue
        for rank, result in enumerate(ranks):
            assert "error" not in result[strategy, case], (strategy, case, rank, result[strategy, case])
            tolerance = exact if exact["atol"] or case != "clipping by the global norm" else {"rtol": 1e-6, "atol": 1e-7}
            torch.testing.assert_close(result[strategy, case]["weights"], references[case], **tolerance,
                                       msg=lambda m, s=strategy, c=case, r=rank: f"{s}, {c}, rank {r}/{world}: {m}")
