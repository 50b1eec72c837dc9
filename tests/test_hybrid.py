"""dp_helpers.scratch.sharding.hybrid: hybrid sharding on 4 ranks (2 groups of 2) from scratch and as torch's HSDP, both one process.

The ranks run scripts/hsdp_reshard.py's hsdp(), the code notebook 10 launches.
"""

import pytest
import torch

from dp_helpers.scripts.hsdp_reshard import SHARD, STEPS, hsdp, model, uninterrupted


@pytest.mark.slow
def test_hybrid_sharding_from_scratch_and_torchs_hsdp_equal_one_process(pools):
    reference = uninterrupted()
    psi = sum(p.numel() for p in model().parameters())
    for rank, got in enumerate(pools.get(4).run(hsdp)):
        torch.testing.assert_close(got["ours"], reference, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got["torch"], reference, rtol=1e-5, atol=1e-6)
        # rank r shards with its neighbour in [0, 1] or [2, 3] and holds the same chunk as r +- 2, as torch's mesh
        assert got["groups"] == got["torch groups"] == [[rank // 2 * 2, rank // 2 * 2 + 1], [rank % 2, rank % 2 + 2]]
        assert got["placements"] == "(Replicate(), Shard(dim=0))" and got["local rows"] == 10 // SHARD
        chunk = -(-psi // SHARD)  # each rank's 1/S of the flat buffer, padded
        assert got["chunk"] == chunk
        # bytes handed to each collective per step: the full buffer within the group, one chunk across groups
        assert got["sent"] == {"reduce_scatter": STEPS * 4 * SHARD * chunk, "all_reduce": STEPS * 4 * chunk,
                               "all_gather": STEPS * 4 * SHARD * chunk}
