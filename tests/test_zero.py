"""dp_helpers.zero: ZeRO-1 and ZeRO-2 from scratch equal DDP and one process with Adam; bytes per rank equal the formula."""

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from dp_helpers import zero
from dp_helpers.scripts.from_scratch import batch, global_batch, weights
from dp_helpers.training import bce_loss

STEPS = 4


def mlp(seed: int) -> torch.nn.Module:
    """Several layers, a bias-free one; tanh (see below)."""
    # With notebook 04's ReLU MLP one weight's first gradient is -2.9e-9 in one process and -3.0e-9 summed from two
    # halves; Adam divides by sqrt(v) + eps, so that rounding became a 5e-5 difference in the weight (DDP against one
    # process, before any sharding). No gradient that close to zero arises here.
    torch.manual_seed(seed)
    nn = torch.nn
    return nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 32, bias=False), nn.Tanh(), nn.Linear(32, 1),
                         nn.Sigmoid())


def adam_train(model, opt, info) -> None:
    """STEPS Adam steps on this rank's rows; the last step's gradients are kept (what a rank holds between steps)."""
    for step in range(STEPS):
        x, y = batch(info, step)
        opt.zero_grad()
        bce_loss(model(x), y).backward()
        opt.step()


def sharded(info, stage: int) -> dict:
    """Train with ZeroAdam from a different start per rank; the weights, the bytes held, the bytes sent."""
    model = mlp(seed=info.rank)
    opt = zero.ZeroAdam(model, stage=stage, lr=0.01)
    adam_train(model, opt, info)
    return {"weights": weights(model), "held": opt.held(), "sent": opt.sent}


def with_ddp(info) -> dict:
    """The same training under DDP with torch's Adam."""
    model = DDP(mlp(seed=info.rank))
    adam_train(model, torch.optim.Adam(model.parameters(), lr=0.01), info)
    return weights(model)


def alone(world_size: int) -> dict:
    """One process, Adam, the whole global batch."""
    model = mlp(seed=0)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(STEPS):
        x, y = global_batch(step, world_size)
        bce_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return weights(model)


def stage3(info) -> dict:
    """Train with Zero3 from a different start per rank; full weights gathered, bytes held and sent."""
    model = mlp(seed=info.rank)
    opt = zero.Zero3(model, lr=0.01)
    adam_train(model, opt, info)
    names = [name for name, _ in model.named_parameters()]
    full = dict(zip(names, (t.tolist() for t in opt.full_weights()), strict=True))
    return {"weights": full, "held": opt.held(), "sent": opt.sent}


def torch_zero(info) -> dict:
    """torch's ZeroRedundancyOptimizer (stage 1, whole tensors per rank) around Adam, under DDP."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    model = DDP(mlp(seed=info.rank))
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
    adam_train(model, opt, info)
    grads = [p.grad for p in model.parameters()]
    return {"weights": weights(model), "held": zero.held_bytes(list(model.parameters()), grads, opt.optim)}


def fsdp2(info) -> dict:
    """torch's fully_shard (FSDP2) with Adam: full weights gathered from the DTensor shards; bytes held."""
    model = zero.fully_sharded(mlp(seed=info.rank))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    adam_train(model, opt, info)
    full = {name: p.full_tensor().tolist() for name, p in model.named_parameters()}  # a collective per parameter
    return {"weights": full, "held": zero.held_bytes(list(model.parameters()), [p.grad for p in model.parameters()], opt)}


def run_all(info) -> dict:
    return {"zero1": sharded(info, 1), "zero2": sharded(info, 2), "zero3": stage3(info), "ddp": with_ddp(info),
            "torch zero": torch_zero(info), "fsdp2": fsdp2(info)}


def close(a: dict, b: dict) -> None:
    torch.testing.assert_close({k: torch.tensor(v) for k, v in a.items()}, {k: torch.tensor(v) for k, v in b.items()})


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_zero_stages_equal_ddp_and_one_process(pools, world):
    ranks = pools.get(world).run(run_all)
    reference = alone(world)
    model = mlp(0)
    numel = sum(p.numel() for p in model.parameters())
    per_module = [sum(p.numel() for p in m.parameters(recurse=False)) for m in model if isinstance(m, torch.nn.Linear)]
    for r, rank in enumerate(ranks):
        close(rank["ddp"], reference)
        for name in ("zero1", "zero2", "zero3", "torch zero", "fsdp2"):
            close(rank[name]["weights"], rank["ddp"])
        for stage in (1, 2):
            assert rank[f"zero{stage}"]["held"] == zero.zero_bytes([numel], world, stage)
            full = 4 * zero.padded(numel, world) * STEPS
            assert rank[f"zero{stage}"]["sent"] == {"reduce_scatter": full, "all_gather": full}
        assert rank["zero3"]["held"] == zero.zero_bytes(per_module, world, 3)
        shapes = [p.shape for p in model.parameters()]
        assert rank["fsdp2"]["held"] == zero.fsdp2_bytes(shapes, world, r)
        full = 4 * sum(zero.padded(n, world) for n in per_module) * STEPS
        assert rank["zero3"]["sent"] == {"reduce_scatter": full, "all_gather": 2 * full + full // STEPS}  # + the final gather


def test_the_formula_is_the_papers_16_psi_divided_as_it_says():
    psi, n = 1200, 4  # divisible: no padding; minus Adam's 4-byte step counter per stepped tensor
    ddp, one, two, three = (sum(zero.zero_bytes([psi], n, s).values()) - 4 for s in (0, 1, 2, 3))
    assert ddp == 16 * psi
    assert one == 4 * psi + 4 * psi + 8 * psi // n
    assert two == 4 * psi + (4 + 8) * psi // n
    assert three == 16 * psi // n


def test_flat_views_alias_one_padded_buffer():
    a, b = torch.arange(5.0), torch.arange(6.0).view(2, 3)
    flat = zero.Flat([a, b], world_size=4)
    assert flat.buffer.numel() == 12 and flat.size == 3  # 11 values padded to 12
    flat.views[1][0, 0] = 42.0
    assert flat.buffer[5] == 42.0 and torch.equal(flat.views[0], a)
    assert torch.equal(flat.chunk(3), flat.buffer[9:12])
    assert zero.storage_bytes(flat.views + [flat.chunk(0)]) == 12 * 4
