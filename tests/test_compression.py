"""dp_helpers.scratch.communicating_less.compression: PowerSGD from scratch equals torch's powerSGD_hook, and sends the values its formula says."""

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

    from dp_helpers.scratch.communicating_less.compression import PowerSGD

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
    from dp_helpers.scratch.communicating_less.compression import powersgd_values

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


def mlp_run(info, ours: bool) -> dict:
    """An MLP 20-32-16-1 under DDP with PowerSGD of rank 1 from step 3 (ours or torch's), 30 SGD steps."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import (
        PowerSGDState,
        powerSGD_hook,
    )
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dp_helpers.scratch.communicating_less.compression import PowerSGD

    torch.manual_seed(0)
    ddp = DDP(nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 1)))
    if ours:
        ddp.register_comm_hook(PowerSGD(rank=1, start_iter=3, seed=0), PowerSGD.hook)
    else:
        ddp.register_comm_hook(PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=3, random_seed=0),
                               powerSGD_hook)
    opt, gen = torch.optim.SGD(ddp.parameters(), lr=0.05), torch.Generator().manual_seed(info.rank)
    for _ in range(30):
        opt.zero_grad()
        ddp(torch.randn(8, 20, generator=gen)).pow(2).mean().backward()
        opt.step()
    return {k: v.clone() for k, v in ddp.module.state_dict().items()}


@pytest.mark.slow
def test_powersgd_is_torchs_hook_bit_for_bit_at_a_world_size_that_is_not_a_power_of_two(pools):
    # torch divides the tensors it sends whole after their sum; dividing before parted the weights by 6e-7 at W = 3
    for rank in pools.get(3).run(both_mlp):
        torch.testing.assert_close(rank["ours"], rank["torch"], rtol=0, atol=0)


def both_mlp(info) -> dict:
    """Ours and torch's PowerSGD on the same 30 steps."""
    return {"ours": mlp_run(info, True), "torch": mlp_run(info, False)}


class FakeBucket:
    """What DDP hands a hook: one flat buffer, the gradients as views of it, its index, whether it is the last."""

    def __init__(self, buffer: torch.Tensor, shapes: list):
        self.flat, self.shapes = buffer, shapes

    def buffer(self):
        return self.flat

    def gradients(self):
        sizes = [torch.Size(s).numel() for s in self.shapes]
        return [part.view(s) for part, s in zip(self.flat.split(sizes), self.shapes, strict=True)]

    def index(self):
        return 0

    def is_last(self):
        return True


def hook_returns_early(info) -> dict:
    """Rank 1 comes 1 s late to the exchange (the first steps' all-reduce, then the compressed step's Q): rank 0's
    hook returns at once, its Future still open, and the Future ends with the mean."""
    import time

    from dp_helpers.scratch.communicating_less.compression import PowerSGD

    state, shapes, out = PowerSGD(rank=1, start_iter=2), [(16, 12)], {}
    original = state.all_reduce

    def late(flat):  # rank 1 holds back the exchange that the hook returns before
        if info.rank == 1 and (state.iter < state.start_iter or flat.numel() == 12):
            time.sleep(1)
        return original(flat)

    state.all_reduce = late
    for phase in ("first steps", "first steps ", "compressed"):
        grads = torch.full((192,), float(info.rank + 1))
        start = time.perf_counter()
        future = state.hook(FakeBucket(grads, shapes))
        out[phase] = {"returned after": time.perf_counter() - start, "open": not future.done()}
        out[phase]["mean"] = future.wait().clone()
    return out


@pytest.mark.slow
def test_powersgd_hook_returns_while_its_exchange_is_under_way(pools):
    rank0 = pools.get(2).run(hook_returns_early)[0]
    for phase, seen in rank0.items():
        assert seen["open"] and seen["returned after"] < 0.5, (phase, seen)
        torch.testing.assert_close(seen["mean"], torch.full((192,), 1.5))  # rank-1 approximation of a rank-1 matrix
