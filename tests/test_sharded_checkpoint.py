"""dp_helpers.scratch.sharding.checkpoint: a DDP or FSDP2 run saved on 2 ranks resumes on 3 and on 1 and ends as one process.

The ranks run scripts/hsdp_reshard.py's first_half() and second_half(), the code notebook 10 launches.
"""

import pytest
import torch

from dp_helpers.scripts.hsdp_reshard import KINDS, first_half, second_half, uninterrupted


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_saved_on_two_ranks_resumed_on_three_and_on_one_ends_as_one_process(pools, tmp_path, kind):
    folder = str(tmp_path / "checkpoint")
    pools.get(2).run(first_half, kind, folder)
    reference = uninterrupted()
    for world in (3, 1):  # resharded: 3 ranks read pieces of 2 ranks' shards; 1 rank reads them all
        for rank, weights in enumerate(pools.get(world).run(second_half, kind, folder)):
            torch.testing.assert_close(weights, reference, rtol=1e-5, atol=1e-6,
                                       msg=lambda m, w=world, r=rank: f"{w} ranks, rank {r}: {m}")
