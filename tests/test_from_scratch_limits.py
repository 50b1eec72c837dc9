"""The from-scratch classes where a user's model or optimizer leaves the common path: a parameter some ranks (or all)
leave unused, an optimizer that is not elementwise, mixed dtypes, fp16 reduction, accumulation without communication,
a world size that is not a power of two. Each class matches torch's counterpart or refuses in one sentence."""

import contextlib

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
    """Zero3Module and a torch reference (fully_shard, or DDP that finds unused parameters), 3 Adam steps each."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dp_helpers.scratch.sharding.fsdp import fully_sharded
    from dp_helpers.scratch.sharding.zero3 import Zero3Module

    ours = Zero3Module(WithExtra(users))
    opt = torch.optim.Adam(ours.parameters(), lr=0.05)
    theirs = WithExtra(users)
    before = [p.detach().clone() for p in theirs.parameters()]
    if reference == "fully_shard":
        theirs = fully_sharded(theirs)
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
    return {"ours": list(ours.full_state_dict().values()), "torch": [p.detach().clone() for p in full],
            "before": before}


@pytest.mark.slow
@pytest.mark.parametrize("users, reference", [((), "fully_shard"), ((0,), "DDP"), ((0, 1), "fully_shard")],
                         ids=["unused everywhere", "used on rank 0 only", "used everywhere"])
def test_zero3_trains_a_unit_with_an_unused_parameter_as_torch_does(pools, users, reference):
    for rank in pools.get(2).run(zero3_against, users, reference):
        torch.testing.assert_close(rank["ours"], rank["torch"], rtol=1e-5, atol=1e-6)
        assert not torch.equal(rank["ours"][2], rank["before"][2])  # first.w moved: the unit was reduced and stepped


def refusals(info) -> dict:
    """What each class says to a case it cannot do right."""
    from dp_helpers.scratch.ddp.mini_ddp import MiniDDP
    from dp_helpers.scratch.sharding.zero import ZeroOptimizer
    from dp_helpers.scratch.sharding.zero3 import Zero3Module

    said = {}
    frozen = nn.Linear(3, 2).requires_grad_(False)
    attempts = {"MiniDDP, nothing trained": lambda: MiniDDP(frozen),
                "ZeroOptimizer, Adafactor": lambda: ZeroOptimizer(nn.Linear(8, 4).parameters(), torch.optim.Adafactor)}
    for name, attempt in attempts.items():
        try:
            attempt()
        except ValueError as exc:
            said[name] = str(exc)
    model = Zero3Module(nn.Linear(8, 4))
    opt = torch.optim.Adafactor(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    try:
        opt.step()
    except ValueError as exc:
        said["Zero3Module, Adafactor"] = str(exc)
    torch.optim.Adam(model.parameters()).step()  # an elementwise one steps the same shards
    return said


@pytest.mark.slow
def test_what_cannot_be_done_right_is_refused_in_one_sentence(pools):
    said = pools.get(2).run(refusals)[0]
    assert "no parameter of this module requires a gradient" in said["MiniDDP, nothing trained"]
    for who in ("ZeroOptimizer", "Zero3Module"):
        message = said[f"{who}, Adafactor"]
        assert message.startswith(who) and "Adafactor is not among them" in message and message.count(". ") == 0


class Head(nn.Module):
    """A body every rank uses and a head that rank 0 alone uses."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body, self.head = nn.Linear(4, 3), nn.Linear(3, 1)

    def forward(self, x):
        h = self.body(x)
        return self.head(h).squeeze(1) if dist.get_rank() == 0 else h.sum(1)


def local_sgd_with_a_head(info) -> dict:
    """Two SGD steps of local SGD with H = 1, then every trained parameter's mean over ranks."""
    from dp_helpers.scratch.communicating_less.local_sgd import LocalSGD

    model = Head()
    averager, opt = LocalSGD(model, period=1), torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(2):
        x, y = rank_batch(info.rank, step)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        averager.after_step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.mark.slow
def test_local_sgd_averages_a_parameter_some_ranks_leave_unused(pools):
    ranks = pools.get(2).run(local_sgd_with_a_head)
    torch.testing.assert_close(ranks[0], ranks[1], rtol=0, atol=0)  # the same tensors averaged on both ranks
    assert not torch.equal(ranks[0]["head.weight"], Head().head.weight)  # rank 0's steps reached it, halved


def stage2_accumulation(info, accumulate: bool) -> dict:
    """ZeRO-2, one step over 3 micro-batches, the first two inside no_sync or not; bytes sent and weights."""
    from dp_helpers.scratch.sharding.zero import ZeroOptimizer

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = ZeroOptimizer(model.parameters(), torch.optim.AdamW, stage=2, bucket_cap_mb=0.0001, lr=0.05)
    for j in range(3):
        x, y = rank_batch(info.rank, j)
        quiet = opt.no_sync() if accumulate and j < 2 else contextlib.nullcontext()
        with quiet:
            (nn.functional.mse_loss(model(x).squeeze(1), y) / 3).backward()
    opt.step()
    return {"sent": opt.sent["reduce_scatter"], "weights": [p.detach().clone() for p in model.parameters()],
            "one backward": sum(4 * b.flat.buffer.numel() for b in opt.buckets)}


@pytest.mark.slow
def test_zero2_no_sync_sends_once_per_step_and_trains_the_same(pools):
    quiet, loud = (pools.get(2).run(stage2_accumulation, accumulate)[0] for accumulate in (True, False))
    assert quiet["sent"] == quiet["one backward"] and loud["sent"] == 3 * loud["one backward"]
    torch.testing.assert_close(quiet["weights"], loud["weights"], rtol=1e-6, atol=1e-7)


def fp16_reduction(info) -> dict:
    """Zero3Module reducing in fp16 gradients whose sum over ranks exceeds fp16's range (their mean does not)."""
    from dp_helpers.scratch.sharding.zero3 import MixedPrecision, Zero3Module

    model = Zero3Module(nn.Linear(4, 2, bias=False), MixedPrecision(reduce_dtype=torch.float16))
    (model(torch.ones(1, 4)).sum() * 40_000).backward()  # every gradient 40000 on every rank: the sum, 80000 x W/2
    return {"grads": torch.cat([s.grad for s in model.parameters()])}


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_zero3_fp16_reduction_divides_before_the_sum(pools, world):
    for rank in pools.get(world).run(fp16_reduction):
        assert torch.isfinite(rank["grads"]).all()  # 65504 is fp16's largest
        nonzero = rank["grads"][rank["grads"] != 0]  # the padding of the last chunk stays 0
        torch.testing.assert_close(nonzero, torch.full_like(nonzero, 40_000))


class WritesItsGroups(torch.optim.SGD):
    """SGD that counts its steps in each parameter group, as schedulers and some optimizers write into theirs."""

    def step(self, closure=None):
        for group in self.param_groups:
            group["steps_taken"] = group.get("steps_taken", 0) + 1
        return super().step(closure)


def dtypes_and_groups(info) -> dict:
    """ZeroOptimizer over a float64 and a float32 parameter in one bucket's reach, with an optimizer writing its groups."""
    from dp_helpers.scratch.sharding.zero import ZeroOptimizer

    fine, coarse = nn.Parameter(torch.ones(3, dtype=torch.float64)), nn.Parameter(torch.ones(3))
    opt = ZeroOptimizer([fine, coarse], WritesItsGroups, stage=2, lr=1e-12)
    (fine.sum() + coarse.sum()).backward()
    opt.step()
    return {"fine": fine.detach().clone(), "dtypes": [fine.dtype, coarse.dtype], "groups": opt.param_groups[0]["steps_taken"]}


@pytest.mark.slow
def test_zero_optimizer_keeps_each_dtype_and_what_the_optimizer_writes(pools):
    out = pools.get(2).run(dtypes_and_groups)[0]
    assert out["dtypes"] == [torch.float64, torch.float32]
    torch.testing.assert_close(out["fine"], torch.full((3,), 1 - 1e-12, dtype=torch.float64), rtol=0, atol=1e-16)
    assert out["groups"] == 1


def tiny_and_accumulated(info) -> dict:
    """A model smaller than the ranks' chunks under Zero3Module, a gradient left by no_sync under stage 2, a scaler."""
    from dp_helpers.scratch.sharding.zero import ZeroOptimizer
    from dp_helpers.scratch.sharding.zero3 import Zero3Module

    torch.manual_seed(0)
    tiny = Zero3Module(nn.Linear(2, 1))  # 3 values on 4 ranks: rank 3's chunk is padding alone
    opt = torch.optim.SGD(tiny.parameters(), lr=0.5)
    x = torch.arange(8.0).view(4, 2)[info.rank:info.rank + 1]
    tiny(x).sum().backward()
    opt.step()
    out = {"tiny": tiny.full_state_dict(), "pieces": [p.numel() for p in tiny.parameters()]}
    torch.manual_seed(1)
    extra, body = nn.Parameter(torch.ones(1)), nn.Linear(3, 1)  # extra: used in the no_sync micro-batch only
    z = ZeroOptimizer([*body.parameters(), extra], torch.optim.SGD, stage=2, lr=1.0)
    with z.no_sync():
        (body(torch.ones(2, 3)).sum() + 2 * extra.sum()).backward()
    body(torch.ones(2, 3)).sum().backward()
    z.step()
    out["extra"] = extra.item()
    scaler = torch.amp.GradScaler("cpu")
    z.zero_grad()
    scaler.scale(body(torch.ones(2, 3)).sum()).backward()
    scaler.unscale_(z)  # the usual step before clipping: the scaler then hands no grad_scale to step()
    try:
        scaler.step(z)
    except ValueError as exc:
        out["scaler"] = str(exc)
    return out


@pytest.mark.slow
def test_a_rank_with_padding_alone_a_no_sync_gradient_and_an_unscaled_scaler(pools):
    torch.manual_seed(0)
    plain = nn.Linear(2, 1)
    plain(torch.arange(8.0).view(4, 2)).sum().div(4).backward()  # the mean over the 4 ranks' rows
    with torch.no_grad():
        for p in plain.parameters():
            p -= 0.5 * p.grad
    for rank, got in enumerate(pools.get(4).run(tiny_and_accumulated)):
        torch.testing.assert_close(got["tiny"], plain.state_dict())
        assert got["pieces"] == ([1] if rank < 3 else [0])  # rank 3: one empty piece, so its optimizer has one
        assert got["extra"] == -1.0  # 1 - lr x its no_sync gradient, 2 on every rank (dropped, it would stay 1)
        assert "does not support GradScaler" in got["scaler"]
