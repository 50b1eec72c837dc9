"""dp_helpers.scratch.ddp.mini_ddp: each step of DDP built by hand equals torch's DDP and one process (ranks in rank pools)."""

import contextlib
import random

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from dp_helpers.scratch.ddp import mini_ddp
from dp_helpers.tool.training import bce_loss


def mlp(seed: int) -> nn.Module:
    """Several layers and a bias-free one."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 32, bias=False), nn.ReLU(), nn.Linear(32, 1),
                         nn.Sigmoid())


def batches(steps: int = 3, per_rank: int = 8, world: int = 1):
    """The global batches of a run: (x, y) with world * per_rank rows each."""
    gen = torch.Generator().manual_seed(7)
    return [(torch.randn(world * per_rank, 10, generator=gen), torch.rand(world * per_rank, generator=gen))
            for _ in range(steps)]


def train(model, data, rank: int, world: int, per_rank: int = 8) -> dict:
    """SGD on this rank's slice of each global batch; the final weights."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for x, y in data:
        rows = slice(rank * per_rank, (rank + 1) * per_rank)
        opt.zero_grad()
        bce_loss(model(x[rows]), y[rows]).backward()
        opt.step()
    inner = getattr(model, "module", model)
    return {k: v.detach().clone() for k, v in inner.state_dict().items()}


# every step against DDP and one process: notebook 04 (hooks = averaging by hand, MiniDDP = DDP = one process on 2 and
# 3 ranks, 7 all-reduces per step per parameter) and, for models a user might bring on 1 to 4 ranks, the
# equivalence matrix (tests/matrix.py)


def accumulate(info) -> dict:
    """Two micro-batches per step, the first under no_sync: equal to one batch of both."""
    model, data = mini_ddp.MiniDDP(mlp(seed=0), bucket_cap_mb=0.004), batches(world=2 * info.world_size, per_rank=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for x, y in data:
        opt.zero_grad()
        for j in range(2):
            rows = slice((2 * info.rank + j) * 4, (2 * info.rank + j + 1) * 4)
            with model.no_sync() if j == 0 else torch.enable_grad():
                (bce_loss(model(x[rows]), y[rows]) / 2).backward()
        opt.step()
    return {"weights": model.module.state_dict(), "allreduces": model.allreduces, "buckets": len(model.buckets)}


@pytest.mark.slow
def test_no_sync_skips_the_first_micro_batch(pools):
    ranks = pools.get(2).run(accumulate)
    one = train(mlp(seed=0), batches(world=4, per_rank=4), 0, 1, per_rank=16)
    torch.testing.assert_close(ranks[0]["weights"], one)
    assert ranks[0]["allreduces"] == 3 * ranks[0]["buckets"]  # only the synced backward of each step


def timeline(info) -> list[dict]:
    """One recorded backward (after a warm-up step and a barrier, as in the notebook) of the bucketed wrapper on the wider MLP."""
    from dp_helpers.scripts import from_scratch

    return from_scratch.one_backward(from_scratch.RecordedMiniDDP(from_scratch.mlp(0, width=512, depth=4), bucket_cap_mb=1), info)


@pytest.mark.slow
def test_communication_starts_while_the_backward_runs(pools):
    ranks = pools.get(2).run(timeline)
    for events in ranks:  # the order of events, the same on any machine (how much the transfers overlap is timing)
        ready = [e["start"] for e in events if e["kind"] == "gradient ready"]
        bars = [e for e in events if e["kind"] == "all-reduce"]
        waited = [e["start"] for e in events if e["kind"] == "wait"]
        assert len(ready) == 9 and [e["name"] for e in bars] == [f"bucket {i}" for i in range(4)] and len(waited) == 1
        assert bars[0]["start"] < max(ready) < waited[0]  # bucket 0 left during the backward, the one wait after it
        assert all(e["end"] >= e["start"] for e in bars)  # every end was recorded


def broadcast_only(info) -> list[float]:
    """Each rank's first weight before and after broadcast_state."""
    model = mlp(seed=info.rank)
    before = model[0].weight[0, 0].item()
    mini_ddp.broadcast_state(model)
    return [before, model[0].weight[0, 0].item()]


@pytest.mark.slow
def test_without_the_broadcast_ranks_start_apart(pools):
    (b0, a0), (b1, a1) = pools.get(2).run(broadcast_only)
    assert b0 != b1 and a0 == a1 == b0


@pytest.mark.parametrize("seed", range(20))
def test_bucket_assignment_matches_torchs(seed):
    rng = random.Random(seed)
    sizes = [rng.choice([4, 40, 400, 4000, 40000]) * rng.randint(1, 9) for _ in range(rng.randint(1, 30))]
    cap = rng.choice([100, 4096, 50000, 2**20])
    tensors = [torch.zeros(s // 4) for s in sizes]
    expected, _ = dist._compute_bucket_assignment_by_size(tensors, [cap])
    assert mini_ddp.assign_buckets(sizes, cap) == [list(b) for b in expected]


def test_a_big_cap_makes_one_bucket_and_a_tiny_one_a_bucket_each():
    assert mini_ddp.assign_buckets([8, 8, 8], 1000) == [[0, 1, 2]]
    assert mini_ddp.assign_buckets([8, 8, 8], 1) == [[0], [1], [2]]


def test_a_bucket_that_never_filled_says_so():
    bucket = mini_ddp.Bucket([nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(2))])
    bucket.ready.add(bucket.params[0])
    with pytest.raises(RuntimeError, match="1 got no gradient in this backward"):
        bucket.finish()


def forward_inside_no_sync(info) -> list[bool]:
    """find_unused_parameters: a forward inside no_sync whose backward runs outside equals both outside; two forwards raise."""
    from dp_helpers.scripts.from_scratch import OptionalHead

    x, y = batches(1)[0]
    grads = []
    for inside in (False, True):
        model = mini_ddp.MiniDDP(OptionalHead(), bucket_cap_mb=1e-6, find_unused_parameters=True)
        with model.no_sync() if inside else contextlib.nullcontext():
            out = model(x, use_b=False)  # head b unused: found by the walk, also inside no_sync
        bce_loss(out, y).backward()
        grads.append([None if p.grad is None else p.grad.clone() for p in model.module.parameters()])
    model.zero_grad()
    loss = bce_loss(model(x, use_b=True), y) + bce_loss(model(x, use_b=False), y)  # the second forward's set is wrong
    with pytest.raises(RuntimeError, match=r"b\.(weight|bias) was marked ready twice"):
        loss.backward()
    return [a is b is None or torch.equal(a, b) for a, b in zip(*grads, strict=True)] + [grads[0][4] is None]


@pytest.mark.slow
def test_unused_parameters_come_from_the_forward_before_the_backward(pools):
    assert pools.get(1).run(forward_inside_no_sync)[0] == [True] * 7  # the last: b.weight.grad stays None, as with DDP


def test_unreached_finds_the_head_the_forward_skipped():
    from dp_helpers.scripts.from_scratch import OptionalHead

    model = OptionalHead()
    assert mini_ddp.unreached(model(torch.randn(4, 10), use_b=False), list(model.parameters())) == [model.b.weight, model.b.bias]
    assert mini_ddp.unreached(model(torch.randn(4, 10), use_b=True), list(model.parameters())) == []


def scratch_experiments(info, argv: list[str]) -> dict:
    """scripts/from_scratch.py's experiments on this rank, by name."""
    from dp_helpers.scripts import from_scratch

    args = from_scratch.parse_args(argv)
    return {name: from_scratch.EXPERIMENTS[name](info, args) for name in args.experiment}


def close(a: dict, b: dict) -> None:
    """Weights written as lists by the script, compared as tensors."""
    torch.testing.assert_close({k: torch.tensor(v) for k, v in a.items()}, {k: torch.tensor(v) for k, v in b.items()})


@pytest.mark.slow
def test_the_from_scratch_script(pools):
    from dp_helpers.scripts.from_scratch import train_alone

    argv = ["--experiment", "drift", "hooks", "accumulate", "unused", "proof", "sweep", "--caps", "0.1", "25",
            "--rounds", "1", "--steps", "1"]
    zero, one = pools.get(2).run(scratch_experiments, argv)
    assert zero["drift"]["without broadcast"] != one["drift"]["without broadcast"]  # averaged gradients, apart weights
    assert zero["drift"]["with broadcast"] == one["drift"]["with broadcast"]
    close(zero["hooks"]["hooks"], zero["hooks"]["by hand"])
    assert zero["hooks"]["allreduces_per_step"] == 7  # one per parameter: 4 weights, 3 biases
    for weights in (zero["accumulate"]["weights"], zero["proof"]["MiniDDP"], zero["proof"]["DDP"], one["proof"]["MiniDDP"]):
        close(weights, train_alone(world_size=2))
    runs = list(zero["unused"].values()) + list(one["unused"].values())
    for weights in runs[1:]:
        close(weights, runs[0])  # MiniDDP and DDP agree when head b is used on rank 0 only
    assert [r["mini_bucket_bytes"] == r["ddp_bucket_bytes"] for r in zero["sweep"]] == [True, True]
    assert [r["allreduces_per_step"] for r in zero["sweep"]] == [8, 1]


class HeadFirst(nn.Module):
    """The head is registered first but used last, so gradients become ready in an order registration does not give."""

    def __init__(self, width: int = 64):
        super().__init__()
        self.head, self.body = nn.Linear(width, 1), nn.Sequential(nn.Linear(10, width), nn.ReLU(), nn.Linear(width, width))

    def forward(self, x):
        return torch.sigmoid(self.head(torch.relu(self.body(x)))).squeeze(1)


class TwoOutputs(nn.Module):
    """Returns (prediction, auxiliary output); the loss uses only the first, so `aux` gets no gradient."""

    def __init__(self):
        super().__init__()
        self.body, self.head, self.aux = nn.Linear(10, 16), nn.Linear(16, 1), nn.Linear(16, 3)

    def forward(self, x):
        h = torch.relu(self.body(x))
        return torch.sigmoid(self.head(h)).squeeze(1), self.aux(h)


# tied weights, frozen layers and ignored outputs against one process: the equivalence matrix (tests/matrix.py)
CASES = {"head registered first": (HeadFirst, {}), "head registered first, cap 0.01 MiB": (HeadFirst, {"bucket_cap_mb": 0.01}),
         "an output the loss ignores": (TwoOutputs, {"find_unused_parameters": True, "bucket_cap_mb": 0.001})}


def train_case(model, data, rank: int, world: int) -> dict:
    """Three SGD steps with momentum on this rank's rows; the final weights and which gradients stayed None."""
    torch.manual_seed(0)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.3, momentum=0.9)
    rows = len(data[0][0]) // world
    for x, y in data:
        opt.zero_grad()
        out = model(x[rank * rows:(rank + 1) * rows])
        bce_loss(out[0] if isinstance(out, tuple) else out, y[rank * rows:(rank + 1) * rows]).backward()
        opt.step()
    inner = getattr(model, "module", model)
    return {"state": {k: v.detach().clone() for k, v in inner.state_dict().items()},
            "no_grad": [n for n, p in inner.named_parameters() if p.grad is None]}


def every_case(info) -> dict:
    """MiniDDP and DDP, same settings, per case: weights, gradients left None, bucket bytes after the rebuild."""
    out, data = {}, batches(world=info.world_size)
    for case, (make, kwargs) in CASES.items():
        for name, wrap in {"MiniDDP": mini_ddp.MiniDDP, "DDP": DDP}.items():
            torch.manual_seed(info.rank)  # different starts: the constructor's broadcast must fix them
            model = wrap(make(), **kwargs)
            out[case, name] = train_case(model, data, info.rank, info.world_size)
            out[case, name]["buckets"] = ([b.buffer.numel() * 4 for b in model.buckets] if name == "MiniDDP" else
                                          None if kwargs.get("find_unused_parameters") else
                                          [int(s) for s in str(model._get_ddp_logging_data()["rebuilt_bucket_sizes"]).split(",")])
            model.wait() if name == "MiniDDP" else None  # after the backward's own wait: a no-op
    return out


@pytest.mark.slow
def test_minddp_equals_ddp_and_one_process_beyond_a_plain_mlp(pools):
    ranks = pools.get(2).run(every_case)
    for case, (make, _) in CASES.items():
        torch.manual_seed(0)
        one = train_case(make(), batches(world=2), 0, 1)  # rank 0's start, the global batch
        for name in ("MiniDDP", "DDP"):
            got = ranks[0][case, name]
            torch.testing.assert_close(got["state"], one["state"], msg=lambda m, c=case, n=name: f"{c}, {n}: {m}")
            assert got["no_grad"] == one["no_grad"], (case, name)  # frozen and never-reached parameters keep .grad None
        mini, ddp = ranks[0][case, "MiniDDP"]["buckets"], ranks[0][case, "DDP"]["buckets"]
        assert ddp is None or mini == ddp, (case, mini, ddp)  # rebuilt along the observed order: DDP's buckets
    sizes = [p.numel() * 4 for p in HeadFirst().parameters()]
    guess = [sum(sizes[i] for i in group) for group in reversed(mini_ddp.assign_buckets(sizes, 2**20 // 100))]
    assert ranks[0]["head registered first, cap 0.01 MiB", "MiniDDP"]["buckets"] != guess  # the rebuild changed them
    assert ranks[0]["an output the loss ignores", "MiniDDP"]["no_grad"] == ["aux.weight", "aux.bias"]


def test_bucket_caps_are_ddps():
    assert mini_ddp.ddp_caps(None) == [2**20, 25 * 2**20]  # under the default, a small first bucket
    assert mini_ddp.ddp_caps(4) == [4 * 2**20]
    assert mini_ddp.assign_buckets([3, 3, 3, 3], [3, 6]) == [[0], [1, 2], [3]]
    with pytest.raises(ValueError, match="bucket_cap_mb must be a positive number"):
        mini_ddp.ddp_caps(0)


def recovers(info) -> dict:
    """Two backwards of one forward before the rebuild, backwards that raise at the start and halfway, a new wrapper."""
    model = mini_ddp.MiniDDP(mlp(seed=0), bucket_cap_mb=0.001)
    x, y = batches(1)[0]
    loss = bce_loss(model(x), y)
    loss.backward(retain_graph=True)
    loss.backward()  # the order is recorded once per parameter, not twice
    order = len(model.order)
    model.zero_grad()
    out = model(x)
    try:
        (out.sum() * float("nan")).backward(inputs=[out])  # a backward that never reaches the parameters' hooks
        bce_loss(out, y).backward(inputs=[next(model.module.parameters())])
    except RuntimeError:
        pass
    hidden = model.module[0](x)
    hidden.register_hook(lambda grad: 1 / 0)  # raises halfway: the last layers' buckets are already launched
    try:
        bce_loss(model.module[1:](hidden), y).backward()
    except ZeroDivisionError:
        pass
    model.zero_grad()
    bce_loss(model(x), y).backward()  # starts afresh
    again = mini_ddp.MiniDDP(model.module, bucket_cap_mb=0.001)  # a second wrapper over the same module takes over
    launched = model.allreduces
    bce_loss(again(x), y).backward()
    return {"order": order, "params": len(model.params), "grads": all(p.grad is not None for p in model.module.parameters()),
            "old wrapper's all-reduces": model.allreduces - launched, "new wrapper's": again.allreduces}


@pytest.mark.slow
def test_failed_backwards_and_a_second_wrapper_leave_minddp_working(pools):
    got = pools.get(1).run(recovers)[0]
    assert got["order"] == got["params"] and got["grads"]
    assert got["old wrapper's all-reduces"] == 0 and got["new wrapper's"] > 0
