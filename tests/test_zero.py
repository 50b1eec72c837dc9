"""dp_helpers.scratch.sharding.zero and scripts/sharded.py: the bytes each rank holds and hands to collectives under ZeRO-1/2/3 from
scratch, ZeroRedundancyOptimizer and FSDP2 equal the formulas (their weights: notebook 08 and the equivalence matrix)."""

import pytest
import torch

from dp_helpers.scratch.sharding import memory, zero
from dp_helpers.scripts import sharded


def experiments(info, argv: list[str]) -> dict:
    """scripts/sharded.py's experiments on this rank, by name."""
    args = sharded.parse_args(argv)
    return {name: sharded.EXPERIMENTS[name](info, args) for name in args.experiment}


# every strategy of sharded.py against one process on 2 and 3 ranks: notebook 08's section 3 asserts it (pytest runs
# the notebook); the strategies behind torch's interfaces, case by case on 1 to 4 ranks: the equivalence matrix


@pytest.mark.slow
def test_bytes_held_and_sent_follow_the_formulas(pools):
    ranks = pools.get(2).run(experiments, ["--experiment", "memory", "--width", "24", "--depth", "3", "--steps", "2"])
    model = sharded.mlp(0, width=24, depth=3)
    shapes = [p.shape for p in model.parameters()]
    per_tensor = [s.numel() for s in shapes]
    per_module = [[p.numel() for p in m.parameters(recurse=False)] for m in model if isinstance(m, torch.nn.Linear)]
    numel = sum(per_tensor)
    for r, rank in enumerate(ranks):
        got = {name: row["held"] for name, row in rank["memory"].items()}
        assert got["DDP"] == memory.zero_bytes(per_tensor, 2, 0)  # gradient_as_bucket_view: gradients stored once
        assert got["ZeRO-1"] == memory.zero_bytes([numel], 2, 1)
        assert got["ZeRO-2"] == memory.zero_bytes([numel], 2, 2)
        assert got["ZeRO-3"] == memory.zero_bytes(per_module, 2, 3, rank=r)  # Adam per piece: rank-dependent
        assert got["fully_shard"] == memory.fsdp2_bytes(shapes, 2, r)
        assert rank["memory"]["DDP"]["gradient storages"] == 1  # gradient_as_bucket_view: .grad lives in the bucket
        sent = {name: row["sent_per_step"] for name, row in rank["memory"].items()}
        flat = 4 * zero.padded(numel, 2)
        assert sent["DDP"] == {"all_reduce": 4 * numel}
        assert sent["ZeRO-1"] == sent["ZeRO-2"] == {"reduce_scatter": flat, "all_gather": flat}
        layers = 4 * sum(zero.padded(sum(n), 2) for n in per_module)
        assert sent["ZeRO-3"] == {"reduce_scatter": layers, "all_gather": 2 * layers}  # forward and backward


def zero3_edges(info) -> dict:
    """Zero3Module beyond one plain step: accumulation over two backwards, an eval forward, frozen and tied weights."""
    from dp_helpers.scratch.sharding.zero3 import Zero3Module
    from dp_helpers.scripts.from_scratch import batch
    from dp_helpers.tool.training import bce_loss

    (x1, x2), (y1, y2) = (t.chunk(2) for t in batch(info, 0))
    grads = []
    for split in (True, False):
        model = Zero3Module(sharded.mlp(seed=0))
        if split:  # two micro-batches accumulate into the pieces
            (bce_loss(model(x1), y1) / 2).backward()
            (bce_loss(model(x2), y2) / 2).backward()
        else:
            bce_loss(model(torch.cat([x1, x2])), torch.cat([y1, y2])).backward()
        grads.append([piece.grad.clone() for piece in model.parameters()])
    with torch.no_grad():
        model(x1)  # no backward follows: the parameters are released at once
    empty = [p.numel() for u in model.units for p in u.bucket.params]
    frozen, tied = sharded.mlp(seed=0), torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    frozen[0].weight.requires_grad_(False)
    tied[1].weight = tied[0].weight
    weight = frozen[0].weight
    wrapped = [Zero3Module(m) for m in (frozen, tied)]
    return {"same": [torch.allclose(a, b, atol=1e-7) for a, b in zip(*grads, strict=True)], "empty": empty,
            "pieces": len(grads[0]), "units": [len(w.units) for w in wrapped],
            "frozen in a unit": any(p is weight for u in wrapped[0].units for p in u.bucket.params)}


@pytest.mark.slow
def test_zero3_accumulates_releases_and_takes_frozen_and_tied_weights(pools):
    out = pools.get(2).run(zero3_edges)[0]
    assert out["same"] == [True] * 4  # rank 0's 4 pieces (a part of each layer's weight): the sum of two halves
    assert out["empty"] == [0] * 7  # outside a forward the parameters are empty tensors, safe to print
    assert out["units"] == [4, 1] and not out["frozen in a unit"]  # a frozen weight stays out; tied: one unit


def test_the_formula_is_the_fp32_analogue_of_the_papers():
    psi, n = 1200, 4  # divisible: no padding; minus Adam's 4-byte step counter per stepped tensor
    # the paper (mixed precision): 4 + 12/N, 2 + 14/N, 16/N; in fp32 the 16 bytes split 4 + 4 + 8 instead
    ddp, one, two, three = (sum(memory.zero_bytes([psi], n, s).values()) - 4 for s in (0, 1, 2, 3))
    assert ddp == 16 * psi
    assert one == 4 * psi + 4 * psi + 8 * psi // n
    assert two == 4 * psi + (4 + 8) * psi // n
    assert three == 16 * psi // n


def test_fsdp2_pads_rows_but_not_the_state():
    shapes = [torch.Size([33, 4]), torch.Size([1])]
    zero_rank, one_rank = (memory.fsdp2_bytes(shapes, 2, r) for r in (0, 1))
    assert zero_rank["parameters"] == one_rank["parameters"] == 4 * (17 * 4 + 1)  # 17 of 33 rows, 1 of 1 each
    assert zero_rank["optimizer state"] == 8 * (17 * 4 + 1) + 8 and one_rank["optimizer state"] == 8 * 16 * 4 + 8


def test_flat_views_alias_one_padded_buffer():
    a, b = torch.arange(5.0), torch.arange(6.0).view(2, 3)
    flat = zero.Flat([a, b], world_size=4)
    assert flat.buffer.numel() == 12 and flat.size == 3  # 11 values padded to 12
    flat.views[1][0, 0] = 42.0
    assert flat.buffer[5] == 42.0 and torch.equal(flat.views[0], a)
    assert torch.equal(flat.chunk(3), flat.buffer[9:12])
    assert memory.storage_bytes(flat.views + [flat.chunk(0)]) == 12 * 4


def test_activation_bytes_count_what_the_backward_keeps_and_not_the_weights():
    from dp_helpers.scratch.sharding.memory import activation_bytes

    model = torch.nn.Sequential(torch.nn.Linear(10, 4), torch.nn.Tanh())
    # the linear layer keeps its input (8 x 10 floats), tanh its output (8 x 4); the weight it also keeps is not counted
    assert activation_bytes(model, torch.randn(8, 10)) == 4 * (8 * 10 + 8 * 4)
    with torch.no_grad():
        assert activation_bytes(model, torch.randn(8, 10)) == 0  # no graph, nothing kept
