"""dp_helpers.scratch.dataparallel.scatter_gather: the four steps match one forward and backward, with DataParallel's edge cases."""

import pytest
import torch
from torch import nn

from dp_helpers.scratch.dataparallel import scatter_gather as dp
from dp_helpers.tool.env import gpu_devices
from dp_helpers.tool.models import build_model


@pytest.fixture
def model():
    return build_model("mlp", 6, seed=0)


@pytest.mark.parametrize("rows, n, sizes", [(30, 8, [4] * 7 + [2]), (10, 8, [2] * 5), (3, 8, [1, 1, 1]), (8, 8, [1] * 8)])
def test_scatter_uses_chunk_sizes(rows, n, sizes):
    pieces = dp.scatter((torch.arange(rows),), dp.cpu_devices(n))
    assert [len(p[0]) for p in pieces] == sizes
    assert torch.equal(torch.cat([p[0] for p in pieces]), torch.arange(rows))


@pytest.mark.parametrize("rows, n", [(30, 8), (10, 8), (3, 4), (7, 1)])
def test_four_steps_equal_one_forward(model, rows, n):
    x = torch.randn(rows, 6)
    torch.testing.assert_close(dp.data_parallel(model, x, dp.cpu_devices(n)), model(x))


def test_fewer_rows_than_devices_uses_fewer_replicas(model, monkeypatch):
    made = []
    real = dp.replicate
    monkeypatch.setattr(dp, "replicate", lambda m, devices: made.append(len(devices)) or real(m, devices))
    dp.data_parallel(model, torch.randn(3, 6), dp.cpu_devices(8))
    assert made == [3]


def test_kwargs_tuples_and_dicts(model):
    class Multi(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, x, *, scale, extra=None):
            out = self.inner(x) * scale
            return out, {"double": 2 * out, "rows": x}, None if extra is None else extra + 0

    x, scale = torch.randn(10, 6), torch.full((10, 1), 3.0)
    got = dp.data_parallel(Multi(), x, dp.cpu_devices(4), scale=scale, extra=None)
    want = Multi()(x, scale=scale, extra=None)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    assert got[2] is None


def test_scattered_kwargs_and_shared_objects():
    pieces, kw = dp.scatter_kwargs((torch.arange(5), "tag"), {"w": torch.arange(5), "k": 2}, dp.cpu_devices(2))
    assert [p[0].tolist() for p in pieces] == [[0, 1, 2], [3, 4]] and [p[1] for p in pieces] == ["tag", "tag"]
    assert [k["w"].tolist() for k in kw] == [[0, 1, 2], [3, 4]] and [k["k"] for k in kw] == [2, 2]
    pieces, kw = dp.scatter_kwargs((), {"x": torch.arange(4)}, dp.cpu_devices(2))
    assert pieces == ((), ()) and len(kw) == 2


def test_gradients_sum_into_the_original_module(model):
    x, y = torch.randn(30, 6), torch.rand(30, 1)
    model.zero_grad()
    nn.functional.binary_cross_entropy(model(x), y).backward()
    expected = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    nn.functional.binary_cross_entropy(dp.data_parallel(model, x, dp.cpu_devices(8)), y).backward()
    torch.testing.assert_close({k: p.grad for k, p in model.named_parameters()}, expected)


def test_gradient_accumulates_across_calls(model):
    x = torch.randn(12, 6)
    model.zero_grad()
    for _ in range(2):
        dp.data_parallel(model, x, dp.cpu_devices(3)).sum().backward()
    first = model.net[0].weight.grad.clone()
    model.zero_grad()
    (2 * model(x).sum()).backward()
    torch.testing.assert_close(first, model.net[0].weight.grad)


def test_only_device_0_buffer_updates_survive():
    bn, twin = nn.BatchNorm1d(4), nn.BatchNorm1d(4)
    replicas = dp.replicate(bn, dp.cpu_devices(2))
    assert replicas[0].running_mean is bn.running_mean  # device 0's replica shares storage
    assert replicas[1].running_mean is not bn.running_mean
    x = torch.randn(8, 4) + 5
    dp.data_parallel(bn, x, dp.cpu_devices(2))
    twin(x[:4])  # what device 0 saw: the first chunk
    torch.testing.assert_close(bn.running_mean, twin.running_mean)
    assert int(bn.num_batches_tracked) == 1  # device 1's update went nowhere


def test_replica_error_names_the_replica():
    class Picky(nn.Module):
        def forward(self, x):
            if len(x) < 3:
                raise ValueError("too few rows")
            return x

    with pytest.raises(ValueError, match="Caught ValueError in replica 1: too few rows"):
        dp.data_parallel(Picky(), torch.randn(5, 2), dp.cpu_devices(2))


def test_no_grad_reaches_the_threads(model):
    with torch.no_grad():
        out = dp.data_parallel(model, torch.randn(6, 6), dp.cpu_devices(3))
    assert not out.requires_grad


def test_scalar_outputs_become_a_vector_with_a_warning():
    class Loss(nn.Module):
        def forward(self, x):
            return x.sum()

    with pytest.warns(UserWarning, match="unsqueezed into a vector"):
        out = dp.data_parallel(Loss(), torch.ones(6, 2), dp.cpu_devices(3))
    torch.testing.assert_close(out, torch.tensor([4.0, 4.0, 4.0]))


def test_bad_device_count_and_byte_counts(model):
    with pytest.raises(ValueError, match="must be >= 1, got 0"):
        dp.cpu_devices(0)
    params = sum(p.numel() for p in model.parameters()) * 4
    assert dp.replication_bytes(model, 4) == 3 * params
    assert dp.tensor_bytes({"a": torch.zeros(3), "b": (torch.zeros(2, dtype=torch.float64), 1)}) == 28
    assert not dp.is_real(dp.cpu_devices(2))


def test_training_with_the_four_steps_matches_one_device():
    x, y = torch.randn(40, 6), torch.rand(40, 1)
    single, parallel = build_model("mlp", 6, seed=1), build_model("mlp", 6, seed=1)
    opt_s, opt_p = torch.optim.SGD(single.parameters(), lr=0.5), torch.optim.SGD(parallel.parameters(), lr=0.5)
    for step in range(5):
        rows = slice(8 * step, 8 * step + 8)
        for model, opt, forward in ((single, opt_s, single), (parallel, opt_p, None)):
            opt.zero_grad()
            out = model(x[rows]) if forward else dp.data_parallel(model, x[rows], dp.cpu_devices(3))
            nn.functional.binary_cross_entropy(out, y[rows]).backward()
            opt.step()
    torch.testing.assert_close(parallel.state_dict(), single.state_dict())


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 1, reason=f"needs a CUDA GPU, found {torch.cuda.device_count()}")
def test_emulation_matches_the_real_primitives(model):
    devices = gpu_devices()
    x = torch.randn(30, 6)
    real = dp.data_parallel(model.to(devices[0]), x.to(devices[0]), devices)
    emulated = dp.data_parallel(model.cpu(), x, dp.cpu_devices(len(devices)))
    torch.testing.assert_close(real.cpu(), emulated, rtol=1e-4, atol=1e-5)


def test_loss_in_forward_keeps_the_gradient_and_sends_scalars(model):
    x, y = torch.randn(30, 6), torch.rand(30)
    model.zero_grad()
    nn.functional.binary_cross_entropy(model(x), y.unsqueeze(1)).backward()
    expected = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    sums = dp.data_parallel(dp.LossInForward(model), (x, y), dp.cpu_devices(8))
    assert sums.shape == (8,)  # one scalar per replica travels to device 0
    (sums.sum() / len(x)).backward()
    torch.testing.assert_close({k: p.grad for k, p in model.named_parameters()}, expected)


def test_the_module_wrapper_trains_like_one_device():
    x, y = torch.randn(24, 6), torch.rand(24)
    single, wrapped = build_model("mlp", 6, seed=2), dp.DataParallelModule(build_model("mlp", 6, seed=2), dp.cpu_devices(3))
    for model in (single, wrapped):
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        for _ in range(3):
            opt.zero_grad()
            nn.functional.binary_cross_entropy(model(x), y.unsqueeze(1)).backward()
            opt.step()
    torch.testing.assert_close(wrapped.module.state_dict(), single.state_dict())
    with pytest.raises(ValueError, match="at least one device"):
        dp.DataParallelModule(single, [])
