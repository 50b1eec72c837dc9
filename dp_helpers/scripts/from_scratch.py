"""DDP from scratch, measured step by step next to torch's DDP (notebook 04 runs it).

Run with run_ddp("dp_helpers.scripts.from_scratch", "--experiment", "drift", "hooks", ..., world_size=2);
rank 0 writes <experiment>.json with every rank's result.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from dp_helpers.scratch.collectives.ring import average_gradients
from dp_helpers.scratch.ddp import mini_ddp
from dp_helpers.tool import dist as dph
from dp_helpers.tool.env import worker_numerics
from dp_helpers.tool.training import bce_loss


def mlp(seed: int, width: int = 32, depth: int = 3) -> nn.Module:
    """An MLP with `depth` hidden layers (the second one without bias), seeded."""
    torch.manual_seed(seed)
    layers, dim = [], 10
    for i in range(depth):
        layers += [nn.Linear(dim, width, bias=i != 1), nn.ReLU()]
        dim = width
    return nn.Sequential(*layers, nn.Linear(dim, 1), nn.Sigmoid())


def global_batch(step: int, world_size: int, rows: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of `step`: world_size * rows samples, the same on every rank."""
    gen = torch.Generator().manual_seed(step)
    return torch.randn(world_size * rows, 10, generator=gen), torch.rand(world_size * rows, generator=gen)


def batch(info: dph.DistInfo, step: int, rows: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's rows of the global batch of `step`."""
    x, y = global_batch(step, info.world_size, rows)
    mine = slice(info.rank * rows, (info.rank + 1) * rows)
    return x[mine], y[mine]


def train(model: nn.Module, info: dph.DistInfo, steps: int = 5, average=None, **forward) -> dict:
    """SGD steps; `average(model)` between backward and step when the model does not all-reduce itself; the weights."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(steps):
        x, y = batch(info, step)
        opt.zero_grad()
        bce_loss(model(x, **forward), y).backward()
        if average:
            average(model)
        opt.step()
    return weights(model)


def weights(model: nn.Module) -> dict:
    """The (unwrapped) model's parameters as lists, ready for JSON."""
    return {name: p.tolist() for name, p in getattr(model, "module", model).named_parameters()}


@worker_numerics()  # as a rank computes: its thread count
def train_alone(world_size: int, steps: int = 5) -> dict:
    """The reference: one process, rank 0's initial weights, the whole global batch at every step."""
    model = mlp(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(steps):
        x, y = global_batch(step, world_size)
        opt.zero_grad()
        bce_loss(model(x), y).backward()
        opt.step()
    return weights(model)


def drift(info: dph.DistInfo, args) -> dict:
    """Averaged gradients from different starting weights, without and with broadcast_state."""
    apart = train(mlp(seed=info.rank), info, average=average_gradients)
    synced = mlp(seed=info.rank)
    mini_ddp.broadcast_state(synced)
    return {"without broadcast": apart, "with broadcast": train(synced, info, average=average_gradients)}


def hooks(info: dph.DistInfo, args) -> dict:
    """HookAllReduce next to notebook 03's average after backward: the weights, and all-reduces per step."""
    hooked = mini_ddp.HookAllReduce(mlp(seed=info.rank))
    by_hand = mlp(seed=info.rank)
    mini_ddp.broadcast_state(by_hand)
    return {"hooks": train(hooked, info), "by hand": train(by_hand, info, average=average_gradients),
            "allreduces_per_step": hooked.allreduces / 5}


class Timeline:
    """Notes when each gradient became ready and when each all-reduce started and ended (notebook 04's figure)."""

    def __init__(self):
        self.events, self.ends, self.t0 = [], [], time.perf_counter()

    def clock(self) -> float:
        """Seconds since t0 (set t0 = time.perf_counter() to time one backward from its start)."""
        return time.perf_counter() - self.t0

    def note(self, kind: str, name: str) -> None:
        """Record an instant: a gradient ready, the engine callback's wait."""
        self.events.append({"kind": kind, "name": name, "start": self.clock()})

    def timed(self, work, name: str, tensor: torch.Tensor) -> None:
        """Record an all-reduce: started now, ended when the backend completes the work (on the backend's thread)."""
        event = {"kind": "all-reduce", "name": name, "start": self.clock(), "bytes": tensor.numel() * tensor.element_size()}
        self.events.append(event)
        self.ends.append(work.get_future().then(lambda fut: event.update(end=self.clock())))

    def wait(self) -> None:
        """Wait until every recorded all-reduce has its end time."""
        for end in self.ends:
            end.wait()
        self.ends = []


class Recording:
    """Mixed into AsyncAllReduce or MiniDDP: the same steps, each also noted on a Timeline while `timeline` is set."""

    timeline: Timeline | None = None

    def __init__(self, module: nn.Module, *args, **kwargs):
        super().__init__(module, *args, **kwargs)
        self.label = {p: name for name, p in module.named_parameters()}

    def reduce(self, param: nn.Parameter) -> None:
        """Note the ready gradient, then reduce as the wrapper does."""
        if self.timeline is not None and self.sync:
            self.timeline.note("gradient ready", self.label[param])
        super().reduce(param)

    def launch(self, param: nn.Parameter) -> None:
        """Launch as the wrapper does; time what it handed to the backend (a tensor's all-reduce, or full buckets)."""
        first = getattr(self, "next", None)
        super().launch(param)
        if self.timeline is None:
            return
        if first is None:  # AsyncAllReduce: one all-reduce per parameter
            self.timeline.timed(self.pending[-1], self.label[param], param.grad)
        for k in range(first or 0, getattr(self, "next", 0)):  # MiniDDP: the buckets this gradient completed
            self.timeline.timed(self.buckets[k].work, f"bucket {k}", self.buckets[k].buffer)

    def finish_backward(self) -> None:
        """Note the engine callback's wait (every gradient is ready by then), wait, and collect the end times."""
        if self.timeline is not None:
            self.timeline.note("wait", "engine callback")
        super().finish_backward()
        if self.timeline is not None:
            self.timeline.wait()


class RecordedAsyncAllReduce(Recording, mini_ddp.AsyncAllReduce):
    """AsyncAllReduce, recorded."""


class RecordedMiniDDP(Recording, mini_ddp.MiniDDP):
    """MiniDDP, recorded."""


def timeline(info: dph.DistInfo, args) -> dict:
    """One backward's events (after a warm-up step) of AsyncAllReduce and of MiniDDP on a wider MLP."""
    wrappers = {"one all-reduce per parameter": RecordedAsyncAllReduce,
                f"buckets of {args.bucket_cap_mb:g} MiB": lambda m: RecordedMiniDDP(m, args.bucket_cap_mb)}
    return {name: one_backward(wrap(mlp(0, width=512, depth=4)), info) for name, wrap in wrappers.items()}


def one_backward(model, info: dph.DistInfo) -> list[dict]:
    """The events of one timed backward, after a warm-up step."""
    train(model, info, steps=1)
    model.timeline = Timeline()  # from now on the hooks note every event
    x, y = batch(info, 99)
    torch.distributed.barrier()  # both ranks start the timed backward together
    loss = bce_loss(model(x), y)
    model.timeline.t0 = time.perf_counter()
    loss.backward()  # the engine callback waits for the all-reduces before backward() returns
    model.timeline.events.append({"kind": "backward done", "name": "step", "start": model.timeline.clock()})
    return model.timeline.events


def sweep(info: dph.DistInfo, args) -> list[dict]:
    """For each bucket cap: MiniDDP's and DDP's bucket sizes, and both median step times, measured alternately."""
    rows = []
    for cap in args.caps:
        models = {"MiniDDP": mini_ddp.MiniDDP(sweep_model(args.width, args.depth), cap),
                  "DDP": DDP(sweep_model(args.width, args.depth), bucket_cap_mb=cap)}
        seconds = step_times(models, info, args.rounds, args.steps)
        mini = models["MiniDDP"]
        rows.append({"bucket_cap_mb": cap, "step_seconds": seconds,
                     "allreduces_per_step": mini.allreduces / (args.rounds * args.steps + 2),
                     "mini_bucket_bytes": [b.buffer.numel() * b.buffer.element_size() for b in mini.buckets],
                     "ddp_bucket_bytes": ddp_buckets(models["DDP"])})
    return rows


def sweep_model(width: int = 256, depth: int = 8) -> nn.Module:
    """By default eight 256-wide layers: 256 KiB of gradient per hidden weight, so the cap decides the buckets."""
    return mlp(0, width=width, depth=depth)


def ddp_buckets(model: DDP) -> list[int]:
    """DDP's bucket sizes in bytes after its rebuild (its logging data)."""
    return [int(s) for s in str(model._get_ddp_logging_data()["rebuilt_bucket_sizes"]).split(",")]


def step_times(models: dict, info: dph.DistInfo, rounds: int, steps: int) -> dict:
    """Median seconds per step of each model on the same batches, two warm-up steps then alternating rounds."""
    times = {name: [] for name in models}
    for model in models.values():
        train(model, info, steps=2)  # DDP rebuilds its buckets at its second forward
    for _ in range(rounds):
        for name, model in models.items():
            start = time.perf_counter()
            train(model, info, steps=steps)
            times[name].append((time.perf_counter() - start) / steps)
    return {name: statistics.median(t) for name, t in times.items()}


def accumulate(info: dph.DistInfo, args) -> dict:
    """Two micro-batches per step, the first backward under no_sync: the weights and all-reduces per step."""
    model = mini_ddp.MiniDDP(mlp(seed=info.rank), bucket_cap_mb=0.004)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(5):
        (x1, x2), (y1, y2) = (t.chunk(2) for t in batch(info, step))
        opt.zero_grad()
        with model.no_sync():  # only a local backward: the gradients add up in .grad
            (bce_loss(model(x1), y1) / 2).backward()
        (bce_loss(model(x2), y2) / 2).backward()  # all-reduces the sum of both
        opt.step()
    return {"weights": weights(model), "allreduces_per_step": model.allreduces / 5, "buckets": len(model.buckets)}


class OptionalHead(nn.Module):
    """A body and two heads, a and b; head b joins the output only when the forward is asked to use it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body, self.a, self.b = nn.Linear(10, 16), nn.Linear(16, 1), nn.Linear(16, 1)

    def forward(self, x: torch.Tensor, use_b: bool) -> torch.Tensor:
        """sigmoid(a(h) [+ b(h)]), h = relu(body(x))."""
        h = torch.relu(self.body(x))
        return torch.sigmoid(self.a(h) + self.b(h) if use_b else self.a(h)).squeeze(1)


UNUSED = {"MiniDDP(find_unused_parameters=True)": lambda m: mini_ddp.MiniDDP(m, find_unused_parameters=True),
          "MiniDDP(find_unused_parameters=True), a bucket per tensor":
              lambda m: mini_ddp.MiniDDP(m, bucket_cap_mb=1e-6, find_unused_parameters=True),
          "DDP(find_unused_parameters=True)": lambda m: DDP(m, find_unused_parameters=True),
          "DDP(static_graph=True)": lambda m: DDP(m, static_graph=True)}


def unused(info: dph.DistInfo, args) -> dict:
    """Head b is used on rank 0 only: the weights each wrapper that handles it trains to."""
    return {name: train(wrap(OptionalHead()), info, use_b=info.rank == 0) for name, wrap in UNUSED.items()}


def unused_hang(info: dph.DistInfo, args) -> None:
    """The same model under plain DDP: rank 1 never produces head b's gradients (this run fails)."""
    model = DDP(OptionalHead())
    for step in range(3):
        x, y = batch(info, step)
        bce_loss(model(x, use_b=info.rank == 0), y).backward()
        print(f"step {step}: backward done", flush=True)


def cost(info: dph.DistInfo, args) -> dict:
    """Median step times with and without the unused-parameter search, every parameter used."""
    models = {"DDP": DDP(sweep_model()), "DDP(find_unused_parameters=True)": DDP(sweep_model(), find_unused_parameters=True),
              "DDP(static_graph=True)": DDP(sweep_model(), static_graph=True), "MiniDDP": mini_ddp.MiniDDP(sweep_model()),
              "MiniDDP(find_unused_parameters=True)": mini_ddp.MiniDDP(sweep_model(), find_unused_parameters=True)}
    return step_times(models, info, args.rounds, args.steps)


def proof(info: dph.DistInfo, args) -> dict:
    """MiniDDP and DDP from different initial weights on every rank: the weights after training."""
    return {"MiniDDP": train(mini_ddp.MiniDDP(mlp(seed=info.rank), bucket_cap_mb=0.004), info),
            "DDP": train(DDP(mlp(seed=info.rank)), info)}


EXPERIMENTS = {"drift": drift, "hooks": hooks, "timeline": timeline, "sweep": sweep, "accumulate": accumulate,
               "unused": unused, "unused_hang": unused_hang, "cost": cost, "proof": proof}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Which experiments, and their settings."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", choices=sorted(EXPERIMENTS), nargs="+", required=True)
    parser.add_argument("--caps", type=float, nargs="+", default=[0.1, 0.3, 0.6, 1.0, 25.0], help="bucket caps in MiB")
    parser.add_argument("--bucket-cap-mb", type=float, default=1.0, help="the timeline's bucket cap")
    parser.add_argument("--width", type=int, default=256, help="the sweep model's hidden width")
    parser.add_argument("--depth", type=int, default=8, help="the sweep model's hidden layers")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    return parser.parse_args(argv)


def main(info: dph.DistInfo) -> None:
    """Run the chosen experiments on every rank; rank 0 writes <experiment>.json for each."""
    args = parse_args()
    dph.write_experiments(info, EXPERIMENTS, args.experiment, args)


if __name__ == "__main__":
    dph.worker(main)
