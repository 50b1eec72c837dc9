"""dp_helpers.zero3.Zero3Module: a module wrapper whose parameters are shards, gathered unit by unit (rank pools).

Its equivalence with one process, case by case on 1 to 4 ranks, is the equivalence matrix's.
"""

import pytest
import torch
from torch import nn

from dp_helpers.training import bce_loss


def mlp(seed: int) -> nn.Module:
    """Four layers."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 1), nn.Sigmoid())


def observed(info) -> dict:
    """One recorded step: when each unit's gather starts, what a rank holds between steps, the full state dict."""
    from dp_helpers import zero3

    model = zero3.Zero3Module(mlp(seed=info.rank))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    events, gather, reduce = [], zero3.Unit.start_gather, zero3.Bucket.reduce
    zero3.Unit.start_gather = lambda u: (events.append(("gather", model.units.index(u), u.full or u.work is not None)),
                                         gather(u))[1]
    zero3.Bucket.reduce = lambda b, **kw: (events.append(("reduce", next(i for i, u in enumerate(model.units)
                                                                         if u.bucket is b), model.pending)), reduce(b, **kw))[1]
    try:
        for step in range(2):  # the first forward records the order; the second prefetches along it
            events.append(("step", step, None))
            x, y = torch.randn(8, 10, generator=torch.Generator().manual_seed(step)), torch.rand(8)
            opt.zero_grad()
            bce_loss(model(x).squeeze(1), y).backward()
            opt.step()
    finally:
        zero3.Unit.start_gather, zero3.Bucket.reduce = gather, reduce
    held = sum(p.untyped_storage().nbytes() for u in model.units for p in u.bucket.params)
    return {"events": events, "held full": held, "shards": sum(p.numel() for p in model.parameters()),
            "state": model.full_state_dict(), "units": len(model.units)}


@pytest.mark.slow
def test_units_are_prefetched_reduced_during_the_backward_and_freed(pools):
    ranks = pools.get(2).run(observed)
    zero = ranks[0]
    second = zero["events"][zero["events"].index(("step", 1, None)):]
    # the forward: unit k's gather is started while unit k-1 computes, so unit k finds it under way (True)
    assert second[1:8] == [("gather", 0, False), ("gather", 1, False), ("gather", 1, True), ("gather", 2, False),
                           ("gather", 2, True), ("gather", 3, False), ("gather", 3, True)]
    backward = second[8:]
    assert [e for e in backward if e[0] == "reduce"] == [("reduce", k, True) for k in (3, 2, 1, 0)]  # during it
    for k in (2, 1, 0):  # each unit's backward gather was prefetched by the unit after it
        assert backward.index(("gather", k, False)) < backward.index(("gather", k, True)) < backward.index(("reduce", k, True))
    assert zero["held full"] == 0  # between steps no rank keeps a full parameter
    assert zero["shards"] == sum(-(-p.numel() // 2) for p in mlp(0).parameters())  # this rank's chunks only
    plain = mlp(0)
    plain.load_state_dict(zero["state"])  # by name, as the plain model's own
    torch.testing.assert_close(ranks[1]["state"], zero["state"])
