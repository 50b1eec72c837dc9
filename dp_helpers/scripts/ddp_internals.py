"""DDP's buckets, overlap and communication hooks, measured on a wide MLP (taught in notebook 04).

--experiment timeline: when each layer's gradient is ready and when each bucket's all-reduce runs.
--experiment sweep: all-reduces and step time for several bucket_cap_mb, with and without
gradient_as_bucket_view. --experiment fp16: fp16_compress_hook's bytes and its effect on the weights.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
    allreduce_hook,
    fp16_compress_hook,
)
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP

from dp_helpers import dist as dph
from dp_helpers.models import MLP, build_model


def wide_mlp(info: dph.DistInfo) -> torch.nn.Module:
    """Six hidden layers of 512: about 1.4 M parameters (5.6 MB of float32 gradients)."""
    torch.manual_seed(0)
    return MLP(256, hidden=512, depth=6).to(info.device)


def batch(info: dph.DistInfo, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's synthetic batch for a step (different on every rank, as a sampler would make it)."""
    gen = torch.Generator().manual_seed(1000 * step + info.rank)
    return torch.randn(64, 256, generator=gen).to(info.device), torch.rand(64, 1, generator=gen).to(info.device)


def step_once(model, info: dph.DistInfo, step: int) -> None:
    """Forward and backward one batch (gradients are all-reduced by DDP during the backward)."""
    x, y = batch(info, step)
    model.zero_grad(set_to_none=True)
    torch.nn.functional.binary_cross_entropy(model(x), y).backward()


def timed_hook(state: dict, bucket):
    """DDP's all-reduce, noting when each bucket's all-reduce starts and when it completes."""
    start, index, size = time.perf_counter() - state["t0"], bucket.index(), bucket.buffer().numel() * 4

    def done(fut):
        """Runs when the all-reduce completes (on the backend's thread)."""
        state["events"].append({"kind": "all-reduce", "name": f"bucket {index}", "start": start,
                                "end": time.perf_counter() - state["t0"], "bytes": size})
        return fut.value()

    return allreduce_hook(None, bucket).then(done)


def timeline(info: dph.DistInfo, cap_mb: float) -> list[dict]:
    """One recorded backward: a 'ready' event per layer's gradient and an all-reduce event per bucket."""
    model, state = DDP(wide_mlp(info), bucket_cap_mb=cap_mb), {"events": [], "t0": 0.0}
    model.register_comm_hook(state, timed_hook)
    for i, layer in enumerate(m for m in model.module.modules() if isinstance(m, torch.nn.Linear)):
        # fires when the weight's gradient has been accumulated: the moment DDP counts it as ready
        layer.weight.register_post_accumulate_grad_hook(lambda p, i=i: state["events"].append(
            {"kind": "gradient ready", "name": f"layer {i}", "start": time.perf_counter() - state["t0"]}))
    for step in range(3):  # warm-up: DDP rebuilds its buckets after the first iteration
        step_once(model, info, step)
    state["events"].clear()
    dist.barrier()
    state["t0"] = time.perf_counter()
    step_once(model, info, 3)
    state["events"].append({"kind": "backward done", "name": "step", "start": time.perf_counter() - state["t0"]})
    return state["events"]


def count_hook(state: dict, bucket):
    """DDP's all-reduce, counting the calls."""
    state["calls"] += 1
    return allreduce_hook(None, bucket)


def sweep(info: dph.DistInfo, caps: list[float], steps: int = 8) -> list[dict]:
    """All-reduces per step and mean step time for each bucket size, with and without gradient_as_bucket_view."""
    rows = []
    for view in (False, True):
        for cap in caps:
            model, state = DDP(wide_mlp(info), bucket_cap_mb=cap, gradient_as_bucket_view=view), {"calls": 0}
            model.register_comm_hook(state, count_hook)
            for step in range(2):
                step_once(model, info, step)
            state["calls"], start = 0, time.perf_counter()
            for step in range(steps):
                step_once(model, info, step)
            rows.append({"bucket_cap_mb": cap, "gradient_as_bucket_view": view,
                         "allreduces_per_step": state["calls"] / steps,
                         "step_seconds": (time.perf_counter() - start) / steps})
    return rows


def train_with_hook(info: dph.DistInfo, hook, steps: int) -> tuple[list[float], dict, int]:
    """A small model trained with a comm hook: losses, final weights, and bytes handed to all_reduce."""
    model, sent = DDP(build_model("mlp", 10, seed=0).to(info.device)), [0]
    real_all_reduce = dist.all_reduce

    def counting_all_reduce(tensor, *args, **kwargs):
        """dist.all_reduce, adding the tensor's bytes to the count."""
        sent[0] += tensor.numel() * tensor.element_size()
        return real_all_reduce(tensor, *args, **kwargs)

    dist.all_reduce = counting_all_reduce  # measure what the hook really sends
    try:
        model.register_comm_hook(None, hook)
        opt, losses = torch.optim.SGD(model.parameters(), lr=0.5), []
        for step in range(steps):
            x, y = torch.randn(32, 10, generator=torch.Generator().manual_seed(step * 10 + info.rank)), None
            y = (x.sum(1, keepdim=True) > 0).float()
            opt.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy(model(x.to(info.device)), y.to(info.device))
            loss.backward()
            opt.step()
            losses.append(loss.item())
    finally:
        dist.all_reduce = real_all_reduce
    return losses, {k: v.cpu().tolist() for k, v in model.module.state_dict().items()}, sent[0]


def fp16(info: dph.DistInfo, steps: int = 30) -> dict:
    """The same training with DDP's default all-reduce and with fp16_compress_hook."""
    out = {}
    for name, hook in (("fp32", allreduce_hook), ("fp16", fp16_compress_hook)):
        losses, weights, sent = train_with_hook(info, hook, steps)
        out[name] = {"losses": losses, "weights": weights, "bytes": sent}
    return out


@record
def main() -> None:
    """Run the chosen experiment on every rank; rank 0 writes <experiment>.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", choices=("timeline", "sweep", "fp16"), required=True)
    parser.add_argument("--bucket-cap-mb", type=float, default=1.0)
    parser.add_argument("--caps", type=float, nargs="+", default=[0.25, 1.0, 4.0, 25.0])
    args = parser.parse_args()
    info = dph.setup()
    try:
        run = {"timeline": lambda: timeline(info, args.bucket_cap_mb), "sweep": lambda: sweep(info, args.caps),
               "fp16": lambda: fp16(info)}[args.experiment]
        dph.gather_to_file(info, run(), f"{args.experiment}.json")
    finally:
        dph.teardown()


if __name__ == "__main__":
    dph.exit_after(main)
