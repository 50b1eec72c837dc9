"""dp_helpers.scratch.sharding.zero.ZeroOptimizer: torch's optimizer interface over ZeRO-1/2, against one process (rank pools)."""

import pytest
import torch
from torch import nn

from dp_helpers.tool.training import bce_loss

OPTIMIZERS = {"SGD with momentum": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
              "AdamW with weight decay": (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1})}


def model(seed: int) -> nn.Module:
    """Four layers, so that a small cap makes several buckets."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(10, 24), nn.ReLU(), nn.Linear(24, 24), nn.ReLU(), nn.Linear(24, 1), nn.Sigmoid())


def groups(m: nn.Module) -> list[dict]:
    """Two parameter groups: the biases without weight decay and at twice the rate."""
    biases = [p for n, p in m.named_parameters() if n.endswith("bias")]
    return [{"params": [p for n, p in m.named_parameters() if not n.endswith("bias")]},
            {"params": biases, "weight_decay": 0.0, "lr_scale": 2}]


def data(world: int, steps: int, start: int = 0):
    """Global batches of 6 rows per rank."""
    gen = torch.Generator().manual_seed(start)
    return [(torch.randn(6 * world, 10, generator=gen), torch.rand(6 * world, generator=gen)) for _ in range(steps)]


def run(m, opt, batches, rank: int, world: int, clip: float | None = None) -> list[float]:
    """Steps on this rank's rows; the clipped norms, if any."""
    norms = []
    for x, y in batches:
        rows = slice(rank * len(x) // world, (rank + 1) * len(x) // world)
        opt.zero_grad()
        bce_loss(m(x[rows]).squeeze(1), y[rows]).backward()
        if clip is not None:
            norms.append(float(opt.clip_grad_norm_(clip) if hasattr(opt, "clip_grad_norm_")
                               else torch.nn.utils.clip_grad_norm_(m.parameters(), clip)))
        opt.step()
    return norms


def make(m, name: str, zero: bool, stage: int = 1):
    """The optimizer named, over two groups (the biases' rate doubled), plain or sharded."""
    from dp_helpers.scratch.sharding.zero import ZeroOptimizer

    cls, kwargs = OPTIMIZERS[name]
    param_groups = groups(m)
    param_groups[1]["lr"] = kwargs["lr"] * param_groups[1].pop("lr_scale")
    return ZeroOptimizer(param_groups, cls, stage=stage, bucket_cap_mb=0.001, **kwargs) if zero else cls(param_groups, **kwargs)


def sharded_runs(info) -> dict:
    """Every optimizer and stage, from a different start on every rank; weights, clipped norms, consolidated state."""
    out = {}
    for name in OPTIMIZERS:
        for stage in (1, 2):
            m = model(seed=info.rank)  # the constructor's broadcast must make them equal
            opt = make(m, name, zero=True, stage=stage)
            norms = run(m, opt, data(info.world_size, 3), info.rank, info.world_size, clip=0.5)
            last = info.world_size - 1  # not rank 0: the state lands where it is asked to
            opt.consolidate_state_dict(to=last)
            out[name, stage] = {"weights": m.state_dict(), "norms": norms,
                                "state": opt.state_dict() if info.rank == last else None,
                                "buckets": len(opt.buckets), "grads": [p.grad for p in m.parameters()]}
    return out


@pytest.mark.slow
@pytest.mark.parametrize("world", [2])  # 1 to 4 ranks, and more cases: the equivalence matrix
def test_zero_optimizer_equals_the_plain_optimizer_on_the_global_batch(pools, world):
    ranks = pools.get(world).run(sharded_runs)
    for name in OPTIMIZERS:
        m = model(seed=0)
        opt = make(m, name, zero=False)
        norms = run(m, opt, data(world, 3), 0, 1, clip=0.5)
        for stage in (1, 2):
            for rank in ranks:
                got = rank[name, stage]
                torch.testing.assert_close(got["weights"], m.state_dict(), rtol=1e-5, atol=1e-6)
                torch.testing.assert_close(got["norms"], norms, rtol=1e-5, atol=1e-6)  # the global norm, clipped alike
            saved = ranks[-1][name, stage]["state"]
            assert saved["param_groups"] == opt.state_dict()["param_groups"]  # every hyperparameter, the same indices
            torch.testing.assert_close(saved["state"], opt.state_dict()["state"], rtol=1e-5, atol=1e-6)
            assert ranks[0][name, stage]["buckets"] > 1
        assert all(g is None for g in ranks[0][name, 2]["grads"])  # stage 2 keeps no full gradient after the step


def resumed(info, saved: dict, weights: dict) -> dict:
    """A plain AdamW's state dict loaded into a ZeroOptimizer (stage 2), two more steps."""
    m = model(seed=0)
    m.load_state_dict(weights)
    opt = make(m, "AdamW with weight decay", zero=True, stage=2)
    opt.load_state_dict(saved)
    run(m, opt, data(info.world_size, 2, start=5), info.rank, info.world_size)
    return m.state_dict()


@pytest.mark.slow
def test_a_plain_optimizers_state_dict_loads_and_training_continues_alike(pools):
    m = model(seed=0)
    opt = make(m, "AdamW with weight decay", zero=False)
    run(m, opt, data(2, 3), 0, 1)
    saved, weights = opt.state_dict(), {k: v.clone() for k, v in m.state_dict().items()}
    ranks = pools.get(2).run(resumed, saved, weights)
    run(m, opt, data(2, 2, start=5), 0, 1)
    for got in ranks:
        torch.testing.assert_close(got, m.state_dict(), rtol=1e-5, atol=1e-6)


def stage_two_timing(info) -> dict:
    """When stage 2's reduce-scatters start: how many buckets were launched before the backward's end."""
    from dp_helpers.scratch.sharding.zero import ZeroOptimizer

    m = model(seed=0)
    opt = ZeroOptimizer(m.parameters(), torch.optim.SGD, stage=2, bucket_cap_mb=0.001, lr=0.1)
    launched, finish = [], opt.finish_backward
    opt.finish_backward = lambda: (launched.append(opt.next), finish())[1]
    x, y = data(info.world_size, 1)[0]
    bce_loss(m(x).squeeze(1), y).backward()
    return {"launched in the backward": launched[0], "buckets": len(opt.buckets),
            "full grads": [p.grad is not None for p in m.parameters()]}


@pytest.mark.slow
def test_stage_two_reduces_during_the_backward_and_frees_the_full_gradients(pools):
    for rank in pools.get(2).run(stage_two_timing):
        assert rank["launched in the backward"] == rank["buckets"] > 1 and not any(rank["full grads"])


def refused(info) -> str:
    """ZeroOptimizer over a DDP model's parameters."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dp_helpers.scratch.sharding.zero import ZeroOptimizer

    wrapped = DDP(model(seed=0))
    try:
        ZeroOptimizer(wrapped.parameters(), torch.optim.SGD, lr=0.1)
    except ValueError as exc:
        return str(exc)
    return "accepted"


@pytest.mark.slow
def test_a_ddp_model_is_refused(pools):
    assert "not a DistributedDataParallel model's" in pools.get(2).run(refused)[0]


def rebuilt_and_zeroed(info) -> dict:
    """A second stage-2 ZeroOptimizer over the same model (a notebook cell run twice), and zero_grad(set_to_none=False)."""
    from dp_helpers.scratch.sharding.zero import ZeroOptimizer

    m = model(seed=0)
    ZeroOptimizer(m.parameters(), torch.optim.SGD, stage=2, lr=0.1)  # its hooks must not outlive the next one's
    opt = ZeroOptimizer(m.parameters(), torch.optim.SGD, stage=2, lr=0.1)
    x, y = data(info.world_size, 1)[0]
    bce_loss(m(x).squeeze(1), y).backward()
    opt.step()
    stage1 = ZeroOptimizer(m.parameters(), torch.optim.SGD, stage=1, lr=0.1)
    bce_loss(m(x).squeeze(1), y).backward()
    stage1.zero_grad(set_to_none=False)
    return {"grads kept and zeroed": all(p.grad is not None and not p.grad.any() for p in m.parameters())}


@pytest.mark.slow
def test_a_second_optimizer_replaces_the_first_and_zero_grad_can_keep_tensors(pools):
    assert pools.get(2).run(rebuilt_and_zeroed)[0] == {"grads kept and zeroed": True}


@pytest.mark.parametrize("params", [torch.randn(1), torch.randn(3, 2, requires_grad=True)])
def test_a_tensor_for_params_is_refused_as_torch_optim_refuses_it(params):
    # PyTorch's own test_zero_redundancy_optimizer.py::test_constructor asks this of ZeroRedundancyOptimizer
    from dp_helpers.scratch.sharding.zero import ZeroOptimizer

    with pytest.raises(TypeError) as torchs:
        torch.optim.SGD(params, lr=0.1)
    with pytest.raises(TypeError) as ours:  # before it asks for a process group
        ZeroOptimizer(params, torch.optim.SGD, lr=0.1)
    assert str(ours.value) == str(torchs.value) and "iterable of Tensors or dicts" in str(ours.value)
