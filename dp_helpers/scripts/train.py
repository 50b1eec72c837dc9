"""The seed's DDP example made correct: sampler with set_epoch, rank-0 output, derived device, clean teardown (taught in notebook 03).

Run it through `python -m dp_helpers train`, or directly:
    python -m torch.distributed.run --standalone --nproc-per-node 2 -m dp_helpers.scripts.train --out runs/x
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP

from dp_helpers import dist as dph
from dp_helpers.collectives import assert_identical_across_ranks, average_gradients
from dp_helpers.config import TrainConfig, config_from_args, validate, worker_parser
from dp_helpers.data import make_loader, make_synthetic, shard_plan
from dp_helpers.env import seed_everything
from dp_helpers.metrics import MetricsWriter
from dp_helpers.models import build_model
from dp_helpers.training import make_optimizer, train_step


def epoch_mean_loss(loss_sum: float, count: int, info: dph.DistInfo) -> float:
    """The sample-weighted mean loss of this epoch over all ranks (one all-reduce, called by every rank)."""
    totals = torch.tensor([loss_sum, float(count)], dtype=torch.float64, device=info.device)
    dist.all_reduce(totals)
    return (totals[0] / totals[1]).item()


def wrap_model(model, cfg: TrainConfig, info: dph.DistInfo):
    """DDP's wrapper, or the bare model whose weights rank 0 broadcasts, as DDP's constructor would."""
    if cfg.sync == "ddp":
        return DDP(model, device_ids=[info.device] if info.device.type != "cpu" else None)
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    return model


def after_backward(cfg: TrainConfig):
    """What runs between backward() and step(): the hand-written all-reduce and/or the identical-gradients check."""
    actions = ([average_gradients] if cfg.sync == "manual" else []) + \
        ([lambda m: assert_identical_across_ranks([p.grad for p in m.parameters()])] if cfg.check_grads else [])
    return (lambda model: [act(model) for act in actions]) if actions else None


def run_epoch(epoch: int, step: int, model, loader, optimizer, writer: MetricsWriter,
              info: dph.DistInfo, hook=None) -> tuple[int, float, int]:
    """Train one epoch; returns the next global step, this rank's loss sum and sample count."""
    loss_sum, count = 0.0, 0
    for inputs, targets in loader:
        loss = train_step(model, inputs.to(info.device), targets.to(info.device), optimizer, hook).item()
        writer.log(epoch=epoch, step=step, loss=loss, samples=len(inputs))
        loss_sum, count, step = loss_sum + loss * len(inputs), count + len(inputs), step + 1
    return step, loss_sum, count


def save_outputs(out: Path, model, summary: dict) -> None:
    """Rank 0 only: the unwrapped state_dict and the summary, each written whole then renamed into place."""
    tmp = out / "model.pt.tmp"
    torch.save({k: v.cpu() for k, v in getattr(model, "module", model).state_dict().items()}, tmp)
    os.replace(tmp, out / "model.pt")
    (out / "summary.json.tmp").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    os.replace(out / "summary.json.tmp", out / "summary.json")


def train(cfg: TrainConfig, out: Path, info: dph.DistInfo) -> dict:
    """Train with DDP and return the summary (every rank runs every collective; rank 0 reports)."""
    seed_everything(cfg.seed)
    dataset = make_synthetic(cfg.samples, cfg.dim, cfg.seed)
    model = build_model(cfg.model, cfg.dim, cfg.seed).to(info.device)
    model = wrap_model(model, cfg, info)
    loader, sampler = make_loader(dataset, cfg.batch_size, info.rank, info.world_size, cfg.seed)
    optimizer = make_optimizer(model, cfg.lr)
    plan, epoch_losses, step, start = shard_plan(cfg.samples, info.world_size, cfg.batch_size), [], 0, time.perf_counter()
    with MetricsWriter(out, info.rank, info.world_size) as writer:
        for epoch in range(cfg.epochs):
            sampler.set_epoch(epoch)  # without it every epoch repeats the same order
            step, loss_sum, count = run_epoch(epoch, step, model, loader, optimizer, writer, info, after_backward(cfg))
            epoch_losses.append(epoch_mean_loss(loss_sum, count, info))
            dph.print0(info, f"epoch {epoch + 1}/{cfg.epochs}  loss={epoch_losses[-1]:.6f}  steps={step}")
    summary = {"config": cfg.as_dict(), "world_size": info.world_size, "backend": info.backend, "sync": cfg.sync,
               "device": str(info.device), "global_batch_size": info.world_size * cfg.batch_size,
               "steps": step, "epoch_losses": epoch_losses, "final_loss": epoch_losses[-1],
               "padded_samples_per_epoch": plan.padded, "last_batch_size": plan.last_batch,
               "equivalent_to_large_batch": plan.equivalent_to_large_batch, "equivalence": plan.explain(),
               "train_seconds": round(time.perf_counter() - start, 3), "torch": torch.__version__}
    if info.is_main:
        save_outputs(out, model, summary)
    return summary


@record
def main(argv: list[str] | None = None) -> None:
    """Parse flags, join the group, train, always tear down."""
    args = worker_parser().parse_args(argv)
    cfg = config_from_args(args)
    info = dph.setup()
    try:
        validate(cfg, info.world_size)
        train(cfg, Path(args.out), info)
    finally:
        dph.teardown()


if __name__ == "__main__":
    main()
