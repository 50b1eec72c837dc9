"""The source article's DDP example made correct: sampler with set_epoch, rank-0 output, derived device, clean teardown (notebooks 03, 05).

Run it through `python -m dp_helpers train`, under torchrun:
    python -m torch.distributed.run --standalone --nproc-per-node 2 -m dp_helpers.scripts.train --out runs/x
or alone, as a group of one process that a debugger can step through:
    python dp_helpers/scripts/train.py --epochs 2
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from dp_helpers import dist as dph
from dp_helpers import zero
from dp_helpers.collectives import (
    GlobalBatchNorm1d,
    assert_identical_across_ranks,
    average_gradients,
)
from dp_helpers.config import TrainConfig, config_from_args, validate, worker_parser
from dp_helpers.data import make_loader, make_synthetic, shard_plan
from dp_helpers.metrics import MetricsWriter, metrics_dir
from dp_helpers.models import build_model
from dp_helpers.runs import write_atomic, write_text_atomic
from dp_helpers.training import accumulate_step, make_optimizer, seed_everything


def counting_hook(state: dict, bucket):
    """DDP's default all-reduce, counting the buckets and bytes it sends."""
    state["allreduces"] += 1
    state["bytes"] += bucket.buffer().numel() * bucket.buffer().element_size()
    return allreduce_hook(None, bucket)


def prepare_model(cfg: TrainConfig, info: dph.DistInfo):
    """The model on its device, BatchNorm synchronised as asked, then wrapped (DDP) or broadcast from rank 0."""
    model = build_model(cfg.model, cfg.dim, cfg.seed)
    if cfg.bn_sync == "allreduce":
        model = GlobalBatchNorm1d.convert(model)
    elif cfg.bn_sync == "syncbn":
        if info.device.type == "cpu":
            raise ValueError("bn_sync 'syncbn' needs GPUs (SyncBatchNorm refuses CPU tensors); use 'allreduce'.")
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(info.device)
    if cfg.strategy == "fsdp":
        return zero.fully_sharded(model)
    if cfg.sync == "ddp":
        return dph.wrap_ddp(model, info)
    for p in model.parameters():
        dist.broadcast(p.data, src=0)  # rank 0's parameters everywhere, as DDP's constructor makes them
    return model


def after_backward(cfg: TrainConfig):
    """What runs between backward() and step(): the hand-written all-reduce and/or the identical-gradients check."""
    actions = ([average_gradients] if cfg.sync == "manual" else []) + \
        ([lambda m: assert_identical_across_ranks([p.grad for p in m.parameters()])] if cfg.check_grads else [])
    return (lambda model: [act(model) for act in actions]) if actions else None


def micro_batches(loader, k: int, device):
    """Group the loader's batches k at a time (the last group may be shorter), moved to `device`."""
    group = []
    for inputs, targets in loader:
        group.append((inputs.to(device), targets.to(device)))
        if len(group) == k:
            yield group
            group = []
    if group:
        yield group


def run_epoch(epoch: int, step: int, model, loader, optimizer, writer: MetricsWriter, cfg: TrainConfig,
              info: dph.DistInfo) -> tuple[int, float, int]:
    """Train one epoch; returns the next global step, this rank's loss sum and sample count."""
    loss_sum, count, hook = 0.0, 0, after_backward(cfg)
    no_sync = getattr(model, "no_sync", None) if cfg.use_no_sync else None
    for group in micro_batches(loader, cfg.grad_accum_steps, info.device):
        loss = accumulate_step(model, group, optimizer, no_sync, hook).item()
        samples = sum(len(x) for x, _ in group)
        writer.log(epoch=epoch, step=step, loss=loss, samples=samples)
        loss_sum, count, step = loss_sum + loss * samples, count + samples, step + 1
    return step, loss_sum, count


def save_checkpoint(path: str, model, optimizer, epoch: int, step: int, batch_size: int, info: dph.DistInfo) -> None:
    """Rank 0 writes model, optimizer and position whole, then renames it into place; every rank waits for it."""
    if info.is_main:
        state = {"model": dph.unwrap(model).state_dict(), "optimizer": optimizer.state_dict(),
                 "epoch": epoch, "step": step, "world_size": info.world_size, "batch_size": batch_size}
        write_atomic(path, lambda tmp: torch.save(state, tmp))
    dist.barrier()  # nobody reads the file before it is complete


def load_checkpoint(path: str, model, optimizer, info: dph.DistInfo) -> tuple[int, int]:
    """Every rank loads the checkpoint onto its own device; returns (next epoch, next step)."""
    state = torch.load(path, map_location=info.device, weights_only=True)
    dph.unwrap(model).load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return state["epoch"], state["step"]


def divergence(run_dir: Path, epoch_loss: float) -> str | None:
    """A warning when the epoch's loss is not finite or 10x above this run's first step (rank 0's metrics), else None."""
    with open(metrics_dir(run_dir) / "rank0.jsonl", encoding="utf-8") as f:
        first = float(json.loads(f.readline())["loss"])
    if not math.isfinite(epoch_loss):
        return f"warning: the loss is {epoch_loss}: training diverged; lower --lr (the first step's loss was {first:.4g})."
    if epoch_loss > 10 * first:
        return (f"warning: the loss grew from {first:.4g} (first step) to {epoch_loss:.4g}: training is diverging; "
                "lower --lr.")
    return None


def strategy_optimizer(model, cfg: TrainConfig) -> torch.optim.Optimizer:
    """SGD; under zero1 torch's ZeroRedundancyOptimizer around it, so each rank keeps the state of its share only."""
    if cfg.strategy != "zero1":
        return make_optimizer(model, cfg.lr, cfg.momentum)
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=cfg.lr, momentum=cfg.momentum)


def held_per_rank(model, optimizer, info: dph.DistInfo) -> list[dict]:
    """Every rank's bytes of parameters, gradients and optimizer state (from storages; a collective)."""
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer keeps the real one inside
    params = list(model.parameters())
    mine = zero.held_bytes(params, [p.grad for p in params], inner)
    table = [None] * info.world_size
    dist.all_gather_object(table, mine)
    return table


def full_weights(model) -> dict:
    """The unwrapped model's full state_dict on CPU (under fsdp gathered from the shards: every rank must call it)."""
    if not any(hasattr(t, "full_tensor") for t in model.state_dict().values()):
        return {k: v.cpu() for k, v in dph.unwrap(model).state_dict().items()}
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).cpu() for k, v in model.state_dict().items()}


def save_outputs(out: Path, weights: dict, summary: dict) -> None:
    """Rank 0 only: the full weights and the summary, each written whole then renamed into place."""
    write_atomic(out / "model.pt", lambda tmp: torch.save(weights, tmp))
    write_text_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")


def train(cfg: TrainConfig, info: dph.DistInfo) -> dict:
    """Train with DDP and return the summary (every rank runs every collective; rank 0 reports)."""
    seed_everything(cfg.seed)
    model, comm = prepare_model(cfg, info), {"allreduces": 0, "bytes": 0}
    if isinstance(model, DDP):
        model.register_comm_hook(comm, counting_hook)
    loader, sampler = make_loader(make_synthetic(cfg.samples, cfg.dim, cfg.seed), cfg.batch_size, info.rank,
                                  info.world_size, cfg.seed)
    optimizer, losses, start = strategy_optimizer(model, cfg), [], time.perf_counter()
    first, step = load_checkpoint(cfg.resume, model, optimizer, info) if cfg.resume else (0, 0)
    last = min(cfg.epochs, cfg.stop_after) if cfg.stop_after else cfg.epochs
    with MetricsWriter(info.run_dir, info.rank, info.world_size) as writer:
        for epoch in range(first, last):
            sampler.set_epoch(epoch)  # without it every epoch repeats the same order
            step, loss_sum, count = run_epoch(epoch, step, model, loader, optimizer, writer, cfg, info)
            losses.append(dph.epoch_mean_loss(loss_sum, count, info))
            dph.print0(info, f"epoch {epoch + 1}/{cfg.epochs}  loss={losses[-1]:.6f}  steps={step}")
            if info.is_main and (warning := divergence(info.run_dir, losses[-1])):
                print(warning, flush=True)
            if cfg.checkpoint:
                save_checkpoint(cfg.checkpoint, model, optimizer, epoch + 1, step, cfg.batch_size, info)
    summary = make_summary(cfg, info, step, losses, comm, time.perf_counter() - start)
    summary["held_bytes"] = held_per_rank(model, optimizer, info)
    weights = full_weights(model)  # a collective under fsdp: every rank takes part
    if info.is_main:
        save_outputs(info.run_dir, weights, summary)
    return summary


def make_summary(cfg: TrainConfig, info: dph.DistInfo, step: int, losses: list, comm: dict, seconds: float) -> dict:
    """What summary.json records about the run."""
    plan = shard_plan(cfg.samples, info.world_size, cfg.batch_size, cfg.grad_accum_steps)
    return {"status": "finished", "config": cfg.as_dict(), "world_size": info.world_size, "backend": info.backend, "sync": cfg.sync,
            "device": str(info.device), "global_batch_size": plan.global_batch,
            "steps": step, "epoch_losses": losses, "final_loss": losses[-1] if losses else None,
            "allreduce_calls": comm["allreduces"], "allreduce_bytes": comm["bytes"],
            "padded_samples_per_epoch": plan.padded, "last_batch_size": plan.last_batch,
            "equivalent_to_large_batch": plan.equivalent_to_large_batch, "equivalence": plan.explain(),
            "train_seconds": round(seconds, 3), "torch": torch.__version__}


def main(argv: list[str] | None = None) -> None:
    """Parse flags, then train as one rank of the group (a group of one without torchrun)."""
    args = worker_parser().parse_args(argv)
    cfg = config_from_args(args)

    def run(info: dph.DistInfo) -> None:
        """Check the config against the world size, train, say where the results are."""
        validate(cfg, info.world_size)
        train(cfg, info)
        if "DP_RUN_DIR" not in os.environ:  # run alone or by a bare torchrun: say where the results are
            dph.print0(info, f"run folder: {info.run_dir}")

    dph.worker(run, run_dir=args.out)


if __name__ == "__main__":
    main()
