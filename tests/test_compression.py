"""dp_helpers.compression: PowerSGD from scratch equals torch's powerSGD_hook, and sends the values its formula says."""

import pytest
import torch
from torch import nn

STEPS, START = 6, 2


def model() -> nn.Module:
    """Matrices worth compressing (two of one shape: torch draws their Qs shape by shape), a vector, a thin head."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 24), nn.Tanh(), nn.Linear(24, 32), nn.Tanh(),
                         nn.Linear(32, 24), nn.Tanh(), nn.Linear(24, 1))  # shapes A, B, A: the draw order shows


def trained(info, ours: bool, rank: int, bucket_mb: float = 25, error_feedback: bool = True) -> dict:
    """STEPS SGD steps under DDP with a PowerSGD hook (ours or torch's), each rank on its own data."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import (
        PowerSGDState,
        powerSGD_hook,
    )
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dp_helpers.compression import PowerSGD

    ddp = DDP(model(), bucket_cap_mb=bucket_mb)
    if ours:
        state = PowerSGD(rank=rank, start_iter=START, error_feedback=error_feedback, seed=3)
        ddp.register_comm_hook(state, PowerSGD.hook)
    else:
        ddp.register_comm_hook(PowerSGDState(None, matrix_approximation_rank=rank, start_powerSGD_iter=START,
                                             use_error_feedback=error_feedback, random_seed=3), powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(10 + info.rank)
    sent = []
    for _ in range(STEPS):
        x = torch.randn(16, 10, generator=gen)
        opt.zero_grad()
        ddp(x).pow(2).mean().backward()
        opt.step()
        sent.append(state.sent if ours else None)
    return {"weights": {k: v.clone() for k, v in ddp.module.state_dict().items()}, "sent": sent}


def both(info, rank: int) -> dict:
    """Ours and torch's on the same steps, in one bucket; ours in several buckets too."""
    # torch's hook chains its all-reduces in future callbacks: with several buckets on gloo the ranks ran them in
    # different orders here (a "collective mismatch" abort), so the comparison keeps DDP's gradients in one bucket
    return {"ours": trained(info, True, rank), "torch": trained(info, False, rank),
            "ours, 4 KB buckets": trained(info, True, rank, bucket_mb=0.004)}


@pytest.mark.slow
@pytest.mark.parametrize("rank", [1, 3])  # rank 3 > 2: torch orthogonalises with QR, ours with Gram-Schmidt
def test_powersgd_from_scratch_equals_torchs_hook_and_sends_its_formula(pools, rank):
    from dp_helpers.compression import powersgd_values

    shapes = [p.shape for p in model().parameters()]
    full, compressed = sum(s.numel() for s in shapes), powersgd_values(shapes, rank)
    for result in pools.get(2).run(both, rank):
        exact = {"rtol": 0, "atol": 0} if rank <= 2 else {"rtol": 1e-5, "atol": 1e-6}  # torch: QR above rank 2
        torch.testing.assert_close(result["ours"]["weights"], result["torch"]["weights"], **exact)
        for run in ("ours", "ours, 4 KB buckets"):  # each bucket keeps its own error and Q; the values sent add up alike
            per_step = torch.tensor(result[run]["sent"]).diff(prepend=torch.tensor([0])).tolist()
            assert per_step == [full] * START + [compressed] * (STEPS - START), run
        assert compressed < full / 3  # the point of it


# communicate_less.py's byte counts, method by method, are asserted against their formulas by notebook 10
