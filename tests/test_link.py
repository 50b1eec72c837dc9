"""The emulated link: its arithmetic, its refusals, and on real processes every collective delayed, results unchanged."""

import json

import pytest

from dp_helpers.tool.launch import run_ddp
from dp_helpers.tool.link import Link, collective_time, main, parse_link, torch_too_old
from dp_helpers.tool.request import UsageError, check_link


@pytest.mark.parametrize(("text", "bandwidth", "latency"), [
    ("1gbit,20us", 125e6, 20e-6), ("100Gbit/s, 10 µs", 12.5e9, 10e-6), ("12.5GB/s,5us", 12.5e9, 5e-6),
    ("800mbit", 100e6, 0.0), ("10Gbps,0.5ms", 1.25e9, 5e-4), ("1Gb/s,1e-3s", 125e6, 1e-3)])
def test_a_link_reads_bits_bytes_and_latency_units(text, bandwidth, latency):
    link = parse_link(text)
    assert link.bandwidth == pytest.approx(bandwidth) and link.latency == pytest.approx(latency)


@pytest.mark.parametrize(("text", "said"), [("fast", "got 'fast'"), ("1gbit,20", "needs a unit"),
                                            ("1gbit,2us,3", "BANDWIDTH[,LATENCY]"), ("0gbit", "must be positive")])
def test_a_link_that_cannot_be_read_is_refused_in_one_sentence(text, said):
    with pytest.raises(ValueError, match=said.replace("[", r"\[").replace("]", r"\]")):
        parse_link(text)


def test_ring_times_follow_the_alpha_beta_model():
    link = Link(bandwidth=1e9, latency=1e-5)
    assert collective_time("all_reduce", 8e6, 1, link) == 0.0  # one rank: nothing crosses a link
    assert collective_time("all_reduce", 8e6, 4, link) == pytest.approx(6 * 1e-5 + 1.5 * 8e6 / 1e9)
    assert collective_time("all_gather", 8e6, 4, link) == pytest.approx(3 * 1e-5 + 0.75 * 8e6 / 1e9)
    assert collective_time("reduce_scatter", 8e6, 4, link) == collective_time("all_gather", 8e6, 4, link)
    assert collective_time("barrier", 0, 2, link) == pytest.approx(2e-5)


def test_a_torch_before_2_7_is_refused_with_the_reason():
    assert "needs torch >= 2.7 (this is 2.6.0+cu124)" in torch_too_old("2.6.0+cu124")
    assert torch_too_old("2.7.0") is None and torch_too_old("2.13.0+cpu") is None
    if torch_too_old():  # the oldest torch the course admits
        with pytest.raises(UsageError, match="needs torch >= 2.7"):
            check_link("1gbit,20us", "gloo")


@pytest.mark.skipif(torch_too_old() is not None, reason="an emulated link needs torch >= 2.7 (refused: tested above)")
def test_a_link_is_refused_for_nccl_and_for_a_bad_form_before_anything_starts(write_script, tmp_path):
    check_link(None, "nccl")
    check_link("1gbit,20us", "gloo")
    with pytest.raises(UsageError, match="wraps gloo between CPU processes; this run would use nccl"):
        check_link("1gbit", "nccl")
    with pytest.raises(UsageError, match="got 'quick'"):
        run_ddp(write_script("print('never runs')"), link="quick", out_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv", [["1gbit"], ["1gbit", "-m"], ["--help"]])
def test_the_module_says_how_to_use_it(argv):
    with pytest.raises(SystemExit, match=r"^usage: torchrun \[torchrun flags\] -m dp_helpers.tool.link LINK"):
        main(argv)


# every collective a run makes, on one link: torch.distributed's own, DDP's buckets (issued by its C++ reducer),
# FSDP2's all-gathers and reduce-scatters, the course's MiniDDP and a subgroup's; rank 0 writes what crossed it
EVERY_COLLECTIVE = """
import json, os, sys, time
import torch, torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from dp_helpers.scratch.ddp.mini_ddp import MiniDDP
from dp_helpers.tool.link import transfers

dist.init_process_group("gloo")
rank = dist.get_rank()
seen = {}
t = torch.ones(250_000)  # 1 MB
dist.all_reduce(t)
start = time.perf_counter()
dist.all_reduce(t)
seen["all_reduce_s"] = time.perf_counter() - start

def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)

def loss_of(model, x, y):
    return ((model(x) - y) ** 2).mean()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))
alone = [p.detach().clone().requires_grad_() for p in model.parameters()]
ddp = torch.nn.parallel.DistributedDataParallel(model)
x, y = data()
loss_of(ddp, x[rank * 4:(rank + 1) * 4], y[rank * 4:(rank + 1) * 4]).backward()
reference = torch.func.functional_call(model, dict(zip([n for n, _ in model.named_parameters()], alone)), (x,))
torch.autograd.backward(((reference - y) ** 2).mean())
seen["ddp_equals_one_process"] = all(torch.allclose(p.grad, a.grad, atol=1e-6) for p, a in zip(model.parameters(), alone))

from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
hooked = torch.nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 1)))
state = powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=2)
hooked.register_comm_hook(state, powerSGD_hook.powerSGD_hook)  # its callbacks wait on later all-reduces
for _ in range(3):
    loss_of(hooked, x, y).backward()
mini = MiniDDP(nn.Linear(16, 1), bucket_cap_mb=1)
loss_of(mini, x, y).backward()
sharded = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 1))
for layer in sharded:
    fully_shard(layer)
loss_of(sharded, x, y).backward()
pair = dist.new_group([0, 1])
dist.all_reduce(torch.ones(4), group=pair)
seen["subgroup_kinds"] = [t.kind for t in transfers(pair)]
seen["kinds"] = sorted({t.kind for t in transfers()})
seen["transfers"] = [[t.kind, t.nbytes, t.seconds, t.finished - t.started] for t in transfers()]
if rank == 0:
    with open(os.path.join(os.environ["DP_RUN_DIR"], "seen.json"), "w") as f:
        json.dump(seen, f)
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.skipif(torch_too_old() is not None, reason="an emulated link needs torch >= 2.7")
def test_every_collective_of_a_run_crosses_the_link_and_results_do_not_change(write_script, tmp_path):
    result = run_ddp(write_script(EVERY_COLLECTIVE), world_size=2, out_dir=tmp_path / "run", link="1gbit,2ms",
                     timeout=120)
    seen = json.loads((result.run_dir / "seen.json").read_text())
    # 1 MB all-reduced by 2 ranks: 2 latency steps of 2 ms, and 1 MB at 125 MB/s; gloo's own loopback time on top
    assert 0.012 <= seen["all_reduce_s"] < 0.5
    assert seen["kinds"] == ["all_gather", "all_reduce", "broadcast", "reduce_scatter"]
    assert seen["subgroup_kinds"] == ["all_reduce"] and seen["ddp_equals_one_process"]
    held = [(kind, slept) for kind, _, seconds, slept in seen["transfers"] if slept < seconds]
    assert not held, f"transfers that held the link for less than their modelled time: {held}"
