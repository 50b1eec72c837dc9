"""Timings for `python -m dp_helpers bench`, one process per rank: training throughput, all-reduce time (notebook 09)."""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial

import torch
import torch.distributed as dist

from dp_helpers.scratch.collectives.ring import ring_all_reduce
from dp_helpers.scratch.dataparallel.scatter_gather import DataParallelModule, cpu_devices
from dp_helpers.scripts.train import LOCAL, comm_totals, local_optimizer, register_comm
from dp_helpers.tool import dist as dph
from dp_helpers.tool.config import TrainConfig
from dp_helpers.tool.env import gpu_devices
from dp_helpers.tool.models import MLP
from dp_helpers.tool.training import (
    PRECISIONS,
    grad_scaler,
    mixed_precision_step,
    precision_problem,
    train_step,
)

COMMS = ("allreduce", "fp16", "powersgd", "local-sgd", "diloco")  # train's --comm choices, timed side by side


def sync(devices) -> None:
    """Wait for work queued on these devices, so the clock measures it (a no-op on CPU)."""
    for device in devices:
        if torch.device(device).type != "cpu":
            torch.cuda.synchronize(device)


def clocked(fn, devices) -> float:
    """Seconds one call of fn takes, every rank starting the clock together, queued device work included."""
    sync(devices)
    dist.barrier()
    start = time.perf_counter()
    fn()
    sync(devices)
    return time.perf_counter() - start


def repeat(step, n: int) -> None:
    """Call step n times: one timed window."""
    for _ in range(n):
        step()


def timed_rounds(steps: dict, args, devices) -> dict[str, float]:
    """Median seconds of `rounds` windows of `steps` steps per named step function, the windows alternating."""
    for step in steps.values():
        repeat(step, args.warmup)
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():  # alternate: a noisy moment on a shared machine hits every variant
            times[name].append(clocked(partial(repeat, step, args.steps), devices))
    return {name: statistics.median(t) for name, t in times.items()}


def throughputs(models: dict, batch: int, args, info: dph.DistInfo, devices=None) -> dict[str, float]:
    """Samples per second this rank trains each model at, in the requested precision, measured interleaved."""
    x, y = torch.randn(batch, args.dim, device=info.device), torch.rand(batch, device=info.device)
    steps = {}
    for name, model in models.items():
        opt, scaler = torch.optim.SGD(model.parameters(), lr=1e-3), grad_scaler(info.device, args.precision)
        steps[name] = partial(mixed_precision_step, model, x, y, opt, scaler, args.precision)
    rounds = timed_rounds(steps, args, devices or [info.device])
    return {name: batch * args.steps / t for name, t in rounds.items()}


def bench_model(args, info: dph.DistInfo) -> torch.nn.Module:
    """The benchmark MLP on this rank's device, the same weights everywhere."""
    torch.manual_seed(0)
    return MLP(args.dim, hidden=args.hidden, depth=args.depth).to(info.device)


def by_model(rates: dict[int, dict[str, float]]) -> dict[str, dict[str, float]]:
    """{batch: {model: rate}} -> {model: {batch: rate}}, batches as strings (JSON keys)."""
    names = next(iter(rates.values()))
    return {name: {str(b): r[name] for b, r in rates.items()} for name in names}


def train_mode(args, info: dph.DistInfo) -> dict:
    """Per batch size: a model training alone ("independent") and, with --ddp, a DDP model, in the same processes."""
    models = {"independent": bench_model(args, info)}  # never communicates: the machine's ceiling
    if args.ddp:
        models["ddp"] = dph.wrap_ddp(bench_model(args, info), info)
    return by_model({b: throughputs(models, b, args, info) for b in args.batches})


def dataparallel(model: torch.nn.Module, n: int, info: dph.DistInfo) -> tuple[torch.nn.Module, list]:
    """Real nn.DataParallel over n GPUs, or the CPU emulation over n threads; with the devices it computes on."""
    if info.device.type == "cpu":
        return DataParallelModule(model, cpu_devices(n)), [info.device]
    devices = gpu_devices()
    if len(devices) < n:
        raise ValueError(f"DataParallel over {n} GPUs asked for, but {len(devices)} visible.")
    return torch.nn.DataParallel(model, device_ids=devices[:n]), devices[:n]


def dataparallel_mode(args, info: dph.DistInfo) -> dict:
    """Per device count n: one process drives n devices, each step n x the per-device batch, as DDP's n ranks take."""
    rates = {}
    for n in args.devices:
        model, devices = dataparallel(bench_model(args, info), n, info)
        rates[str(n)] = by_model({b: throughputs({"dataparallel": model}, b * n, args, info, devices)
                                  for b in args.batches})
    return rates


def timed(fns: dict, tensor: torch.Tensor, repeats: int, info: dph.DistInfo) -> dict[str, list[float]]:
    """Seconds of every call of each collective; the calls alternate, so a noisy moment hits all of them."""
    for fn in fns.values():  # warm-up: connections, buffers
        fn(tensor.clone())
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            work = tensor.clone()  # a fresh input each call, copied before the clock starts
            times[name].append(clocked(partial(fn, work), [info.device]))
    return times


def allreduce_mode(args, info: dph.DistInfo) -> list[dict]:
    """dist.all_reduce and ring_all_reduce times for each message size."""
    rows = []
    for mib in args.sizes:
        tensor = torch.randn(max(1, int(mib * 2**20 / 4)), device=info.device)
        times = timed({"all_reduce": dist.all_reduce, "ring": ring_all_reduce}, tensor, args.repeats, info)
        # the median is what a job sees on this machine; the best call is the algorithm without scheduling noise
        rows.append({"bytes": tensor.numel() * 4, **{f"{name}_s": statistics.median(t) for name, t in times.items()},
                     **{f"{name}_best_s": min(t) for name, t in times.items()}})
    return rows


def comm_step(method: str, args, info: dph.DistInfo):
    """One SGD step of the benchmark MLP under a --comm method, set up as train sets it up, and its bytes sent so far."""
    cfg, comm = TrainConfig(comm=method, powersgd_rank=args.powersgd_rank, period=args.period), {"allreduces": 0, "bytes": 0}
    model = bench_model(args, info)
    if method not in LOCAL:  # local SGD and DiLoCo: no DDP, the ranks step alone and average every --period steps
        model = dph.wrap_ddp(model, info)
        register_comm(model, cfg, comm, start_iter=2)  # PowerSGD: every timed step after the warm-up is compressed
    opt = local_optimizer(cfg, model, torch.optim.SGD(model.parameters(), lr=1e-3), comm)
    x, y = torch.randn(args.comm_batch, args.dim, device=info.device), torch.rand(args.comm_batch, device=info.device)
    return partial(train_step, model, x, y, opt), lambda: comm_totals(comm, model)[1]


def comm_mode(args, info: dph.DistInfo) -> dict:
    """Seconds per step and bytes sent per step of each --comm method, the methods' timed windows alternating."""
    built = {m: comm_step(m, args, info) for m in COMMS}
    for step, _ in built.values():
        repeat(step, max(args.warmup, 2))  # PowerSGD's first 2 steps are uncompressed
    before = {m: sent() for m, (_, sent) in built.items()}
    timed_args = argparse.Namespace(**{**vars(args), "warmup": 0})
    seconds = timed_rounds({m: step for m, (step, _) in built.items()}, timed_args, [info.device])
    steps = args.rounds * args.steps
    return {m: {"step_s": seconds[m] / args.steps, "bytes_per_step": (sent() - before[m]) / steps}
            for m, (_, sent) in built.items()}


MODES = {"train": train_mode, "dataparallel": dataparallel_mode, "allreduce": allreduce_mode, "comm": comm_mode}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The worker's flags (bench.py builds them)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", nargs="+", choices=MODES, required=True,
                        help="what to measure, one after the other in the same processes")
    parser.add_argument("--ddp", action=argparse.BooleanOptionalAction, default=True,
                        help="train mode: also time a DDP model, alternating with the independent one")
    parser.add_argument("--devices", type=int, nargs="+", default=[2],
                        help="dataparallel mode: the devices one process drives, one measurement per count")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32")
    parser.add_argument("--batches", type=int, nargs="+", default=[64])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--sizes", type=float, nargs="+", default=[1.0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--powersgd-rank", type=int, default=4, help="comm mode: PowerSGD's rank")
    parser.add_argument("--period", type=int, default=4, help="comm mode: local SGD's and DiLoCo's H")
    parser.add_argument("--comm-batch", type=int, default=64, help="comm mode: the batch per process")
    return parser.parse_args(argv)


def measure(info: dph.DistInfo, argv: list[str] | None = None) -> dict:
    """This rank's measurements, {mode: result}, in the modes the flags ask for (each launch pays seconds of start-up)."""
    args = parse_args(argv)
    problem = precision_problem(info.device, args.precision)
    if problem:
        raise ValueError(problem)
    return {mode: MODES[mode](args, info) for mode in args.mode}


def main(info: dph.DistInfo) -> None:
    """Measure on every rank; rank 0 writes bench.json with every rank's numbers."""
    dph.gather_to_file(info, measure(info), "bench.json")


if __name__ == "__main__":
    dph.worker(main)
