"""Held-out accuracy against bytes sent, on the digits, for every way of communicating less, in one launch.

Run with run_ddp("dp_helpers.scripts.communicate_less", "--epochs", "4", world_size=2); rank 0 writes
accuracy_bytes.json: for each method, the values it handed to collectives per epoch (as bytes) and the held-out
accuracy after each epoch. Every method trains the digits CNN from the same start on the same shards:
DDP, DDP with the fp16 hook and our PowerSGD hook (SGD with momentum), local SGD (the same SGD, parameters averaged
every H steps), DiLoCo (inner AdamW, outer Nesterov SGD every H steps).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
    allreduce_hook,
    fp16_compress_hook,
)
from torch.nn.parallel import DistributedDataParallel as DDP

from dp_helpers import dist as dph
from dp_helpers.compression import PowerSGD
from dp_helpers.data import load_digits_split, make_loader
from dp_helpers.env import worker_numerics
from dp_helpers.local_sgd import DiLoCo, LocalSGD
from dp_helpers.models import build_model
from dp_helpers.tasks import held_out_scores


@dataclass(frozen=True)
class Config:
    """What every method shares."""

    epochs: int = 4
    batch_size: int = 32  # per rank
    lr: float = 0.05
    momentum: float = 0.9
    methods: tuple[str, ...] = ("DDP", "fp16", "PowerSGD r=1", "PowerSGD r=4", "local SGD H=4", "DiLoCo H=4",
                                "DiLoCo H=16")


def counted(hook, bytes_per_value: int):
    """A DDP communication hook that adds the bytes it hands to the all-reduce to state['bytes']."""
    def count(state, bucket):
        state["bytes"] += bucket.buffer().numel() * bytes_per_value
        return hook(None, bucket)
    return count


def build(method: str, cfg: Config):
    """(model to call, optimizer step, zero_grad, bytes so far) for one method, all from the same seed."""
    model = build_model("cnn", 1, seed=0)
    sgd = lambda params: torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum)  # noqa: E731
    if method.startswith("DiLoCo"):
        diloco = DiLoCo(model, torch.optim.AdamW(model.parameters(), lr=2e-3), period=int(method.split("H=")[1]))
        return model, diloco.step, diloco.inner.zero_grad, lambda: 4 * diloco.sent
    if method.startswith("local SGD"):
        local, opt = LocalSGD(model, period=int(method.split("H=")[1])), sgd(model.parameters())
        return model, lambda: (opt.step(), local.after_step()), opt.zero_grad, lambda: 4 * local.sent
    ddp, state = DDP(model), {"bytes": 0}
    if method.startswith("PowerSGD"):
        state = PowerSGD(rank=int(method.split("r=")[1]), start_iter=10)
        ddp.register_comm_hook(state, PowerSGD.hook)
        sent = lambda: 4 * state.sent  # noqa: E731
    else:
        ddp.register_comm_hook(state, counted(fp16_compress_hook if method == "fp16" else allreduce_hook,
                                              2 if method == "fp16" else 4))
        sent = lambda: state["bytes"]  # noqa: E731
    opt = sgd(ddp.parameters())
    return ddp, opt.step, opt.zero_grad, sent


def train(info: dph.DistInfo, method: str, cfg: Config) -> dict:
    """One method's run: bytes sent and held-out accuracy after each epoch."""
    model, step, zero_grad, sent = build(method, cfg)
    loader, sampler = make_loader(load_digits_split("train"), cfg.batch_size, info.rank, info.world_size, seed=0)
    held_out, row = load_digits_split("held_out"), {"bytes": [], "accuracy": []}
    for epoch in range(cfg.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            step()
        row["bytes"].append(sent())
        row["accuracy"].append(held_out_scores(getattr(model, "module", model), held_out, info.world_size,
                                               info.rank)["accuracy"])
    return row


def parse_args(argv=None) -> Config:
    """--epochs, --batch-size (per rank), --methods (comma-separated)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=Config.epochs)
    parser.add_argument("--batch-size", type=int, default=Config.batch_size)
    parser.add_argument("--methods", default=",".join(Config.methods))
    args = parser.parse_args(argv)
    return Config(epochs=args.epochs, batch_size=args.batch_size, methods=tuple(args.methods.split(",")))


@worker_numerics()
def main(info: dph.DistInfo) -> None:
    """Every method in turn; rank 0 writes accuracy_bytes.json (rank 0's counts, the same accuracy on every rank)."""
    cfg = parse_args()
    results = {method: train(info, method, cfg) for method in cfg.methods}
    dph.gather_to_file(info, results, "accuracy_bytes.json")


if __name__ == "__main__":
    dph.worker(main)
