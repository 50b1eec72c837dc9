"""dp_helpers.scratch.collectives.ring: the ring's schedule and byte counts, and the real rings against dist.all_reduce on 1 to 4 ranks (in rank pools).

The source article's two scripts and mp.spawn in a kernel are run and checked in notebook 03 (pytest runs it).
"""


import math

import pytest
import torch
import torch.distributed as dist

from dp_helpers.course.checkers import ring_check
from dp_helpers.scratch.collectives.ring import (
    assert_identical_across_ranks,
    naive_ring_bytes,
    ring_all_reduce,
    ring_bytes,
    ring_schedule,
    tensor_split_sizes,
)
from dp_helpers.scripts import collectives_demo
from tests.ranks import RankError


def simulate(values: list[list[float]]) -> list[list[float]]:
    """Play the schedule on plain lists, every rank's step at once, as the processes would."""
    world = len(values)
    bounds = [0]
    for size in tensor_split_sizes(len(values[0]), world):
        bounds.append(bounds[-1] + size)
    data = [list(v) for v in values]
    schedule = ring_schedule(world)
    for phase, step in dict.fromkeys((s.phase, s.step) for s in schedule):
        sends = {s.rank: s for s in schedule if (s.phase, s.step) == (phase, step)}
        payload = {r: data[r][bounds[st.send]:bounds[st.send + 1]] for r, st in sends.items()}
        for r, st in sends.items():
            incoming, lo = payload[(r - 1) % world], bounds[st.recv]
            assert len(incoming) == bounds[st.recv + 1] - lo  # the left neighbour sent this very chunk
            for i, v in enumerate(incoming):
                data[r][lo + i] = data[r][lo + i] + v if phase == "reduce-scatter" else v
    return data


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 7])
@pytest.mark.parametrize("length", [0, 1, 2, 6, 11])
def test_schedule_sums_every_element_on_every_rank(world, length):
    values = [[float(10 * r + i) for i in range(length)] for r in range(world)]
    expected = [sum(v[i] for v in values) for i in range(length)]
    assert simulate(values) == [expected] * world


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_each_rank_sends_two_w_minus_one_over_w(world):
    for numel in (1, 5, 999, 1000, 4096):
        ideal = 2 * (world - 1) / world * numel * 4
        for rank in range(world):
            assert abs(ring_bytes(numel, 4, world, rank) - ideal) < 2 * 4  # within chunk rounding
    assert ring_bytes(840, 4, world, 0) == 2 * (world - 1) * 840 // world * 4  # 840 splits evenly: exact
    assert naive_ring_bytes(1024, 4, world) == (world - 1) * 1024 * 4


def ring_cases(info) -> list[dict]:
    """course/checkers/ring_check.py's cases on this rank."""
    return [ring_check.check(shape, dtype, info) for shape, dtype in ring_check.shapes(info.world_size)]


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3, 4])
def test_rings_match_all_reduce(pools, world):
    table = pools.get(world).run(ring_cases)
    assert len(table) == world and len(table[0]) >= 8
    for rank, cases in enumerate(table):
        for case in cases:
            assert case["ring_error"] <= 1e-5 and case["naive_error"] <= 1e-5, case
            assert case["ring_bytes"] == ring_bytes(case["numel"], case["element_size"], world, rank)
            assert case["naive_bytes"] == naive_ring_bytes(case["numel"], case["element_size"], world)
    shapes = [c["shape"] for c in table[0]]
    assert [0] in shapes and [1] in shapes and [world + 1] in shapes and [3, 4, 5] in shapes


def ring_on_one_element(info) -> tuple[int, list[float]]:
    """The ring on a 5-element tensor: bytes sent and the result."""
    t = torch.arange(5.0)
    return ring_all_reduce(t), t.tolist()


@pytest.mark.slow
def test_ring_on_one_rank_is_a_no_op(pools):
    assert pools.get(1).run(ring_on_one_element) == [(0, [0.0, 1.0, 2.0, 3.0, 4.0])]


@pytest.mark.slow
def test_collectives_demo(pools):
    table = pools.get(3).run(collectives_demo.demos)
    before = [torch.tensor(row["all_reduce (sum)"][0]) for row in table]
    total = sum(before)
    for rank, row in enumerate(table):
        after = {name: torch.tensor(pair[1]) for name, pair in row.items()}
        assert torch.equal(after["broadcast from rank 0"], before[0])
        assert torch.equal(after["all_reduce (sum)"], total)
        torch.testing.assert_close(after["all_reduce, then / world_size (average)"], total / 3)
        assert torch.equal(after["all_gather"], torch.cat(before))
        assert torch.equal(after["reduce_scatter (sum)"], total[rank:rank + 1])


def equal_then_different(info) -> None:
    """Equal tensors pass the check; tensors that differ by rank fail it on every rank."""
    assert_identical_across_ranks([torch.ones(3)])
    assert_identical_across_ranks([torch.ones(3) * (1 + info.rank)])


@pytest.mark.slow
def test_identical_gradient_check_can_fail(pools):
    with pytest.raises(RankError, match=r"rank 0: AssertionError: gradients differ across ranks \(largest gap 1\)"):
        pools.get(2).run(equal_then_different)


def heads_by_rank(info) -> dict:
    """Two same-shape heads: rank r uses head r alone; each head's gradient after average_gradients."""
    from torch import nn

    from dp_helpers.scratch.collectives.ring import average_gradients

    torch.manual_seed(0)
    body, heads = nn.Linear(4, 4), nn.ModuleList([nn.Linear(4, 1), nn.Linear(4, 1)])
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(info.rank))
    heads[info.rank](body(x)).sum().backward()
    own = heads[info.rank].weight.grad.clone()
    average_gradients(nn.ModuleList([body, heads]))
    return {"own": own, "heads": [h.weight.grad for h in heads]}


@pytest.mark.slow
def test_averaging_by_hand_pairs_every_parameter_when_a_rank_leaves_one_unused(pools):
    # each rank all-reduces every parameter, zeros where it has no gradient: the heads are never mixed
    ranks = pools.get(2).run(heads_by_rank)
    for r in (0, 1):
        for rank in ranks:
            torch.testing.assert_close(rank["heads"][r], ranks[r]["own"] / 2)


def ring_on_a_transposed_view(info) -> bool:
    """The ring writes its sum through a non-contiguous view into the base tensor."""
    base = torch.arange(12.0).reshape(3, 4) * (info.rank + 1)
    x, expected = base.t(), base.t().clone()  # a transposed view: not contiguous
    dist.all_reduce(expected)
    ring_all_reduce(x)
    return not x.is_contiguous() and torch.equal(x, expected) and torch.equal(base.t(), expected)


@pytest.mark.slow
def test_ring_on_a_non_contiguous_tensor(pools):
    assert pools.get(3).run(ring_on_a_transposed_view) == [True] * 3


BN_CASES = [((3, 4), {}), ((3, 4, 5), {}), ((3, 4, 5), {"affine": False}), ((3, 4), {"momentum": None}),
            ((3, 4, 5), {"momentum": None, "affine": False}), ((3, 4, 5), {"track_running_stats": False})]


def bn_rows(world: int, shape: tuple, step: int) -> list[torch.Tensor]:
    """Each rank's input at one step; rank r holds 3 + r samples (unequal shards), the global batch is their concatenation."""
    gen = torch.Generator().manual_seed(step)
    return [torch.randn(shape[0] + r, *shape[1:], generator=gen) * 3 + 1 for r in range(world)]


def bn_steps(info, shape: tuple, kwargs: dict) -> dict:
    """Three training forwards and backwards of GlobalBatchNorm1d on this rank's rows, then one in eval mode."""
    from dp_helpers.scratch.collectives.ring import GlobalBatchNorm1d

    torch.manual_seed(0)
    bn, outs, grads = GlobalBatchNorm1d(shape[1], **kwargs), [], []
    for step in range(3):
        x = bn_rows(info.world_size, shape, step)[info.rank].requires_grad_()
        out = bn(x)
        (out * torch.arange(out.numel()).view_as(out)).sum().backward()  # a loss that weighs every output differently
        outs, grads = outs + [out.detach()], grads + [x.grad]
    bn.eval()
    outs.append(bn(bn_rows(info.world_size, shape, 9)[info.rank]).detach())
    params = {n: p.grad for n, p in bn.named_parameters()}  # this rank's share: DDP would average them
    return {"outs": outs, "input_grads": grads, "state": bn.state_dict(), "param_grads": params}


@pytest.mark.slow
@pytest.mark.parametrize(("shape", "kwargs"), BN_CASES)
def test_global_batchnorm_is_batchnorm_on_the_global_batch(pools, shape, kwargs):
    ranks = pools.get(2).run(bn_steps, shape, kwargs)
    torch.manual_seed(0)
    bn, outs, grads = torch.nn.BatchNorm1d(shape[1], **kwargs), [], []
    for step in range(3):
        x = torch.cat(bn_rows(2, shape, step)).requires_grad_()
        out = bn(x)
        weights = torch.cat([torch.arange(len(part) * math.prod(shape[1:])) for part in bn_rows(2, shape, step)])
        (out * weights.view_as(out)).sum().backward()
        outs, grads = outs + [out.detach()], grads + [x.grad]
    bn.eval()  # running statistics; without them, each rank's own batch statistics (SyncBatchNorm syncs only in training)
    outs.append(torch.cat([bn(part) for part in bn_rows(2, shape, 9)]).detach())
    tol = {"rtol": 1e-5, "atol": 1e-5}  # float32: a sum over ranks against one sum over the concatenation
    for got, want in zip([torch.cat(pair) for pair in zip(*(r["outs"] for r in ranks), strict=True)], outs, strict=True):
        torch.testing.assert_close(got, want, **tol)
    for got, want in zip([torch.cat(pair) for pair in zip(*(r["input_grads"] for r in ranks), strict=True)], grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)  # gradients are larger numbers, same relative error
    for rank in ranks:
        torch.testing.assert_close(rank["state"], bn.state_dict(), **tol)
    summed = {n: sum(r["param_grads"][n] for r in ranks) for n in ranks[0]["param_grads"]}  # accumulated over the 3 steps
    torch.testing.assert_close(summed, {n: p.grad for n, p in bn.named_parameters()}, rtol=1e-4, atol=1e-4)


def test_convert_keeps_the_parameters_buffers_and_mode():
    from dp_helpers.scratch.collectives.ring import GlobalBatchNorm1d

    bn = torch.nn.BatchNorm1d(4).eval()
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    weight = net[1].weight
    converted = GlobalBatchNorm1d.convert(net)
    assert isinstance(converted[1], GlobalBatchNorm1d) and converted[1].weight is weight  # an optimizer built before
    root = GlobalBatchNorm1d.convert(bn)  # a BatchNorm at the root is converted too, in its mode
    assert isinstance(root, GlobalBatchNorm1d) and not root.training and root.running_mean is bn.running_mean
