"""The from-scratch classes where a user's model or optimizer leaves the common path: a parameter some ranks (or all)
leave unused, an optimizer that is not elementwise, mixed dtypes, fp16 reduction, accumulation without communication,
a world size that is not a power of two. Each class matches torch's counterpart or refuses in one sentence."""

import pytest
import torch
import torch.distributed as dist
from torch import nn


class Extra(nn.Module):
    """h @ w, plus `extra` on the ranks in `users` only."""

    def __init__(self, users: tuple[int, ...]):
        super().__init__()
        self.w, self.extra, self.users = nn.Parameter(torch.randn(3, 3)), nn.Parameter(torch.randn(3)), users

    def forward(self, h):
        h = h @ self.w
        return h + self.extra if dist.get_rank() in self.users else h


class WithExtra(nn.Module):
    """A layer with a parameter used on some ranks only, first (its input needs no gradient) and in the middle."""

    def __init__(self, users: tuple[int, ...] = ()):
        super().__init__()
        torch.manual_seed(0)
        self.inp, self.first, self.middle, self.head = nn.Linear(4, 3), Extra(users), Extra(users), nn.Linear(3, 1)

    def forward(self, x):
        h = torch.relu(self.first(x[:, :3]) + self.inp(x))
        return self.head(torch.relu(self.middle(h))).squeeze(1)


def rank_batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's rows of one step, different on every rank."""
    gen = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(8, 4, generator=gen), torch.randn(8, generator=gen)


def zero3_against(info, users: tuple[int, ...], reference: str) -> dict:
    """zero.Zero3 and a torch reference (fully_shard, or DDP that finds unused parameters), 3 Adam steps each."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dp_helpers import zero

    ours = WithExtra(users)
    opt = zero.Zero3(ours, lr=0.05)
    theirs = WithExtra(users)
    before = [p.detach().clone() for p in theirs.parameters()]
    if reference == "fully_shard":
        theirs = zero.fully_sharded(theirs)
    else:
        theirs = DDP(theirs, find_unused_parameters=True)
    torch_opt = torch.optim.Adam(theirs.parameters(), lr=0.05)
    for step in range(3):
        x, y = rank_batch(info.rank, step)
        for model, o in ((ours, opt), (theirs, torch_opt)):
            o.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            o.step()
    full = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in theirs.parameters()]
    return {"ours": opt.full_weights(), "torch": [p.detach().clone() for p in full], "before": before}


@pytest.mark.slow
@pytest.mark.parametrize("users, reference", [((), "fully_shard"), ((0,), "DDP"), ((0, 1), "fully_shard")],
                         ids=["unused everywhere", "used on rank 0 only", "used everywhere"])
def test_zero3_trains_a_unit_with_an_unused_parameter_as_torch_does(pools, users, reference):
    for rank in pools.get(2).run(zero3_against, users, reference):
        torch.testing.assert_close(rank["ours"], rank["torch"], rtol=1e-5, atol=1e-6)
        assert not torch.equal(rank["ours"][2], rank["before"][2])  # first.w moved: the unit was reduced and stepped


def zero3_module_against_ddp(info, users: tuple[int, ...]) -> dict:
    """Zero3Module and DDP that finds unused parameters, 3 Adam steps each."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dp_helpers.zero3 import Zero3Module

    ours, theirs = Zero3Module(WithExtra(users)), DDP(WithExtra(users), find_unused_parameters=True)
    opts = [torch.optim.Adam(m.parameters(), lr=0.05) for m in (ours, theirs)]
    for step in range(3):
        x, y = rank_batch(info.rank, step)
        for model, o in zip((ours, theirs), opts, strict=True):
            o.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            o.step()
    return {"ours": list(ours.full_state_dict().values()), "torch": list(theirs.module.state_dict().values())}


@pytest.mark.slow
@pytest.mark.parametrize("users", [(), (0,)], ids=["unused everywhere", "used on rank 0 only"])
def test_zero3_module_trains_a_unit_with_an_unused_parameter_as_ddp_does(pools, users):
    for rank in pools.get(2).run(zero3_module_against_ddp, users):
        torch.testing.assert_close(rank["ours"], rank["torch"], rtol=1e-5, atol=1e-6)
