"""Held-out accuracy against bytes sent, on the digits, for every way of communicating less, in one launch.

Run with run_ddp("dp_helpers.scripts.communicate_less", "--epochs", "4", world_size=2); rank 0 writes
accuracy_bytes.json: for each method, the bytes it handed to collectives by the end of each epoch, the held-out
accuracy of rank 0's weights after each epoch and rank 0's final weights. Every method trains the digits CNN from the same start on the same
shards: DDP, DDP with the fp16 hook, our PowerSGD hook (with and without error feedback) and torch's
(SGD with momentum); local SGD (the same SGD, parameters averaged every H steps: ours, and torch's
PeriodicModelAverager); DiLoCo (inner AdamW, outer Nesterov SGD every H steps); Streaming DiLoCo when asked for.
"""

from __future__ import annotations

import argparse
import copy
import re
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
    allreduce_hook,
    fp16_compress_hook,
)
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.nn.parallel import DistributedDataParallel as DDP

from dp_helpers.scratch.communicating_less.compression import PowerSGD
from dp_helpers.scratch.communicating_less.local_sgd import DiLoCo, LocalSGD
from dp_helpers.scratch.ddp.mini_ddp import broadcast_state
from dp_helpers.tool import dist as dph
from dp_helpers.tool.data import load_digits_split, make_loader
from dp_helpers.tool.env import worker_numerics
from dp_helpers.tool.models import build_model
from dp_helpers.tool.tasks import held_out_scores


@dataclass(frozen=True)
class Config:
    """What every method shares."""

    epochs: int = 4
    batch_size: int = 32  # per rank
    lr: float = 0.05
    momentum: float = 0.9
    methods: tuple[str, ...] = ("DDP", "fp16", "PowerSGD r=1", "PowerSGD r=1 (torch)", "PowerSGD r=1 without error feedback",
                                "PowerSGD r=4", "local SGD H=1", "local SGD H=4", "PeriodicModelAverager H=4",
                                "DiLoCo H=4", "DiLoCo H=16")


def number(method: str, key: str) -> int:
    """The value of "r=4" or "H=16" in a method's name."""
    return int(re.search(rf"\b{key}=(\d+)", method)[1])


def counted(hook, bytes_per_value: int):
    """A DDP communication hook that adds the bytes it hands to the all-reduce to state['bytes']."""
    def count(state, bucket):
        """Count, then all-reduce as the wrapped hook does."""
        state["bytes"] += bucket.buffer().numel() * bytes_per_value
        return hook(None, bucket)
    return count


def build(method: str, cfg: Config, device: torch.device):
    """(model to call, optimizer step, zero_grad, bytes so far) for one method, all from the same seed."""
    model = build_model("cnn", 1, seed=0).to(device)
    sgd = lambda params: torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum)  # noqa: E731
    if method.startswith("DiLoCo"):
        diloco = DiLoCo(model, torch.optim.AdamW(model.parameters(), lr=2e-3), period=number(method, "H"))
        return model, diloco.step, diloco.inner.zero_grad, lambda: 4 * diloco.sent
    if method.startswith(("local SGD", "PeriodicModelAverager")):
        return local_sgd(model, method, sgd(model.parameters()))
    ddp, state = DDP(model), {"bytes": 0}
    if method.startswith("PowerSGD") and "torch" in method:
        torch_state = PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=10)
        ddp.register_comm_hook(torch_state, powerSGD_hook)  # its values are ours: the same algorithm, checked
        sent = lambda: None  # noqa: E731
    elif method.startswith("PowerSGD"):
        state = PowerSGD(rank=number(method, "r"), start_iter=10, error_feedback="without error" not in method)
        ddp.register_comm_hook(state, PowerSGD.hook)
        sent = lambda: 4 * state.sent  # noqa: E731
    else:
        ddp.register_comm_hook(state, counted(fp16_compress_hook if method == "fp16" else allreduce_hook,
                                              2 if method == "fp16" else 4))
        sent = lambda: state["bytes"]  # noqa: E731
    opt = sgd(ddp.parameters())
    return ddp, opt.step, opt.zero_grad, sent


def local_sgd(model: nn.Module, method: str, opt: torch.optim.Optimizer):
    """Local SGD, ours or torch's PeriodicModelAverager (given the same start): parameters averaged every H steps."""
    period = number(method, "H")
    if method.startswith("local SGD"):
        local = LocalSGD(model, period=period)
        return model, lambda: (opt.step(), local.after_step()), opt.zero_grad, lambda: 4 * local.sent
    broadcast_state(model)
    averager = PeriodicModelAverager(period=period)
    return model, lambda: (opt.step(), averager.average_parameters(model.parameters())), opt.zero_grad, lambda: None


def streaming(method: str, cfg: Config, device: torch.device):
    """Streaming DiLoCo (notebook 11), as "Streaming DiLoCo H=4 P=2 tau=1": DiLoCo's optimizers, P fragments."""
    # imported here, not at the top: notebook 10 shows this file's first functions by their line numbers
    from dp_helpers.scratch.communicating_less.streaming_diloco import StreamingDiLoCo

    model = build_model("cnn", 1, seed=0).to(device)
    sd = StreamingDiLoCo(model, torch.optim.AdamW(model.parameters(), lr=2e-3), period=number(method, "H"),
                         fragments=number(method, "P"), delay=number(method, "tau"))

    def sent() -> int:
        """Bytes handed to all-reduces so far."""
        return 4 * sd.sent

    sent.peak = lambda: 4 * sd.largest  # the most bytes one synchronisation sent
    return model, sd.step, sd.zero_grad, sent


def train(info: dph.DistInfo, method: str, cfg: Config) -> dict:
    """One method's run: bytes sent and held-out accuracy after each epoch (and, where known, the peak per sync)."""
    model, step, zero_grad, sent = (streaming if method.startswith("Streaming") else build)(method, cfg, info.device)
    loader, sampler = make_loader(load_digits_split("train"), cfg.batch_size, info.rank, info.world_size, seed=0)
    held_out, row = load_digits_split("held_out"), {"bytes": [], "accuracy": []}
    for epoch in range(cfg.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            zero_grad()
            nn.functional.cross_entropy(model(x.to(info.device)), y.to(info.device)).backward()
            step()
        row["bytes"].append(sent())
        judged = copy.deepcopy(getattr(model, "module", model))  # between meetings the ranks' weights differ:
        broadcast_state(judged)  # every rank scores rank 0's (not counted: it is not training traffic)
        row["accuracy"].append(held_out_scores(judged, held_out, info.world_size, info.rank)["accuracy"])
    row["weights"] = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
    row["peak"] = getattr(sent, "peak", lambda: None)()
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
