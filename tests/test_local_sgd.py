"""dp_helpers.scratch.communicating_less.local_sgd: local SGD equals DDP at H = 1 and torch's PeriodicModelAverager at H > 1; DiLoCo equals its
one-process emulation and sends 1/H of DDP's values (2 ranks in a rank pool)."""

import pytest
import torch
from torch import nn

STEPS, WORLD = 6, 2


def model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))


def data(rank: int) -> list:
    """This rank's own batches."""
    gen = torch.Generator().manual_seed(20 + rank)
    return [(torch.randn(8, 6, generator=gen), torch.randn(8, 1, generator=gen)) for _ in range(STEPS)]


def sgd_steps(m: nn.Module, rank: int, after=lambda: None) -> dict:
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for x, y in data(rank):
        opt.zero_grad()
        nn.functional.mse_loss(m(x), y).backward()
        opt.step()
        after()
    return {k: v.clone() for k, v in getattr(m, "module", m).state_dict().items()}


def adamw(params):
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)


def diloco_steps(m: nn.Module, rank: int, period: int):
    from dp_helpers.scratch.communicating_less.local_sgd import DiLoCo

    diloco = DiLoCo(m, adamw(m.parameters()), period=period)
    for x, y in data(rank):
        diloco.inner.zero_grad()
        nn.functional.mse_loss(m(x), y).backward()
        diloco.step()
    return {k: v.clone() for k, v in m.state_dict().items()}, diloco.sent


def every_method(info) -> dict:
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dp_helpers.scratch.communicating_less.local_sgd import LocalSGD
    from dp_helpers.scratch.ddp.mini_ddp import broadcast_state

    out = {"DDP": sgd_steps(DDP(model(info.rank)), info.rank)}
    m = model(info.rank)
    local = LocalSGD(m, period=1)
    out["local SGD, H = 1"] = sgd_steps(m, info.rank, local.after_step)
    m = model(info.rank)
    local = LocalSGD(m, period=3)
    out["local SGD, H = 3"], out["local sent"] = sgd_steps(m, info.rank, local.after_step), local.sent
    m = model(info.rank)
    broadcast_state(m)  # torch's averager does not broadcast the start: given the same one
    averager = PeriodicModelAverager(period=3)
    out["PeriodicModelAverager, H = 3"] = sgd_steps(m, info.rank, lambda: averager.average_parameters(m.parameters()))
    out["DiLoCo"], out["DiLoCo sent"] = diloco_steps(model(info.rank), info.rank, period=3)
    m = model(info.rank)
    local = LocalSGD(m, period=3, warmup_steps=2)  # averages after steps 0 and 1 (warm-up), then 2 and 5
    sgd_steps(m, info.rank, local.after_step)
    out["warm-up sent"] = local.sent
    return out


def diloco_alone(period: int) -> dict:
    """DiLoCo emulated in one process: WORLD workers from rank 0's start, each with its AdamW, taking turns."""
    workers = [model(0) for _ in range(WORLD)]
    inner = [adamw(w.parameters()) for w in workers]
    agreed = [p.detach().clone() for p in workers[0].parameters()]
    outer = torch.optim.SGD(agreed, lr=0.7, momentum=0.9, nesterov=True)
    batches = [data(r) for r in range(WORLD)]
    for step in range(STEPS):
        for r, (w, opt) in enumerate(zip(workers, inner, strict=True)):
            x, y = batches[r][step]
            opt.zero_grad()
            nn.functional.mse_loss(w(x), y).backward()
            opt.step()
        if (step + 1) % period == 0:
            with torch.no_grad():
                for i, a in enumerate(agreed):
                    a.grad = sum((a - list(w.parameters())[i]) / WORLD for w in workers)
                outer.step()
                for w in workers:
                    for p, a in zip(w.parameters(), agreed, strict=True):
                        p.copy_(a)
    return {k: v.clone() for k, v in workers[0].state_dict().items()}


@pytest.mark.slow
def test_local_sgd_and_diloco_equal_their_references_and_send_one_hth(pools):
    psi = sum(p.numel() for p in model(0).parameters())
    for rank in pools.get(WORLD).run(every_method):
        torch.testing.assert_close(rank["local SGD, H = 1"], rank["DDP"])  # the same update, rounded apart
        torch.testing.assert_close(rank["local SGD, H = 3"], rank["PeriodicModelAverager, H = 3"], rtol=0, atol=0)
        torch.testing.assert_close(rank["DiLoCo"], diloco_alone(period=3))
        assert rank["local sent"] == psi * len(range(0, STEPS, 3))  # after steps 0 and 3
        assert rank["DiLoCo sent"] == psi * (STEPS // 3)  # DDP would send psi a step: 1/3 of it
        assert rank["warm-up sent"] == psi * 4
