"""dp_helpers.scratch.communicating_less.streaming_diloco: the fragments, the refusals, and 2 ranks against DiLoCo and
against a one-process emulation of the same schedule (a rank pool)."""

import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from dp_helpers.scratch.communicating_less.streaming_diloco import StreamingDiLoCo, equal_runs
from tests.conftest import REPO

STEPS, WORLD = 6, 2


def model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))  # 96 + 16 + 16 + 1 values


def data(rank: int, steps: int = STEPS) -> list:
    """This rank's own batches."""
    gen = torch.Generator().manual_seed(20 + rank)
    return [(torch.randn(8, 6, generator=gen), torch.randn(8, 1, generator=gen)) for _ in range(steps)]


def adamw(params):
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)


@pytest.mark.parametrize("sizes", [[96, 16, 16, 1], [100] * 8, [1, 1000, 1, 1, 1000], [5, 5, 5], [7]])
def test_fragments_are_equal_runs_of_every_value_in_order(sizes):
    total = sum(sizes)
    for parts in (1, 2, 3, 4, 7, total):
        runs = equal_runs(sizes, parts)
        values = [(i, v) for run in runs for i, a, b in run for v in range(a, b)]
        assert values == [(i, v) for i, n in enumerate(sizes) for v in range(n)]  # each value once, in order
        lengths = [sum(b - a for _, a, b in run) for run in runs]
        assert len(runs) == parts and set(lengths) <= {total // parts, -(-total // parts)}  # equal, to one value
    with pytest.raises(ValueError, match="non-empty"):
        equal_runs(sizes, total + 1)


def test_fragment_modules_must_hold_every_trained_parameter_once():
    m = model(0)
    for modules in ([m[0]], [m[0], m[0], m[2]], [m[0], m]):
        with pytest.raises(ValueError, match="every trained parameter"):
            StreamingDiLoCo(m, adamw(m.parameters()), 4, modules)


@pytest.mark.parametrize(("kwargs", "says"), [({"fragments": 0}, "fragments"), ({"fragments": 5}, "fragments"),
                                              ({"period": 2, "fragments": 3}, "fragments"),
                                              ({"delay": 2}, "delay"), ({"delay": -1}, "delay"),
                                              ({"alpha": 1.5}, "alpha")])
def test_a_schedule_that_cannot_run_is_refused_before_any_collective(kwargs, says):
    m = model(0)  # no process group here: a refusal that reached DiLoCo's broadcast would fail otherwise
    with pytest.raises(ValueError, match=says):
        StreamingDiLoCo(m, adamw(m.parameters()), **{"period": 4, "fragments": 2, **kwargs})


def ranks_train(info, period: int, fragments, delay: int, alpha: float, steps: int = STEPS) -> dict:
    from dp_helpers.scratch.communicating_less.local_sgd import DiLoCo

    out = {}
    for name, make in (("DiLoCo", lambda m: DiLoCo(m, adamw(m.parameters()), period)),
                       ("streaming", lambda m: StreamingDiLoCo(m, adamw(m.parameters()), period,
                                                               [m[0], m[2]] if fragments == "layers" else fragments,
                                                               delay, alpha))):
        m = model(info.rank)
        method = make(m)
        for x, y in data(info.rank, steps):
            method.zero_grad()
            nn.functional.mse_loss(m(x), y).backward()
            method.step()
        out[name + " before finish"] = {k: v.clone() for k, v in m.state_dict().items()}
        method.finish()
        out[name] = {k: v.clone() for k, v in m.state_dict().items()}
        out[name + " sent"], out[name + " largest"] = method.sent, getattr(method, "largest", None)
    return {**out, "rank": info.rank}


class Emulation:
    """Streaming DiLoCo in one process: WORLD workers from rank 0's start take turns; a fragment's mean lands later."""

    def __init__(self, period: int, fragments: int, delay: int, alpha: float):
        self.workers = [model(0) for _ in range(WORLD)]
        self.inner = [adamw(w.parameters()) for w in self.workers]
        self.runs = equal_runs([p.numel() for p in self.workers[0].parameters()], fragments)
        self.agreed = [self.values(self.workers[0], f).clone() for f in range(fragments)]
        self.outer = [torch.optim.SGD([a], lr=0.7, momentum=0.9, nesterov=True) for a in self.agreed]
        self.period, self.delay, self.alpha, self.pending = period, delay, alpha, {}

    def values(self, worker: nn.Module, f: int) -> torch.Tensor:
        """A view of fragment f's values of one worker, laid end to end (a copy: torch.cat)."""
        flat = nn.utils.parameters_to_vector(worker.parameters())
        return torch.cat([flat[self.start(i) + a:self.start(i) + b] for i, a, b in self.runs[f]]).detach()

    def start(self, i: int) -> int:
        return sum(p.numel() for p in list(self.workers[0].parameters())[:i])

    @torch.no_grad()
    def land(self, f: int, alpha: float) -> None:
        self.agreed[f].grad = self.pending.pop(f)[1]
        self.outer[f].step()
        for w in self.workers:
            flat = nn.utils.parameters_to_vector(w.parameters())
            offset = 0
            for i, a, b in self.runs[f]:
                span = slice(self.start(i) + a, self.start(i) + b)
                flat[span] = alpha * flat[span] + (1 - alpha) * self.agreed[f][offset:offset + b - a]
                offset += b - a
            nn.utils.vector_to_parameters(flat, w.parameters())

    def mean_delta(self, f: int) -> torch.Tensor:
        return sum((self.agreed[f] - self.values(w, f)) / WORLD for w in self.workers)

    def run(self) -> dict:
        sent = dict.fromkeys(range(len(self.runs)), 0)
        for step in range(1, STEPS + 1):
            for r, (w, opt) in enumerate(zip(self.workers, self.inner, strict=True)):
                x, y = data(r)[step - 1]
                opt.zero_grad()
                nn.functional.mse_loss(w(x), y).backward()
                opt.step()
            for f in range(len(self.runs)):  # fragment f lands after steps floor(H (f+1) / P) + kH, sent delay before
                if step % self.period == (self.period * (f + 1) // len(self.runs) - self.delay) % self.period:
                    self.pending[f], sent[f] = (step + self.delay, self.mean_delta(f)), step
            for f in [f for f, (lands, _) in self.pending.items() if lands == step]:
                self.land(f, self.alpha)
        for f in list(self.pending):  # the end: what is in flight lands, then each fragment trained since it was sent
            self.land(f, self.alpha)
        for f in range(len(self.runs)):
            self.pending[f] = (None, self.mean_delta(f) if sent[f] < STEPS else torch.zeros_like(self.agreed[f]))
            if sent[f] < STEPS:
                self.land(f, 0.0)
            else:
                self.pending.pop(f)
                self.take_agreed(f)
        return {k: v.clone() for k, v in self.workers[0].state_dict().items()}

    @torch.no_grad()
    def take_agreed(self, f: int) -> None:
        for w in self.workers:
            flat = nn.utils.parameters_to_vector(w.parameters())
            offset = 0
            for i, a, b in self.runs[f]:
                flat[self.start(i) + a:self.start(i) + b] = self.agreed[f][offset:offset + b - a]
                offset += b - a
            nn.utils.vector_to_parameters(flat, w.parameters())


@pytest.mark.slow
def test_streaming_diloco_equals_diloco_with_one_fragment_and_its_emulation_with_two(pools):
    psi = sum(p.numel() for p in model(0).parameters())
    for rank in pools.get(WORLD).run(ranks_train, 3, 1, 0, 0.0):  # one fragment, no delay: DiLoCo itself
        torch.testing.assert_close(rank["streaming"], rank["DiLoCo"], rtol=0, atol=0)
        assert rank["streaming sent"] == rank["DiLoCo sent"] == 2 * psi
    for rank in pools.get(WORLD).run(ranks_train, 4, 2, 1, 0.5):  # sent after steps 1, 3, 5; landing one step later
        torch.testing.assert_close(rank["streaming"], Emulation(4, 2, 1, 0.5).run())
        assert rank["streaming largest"] == 65  # of the 129 values DiLoCo sends at once: 64 and 65
        # sent after steps 1 (64), 3 (65) and 5 (64); at the end both once more (each trained since it was sent)
        assert rank["streaming sent"] == 64 + 65 + 64 + 64 + 65


@pytest.mark.long
@pytest.mark.slow
def test_streaming_diloco_equals_torchfts_on_the_same_layers_and_schedule(pools, tmp_path):
    pytest.importorskip("torchft", reason="torchft (optional, torch >= 2.7) is the reference here: pip install torchft")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    ran = subprocess.run([sys.executable, str(REPO / "tests" / "torchft_reference.py"), str(tmp_path / "ft.pt"),
                          "diloco", "4", "1", "0.5", "8"], env=env, capture_output=True, text=True, timeout=180)
    assert ran.returncode == 0, ran.stderr[-3000:]
    theirs = torch.load(tmp_path / "ft.pt")
    # the two layers as fragments, H = 4, sent one step before they land, half the local weights kept; 8 steps
    for rank in pools.get(WORLD).run(ranks_train, 4, "layers", 1, 0.5, 8):
        # torchft averages after the sum (ReduceOp.AVG), the course divides first: the last bits may differ
        torch.testing.assert_close(rank["streaming before finish"], theirs[rank["rank"]], rtol=1e-5, atol=1e-6)


@pytest.mark.long
@pytest.mark.slow
def test_on_the_digits_it_sends_dilocos_bytes_with_one_pth_at_a_time(tmp_path):
    from dp_helpers.tool.launch.run import run_ddp
    from dp_helpers.tool.models import build_model

    run = run_ddp("dp_helpers.scripts.communicate_less", "--epochs", "1", "--methods",
                  "DiLoCo H=4,Streaming DiLoCo H=4 P=2 tau=1,Streaming DiLoCo H=8 P=4 tau=1", world_size=2, echo=False,
                  out_dir=tmp_path / "run")
    rows = json.loads((run.run_dir / "accuracy_bytes.json").read_text())[0]
    psi = sum(p.numel() for p in build_model("cnn", 1, seed=0).parameters())
    assert rows["Streaming DiLoCo H=4 P=2 tau=1"]["bytes"] == rows["DiLoCo H=4"]["bytes"]  # the same values in all
    assert rows["Streaming DiLoCo H=4 P=2 tau=1"]["peak"] == 4 * -(-psi // 2)  # but half of them at a time
    assert rows["Streaming DiLoCo H=8 P=4 tau=1"]["peak"] == 4 * -(-psi // 4)
    assert all(0.3 < row["accuracy"][-1] for row in rows.values())  # all of them learn (10 classes: 0.1 by chance)
