"""DDP's own buckets and communication hooks, measured on a wide MLP (taught in notebook 05; precision in 09).

(Notebook 04 draws the overlap of all-reduces with the backward and sweeps the bucket cap with its own MiniDDP.)
--experiment buckets: the bytes of every bucket at steps 0, 1, 2 (DDP rebuilds its buckets once).
--experiment memory: bytes held by gradients and buckets, with and without gradient_as_bucket_view.
--experiment fp16: fp16_compress_hook's bytes and its effect on the weights.
--experiment precision: bytes all-reduced under autocast, with and without a compression hook.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
    allreduce_hook,
    bf16_compress_hook,
    fp16_compress_hook,
)
from torch.nn.parallel import DistributedDataParallel as DDP

from dp_helpers.tool import dist as dph
from dp_helpers.tool.models import MLP, build_model
from dp_helpers.tool.training import autocast, bce_loss


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
    bce_loss(model(x), y).backward()


def recording_hook(state: dict, bucket):
    """DDP's all-reduce, noting each bucket's bytes and the storage it lives in."""
    buffer = bucket.buffer()
    state["buckets"].append(buffer.numel() * buffer.element_size())
    state["storages"][buffer.untyped_storage().data_ptr()] = buffer.untyped_storage().nbytes()
    return allreduce_hook(None, bucket)


def recorded_steps(info: dph.DistInfo, steps: int, **ddp_kwargs) -> tuple[DDP, list[dict]]:
    """Train the wide MLP for `steps` steps; per step: the bytes of each bucket all-reduced, and the seconds taken."""
    model, state, per_step = DDP(wide_mlp(info), **ddp_kwargs), {"buckets": [], "storages": {}}, []
    model.register_comm_hook(state, recording_hook)
    for step in range(steps):
        state["buckets"], state["storages"], start = [], {}, time.perf_counter()
        step_once(model, info, step)
        per_step.append({"buckets": state["buckets"], "seconds": time.perf_counter() - start,
                         "bucket_storages": state["storages"]})
    return model, per_step


def buckets(info: dph.DistInfo) -> list[dict]:
    """Bucket sizes at steps 0, 1, 2 for the default cap, explicit caps, and find_unused_parameters."""
    settings = [("default", {}), ("bucket_cap_mb=25", {"bucket_cap_mb": 25}), ("bucket_cap_mb=1", {"bucket_cap_mb": 1}),
                ("bucket_cap_mb=0.25", {"bucket_cap_mb": 0.25}), ("find_unused_parameters", {"find_unused_parameters": True})]
    rows = []
    for name, kwargs in settings:
        _, per_step = recorded_steps(info, 3, **kwargs)
        rows.append({"setting": name, "bucket_bytes_per_step": [s["buckets"] for s in per_step]})
    return rows


def gradient_memory(info: dph.DistInfo) -> list[dict]:
    """Bytes held by gradients and buckets, with and without gradient_as_bucket_view (counted after 3 steps)."""
    rows = []
    for view in (False, True):
        model, per_step = recorded_steps(info, 3, gradient_as_bucket_view=view)
        buckets_held = per_step[-1]["bucket_storages"]
        grads = {p.grad.untyped_storage().data_ptr(): p.grad.untyped_storage().nbytes() for p in model.parameters()}
        rows.append({"gradient_as_bucket_view": view, "parameter_bytes": sum(p.nbytes for p in model.parameters()),
                     "gradient_storages": len(grads), "bytes_held": sum({**grads, **buckets_held}.values())})
    return rows


def train_with_hook(info: dph.DistInfo, hook, steps: int, precision: str = "fp32") -> dict:
    """A small model trained with a comm hook (under autocast unless fp32): losses, weights, bytes sent, .grad dtype."""
    model = DDP(build_model("mlp", 10, seed=0).to(info.device))
    model.register_comm_hook(None, hook)  # DDP calls hook(state, bucket) for each bucket instead of its all-reduce
    opt, losses = torch.optim.SGD(model.parameters(), lr=0.5), []
    with bytes_all_reduced() as sent:  # instrumentation: what the hook really hands to all_reduce
        for step in range(steps):
            x = torch.randn(32, 10, generator=torch.Generator().manual_seed(step * 10 + info.rank))
            y = (x.sum(1, keepdim=True) > 0).float()
            opt.zero_grad()
            with autocast(info.device, precision):  # notebook 09: the forward's matrix products in bf16/fp16
                out = model(x.to(info.device))
            loss = bce_loss(out.float(), y.to(info.device))
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return {"losses": losses, "weights": {k: v.cpu().tolist() for k, v in model.module.state_dict().items()},
            "bytes": sent[0], "grad_dtype": str(next(model.parameters()).grad.dtype)}


@contextlib.contextmanager
def bytes_all_reduced():
    """Inside the block, dist.all_reduce also adds each tensor's bytes to the yielded count (a one-item list)."""
    real_all_reduce, sent = dist.all_reduce, [0]

    def counting_all_reduce(tensor, *args, **kwargs):
        """dist.all_reduce, adding the tensor's bytes to the count."""
        sent[0] += tensor.numel() * tensor.element_size()
        return real_all_reduce(tensor, *args, **kwargs)

    dist.all_reduce = counting_all_reduce
    try:
        yield sent
    finally:
        dist.all_reduce = real_all_reduce


def fp16(info: dph.DistInfo, steps: int = 30) -> dict:
    """The same training with DDP's default all-reduce and with fp16_compress_hook."""
    return {name: train_with_hook(info, hook, steps) for name, hook in (("fp32", allreduce_hook),
                                                                         ("fp16", fp16_compress_hook))}


def precision(info: dph.DistInfo, steps: int = 5) -> dict:
    """Bytes all-reduced: fp32, autocast bf16 (gradients stay fp32), autocast with a compression hook."""
    runs = {"fp32": (allreduce_hook, "fp32"), "autocast bf16": (allreduce_hook, "bf16"),
            "autocast bf16 + fp16_compress_hook": (fp16_compress_hook, "bf16"),
            "autocast bf16 + bf16_compress_hook": (bf16_compress_hook, "bf16")}
    out = {}
    for name, (hook, prec) in runs.items():
        try:
            out[name] = train_with_hook(info, hook, steps, prec)
        # register_comm_hook refuses bf16_compress_hook unless this build has CUDA/ROCm with NCCL >= 2.10, or XPU
        # with XCCL: a check of the installation, whatever backend the group uses
        except TypeError as exc:
            out[name] = {"error": str(exc)}
    return out


EXPERIMENTS = {
    "buckets": lambda info, args: buckets(info),
    "memory": lambda info, args: gradient_memory(info),
    "fp16": lambda info, args: fp16(info),
    "precision": lambda info, args: precision(info),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The experiments to run and their settings."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", choices=sorted(EXPERIMENTS), nargs="+", required=True)
    return parser.parse_args(argv)


def main(info: dph.DistInfo) -> None:
    """Run the chosen experiments on every rank; rank 0 writes <experiment>.json for each."""
    args = parse_args()
    dph.write_experiments(info, EXPERIMENTS, args.experiment, args)  # several in one launch: one start-up


if __name__ == "__main__":
    dph.worker(main)
