"""The source article's DDP example made correct: sampler with set_epoch, rank-0 output, derived device, clean teardown (notebooks 03, 05-07).

Run it through `python -m dp_helpers train`, under torchrun:
    python -m torch.distributed.run --standalone --nproc-per-node 2 -m dp_helpers.scripts.train --out runs/x
or alone, as a group of one process that a debugger can step through:
    python dp_helpers/scripts/train.py --epochs 2
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import time
import warnings
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
    allreduce_hook,
    fp16_compress_hook,
)
from torch.nn.parallel import DistributedDataParallel as DDP

from dp_helpers.scratch.collectives.ring import (
    GlobalBatchNorm1d,
    assert_identical_across_ranks,
    average_gradients,
)
from dp_helpers.scratch.communicating_less.compression import PowerSGD
from dp_helpers.scratch.communicating_less.local_sgd import DiLoCo, LocalSGD
from dp_helpers.scratch.ddp.mini_ddp import broadcast_state
from dp_helpers.scratch.sharding import fsdp, memory
from dp_helpers.scratch.sharding.zero import ZeroOptimizer
from dp_helpers.scratch.sharding.zero3 import Zero3Module
from dp_helpers.tool import dist as dph
from dp_helpers.tool.config import POWERSGD_START, TrainConfig, config_from_args, worker_parser
from dp_helpers.tool.data import make_loader
from dp_helpers.tool.files import append_text, remove_partials, write_atomic, write_text_atomic
from dp_helpers.tool.metrics import MetricsWriter, metrics_dir
from dp_helpers.tool.models import build_model
from dp_helpers.tool.request import as_flags, changed_settings, fault, train_samples, validate
from dp_helpers.tool.runs import checkpoint_lock, equivalence, file_stamp, record_ending
from dp_helpers.tool.sampler import shard_plan
from dp_helpers.tool.tasks import held_out_scores, held_out_set, loss_function, train_set
from dp_helpers.tool.training import accumulate_step, layout_change, make_optimizer, seed_everything

LOCAL = ("local-sgd", "diloco")  # --comm values under which the model is not DDP-wrapped: ranks step alone
ABANDON_S = 30.0  # how long a failing rank 0 lets its snapshot thread finish the file it is writing


def counting_hook(state: dict, bucket):
    """DDP's default all-reduce, counting the buckets and bytes it sends."""
    state["allreduces"] += 1
    state["bytes"] += bucket.buffer().numel() * bucket.buffer().element_size()
    return allreduce_hook(None, bucket)


def counting_fp16_hook(state: dict, bucket):
    """torch's fp16_compress_hook, counting the buckets and the bytes it sends (2 per value)."""
    state["allreduces"] += 1
    state["bytes"] += bucket.buffer().numel() * 2
    return fp16_compress_hook(None, bucket)


def register_comm(model: DDP, cfg: TrainConfig, comm: dict, start_iter: int = POWERSGD_START) -> None:
    """DDP's gradients as --comm says: its all-reduce, fp16, or PowerSGD (each counting what it sends)."""
    if cfg.comm == "powersgd":
        comm["counter"] = PowerSGD(rank=cfg.powersgd_rank, start_iter=start_iter, seed=cfg.seed)
        model.register_comm_hook(comm["counter"], PowerSGD.hook)
    else:
        model.register_comm_hook(comm, counting_fp16_hook if cfg.comm == "fp16" else counting_hook)


class StepThenAverage:
    """The optimizer, then LocalSGD's turn after every step: local SGD where a training loop expects an optimizer."""

    def __init__(self, inner: torch.optim.Optimizer, averager: LocalSGD):
        self.inner, self.averager = inner, averager

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The optimizer's zero_grad."""
        self.inner.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        """The optimizer's step, then the average if its turn has come."""
        self.inner.step()
        self.averager.after_step()

    def finish(self) -> None:
        """The last average, if the ranks stepped alone since the one before."""
        self.averager.finish()


def local_optimizer(cfg: TrainConfig, model, optimizer: torch.optim.Optimizer, comm: dict):
    """Under --comm local-sgd or diloco, the optimizer whose step() also averages every --period steps."""
    if cfg.comm == "diloco":
        comm["counter"] = DiLoCo(model, optimizer, cfg.period, cfg.outer_lr, cfg.outer_momentum)
        return comm["counter"]
    if cfg.comm == "local-sgd":
        comm["counter"] = LocalSGD(model, cfg.period)
        return StepThenAverage(optimizer, comm["counter"])
    return optimizer


def comm_totals(comm: dict, model) -> tuple[int, int]:
    """(all-reduce calls, bytes handed to them) on this rank: the hooks' counts, or PowerSGD's / local SGD's values."""
    counter = comm.get("counter")
    if counter is None:
        return comm["allreduces"], comm["bytes"]
    return counter.calls, counter.sent * next(model.parameters()).element_size()


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
    if cfg.strategy in ("fsdp", "hsdp"):  # hsdp: sharded within groups of --shard-size, replicated across them
        return fsdp.fully_sharded(model, cfg.shard_size if cfg.strategy == "hsdp" else None)
    if cfg.strategy == "zero3":  # the course's ZeRO-3: its parameters are this rank's shards
        return Zero3Module(model)
    # zero2 reduces the gradients itself, without DDP; local SGD and DiLoCo average the parameters instead
    if cfg.sync == "ddp" and cfg.strategy != "zero2" and cfg.comm not in LOCAL:
        return dph.wrap_ddp(model, info)
    broadcast_state(model)  # rank 0's parameters and buffers everywhere, as DDP's constructor makes them
    return model


def after_backward(cfg: TrainConfig, comm: dict):
    """What runs between backward() and step(): the hand-written all-reduce and/or the identical-gradients check."""
    actions = ([lambda m: counted(average_gradients, m, comm)] if cfg.sync == "manual" else []) + \
        ([lambda m: assert_identical_across_ranks([p.grad for p in m.parameters()])] if cfg.check_grads else [])
    return (lambda model: [act(model) for act in actions]) if actions else None


def counted(average, model, comm: dict) -> None:
    """The hand-written all-reduce, counted as counting_hook counts DDP's: one call and its bytes per gradient."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    average(model)
    comm["allreduces"] += len(grads)
    comm["bytes"] += sum(g.numel() * g.element_size() for g in grads)


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


def attempt() -> int:
    """Which start of the group this is: 0, or k after torchrun restarted it k times (--max-restarts)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def maybe_fail(cfg: TrainConfig, info: dph.DistInfo, epoch: int, index: int) -> None:
    """--fail-at EPOCH:RANK: on the first attempt that rank dies halfway through that epoch, by SIGKILL (as the OOM killer does)."""
    if not cfg.fail_at or attempt() or (epoch, info.rank) != fault(cfg, info.world_size):
        return
    if index == shard_plan(train_samples(cfg), info.world_size, cfg.batch_size, cfg.grad_accum_steps).optimizer_steps // 2:
        print(f"--fail-at {cfg.fail_at}: killing this process (SIGKILL) at step {index} of epoch {epoch + 1}",
              flush=True)  # torchrun puts the [rank r/W] prefix on it
        os.kill(os.getpid(), signal.SIGKILL)


def run_epoch(epoch: int, step: int, model, loader, optimizer, writer: MetricsWriter, cfg: TrainConfig,
              info: dph.DistInfo, comm: dict) -> tuple[int, float, int]:
    """Train one epoch; returns the next global step, this rank's loss sum and sample count."""
    loss_sum, count, hook, loss_fn = 0.0, 0, after_backward(cfg, comm), loss_function(cfg)
    no_sync = getattr(model, "no_sync", None) if cfg.use_no_sync else None
    for index, group in enumerate(micro_batches(loader, cfg.grad_accum_steps, info.device)):
        maybe_fail(cfg, info, epoch, index)
        try:
            loss = accumulate_step(model, group, optimizer, no_sync, hook, loss_fn).item()
        except FloatingPointError as exc:
            raise FloatingPointError(f"{exc} at step {step} (epoch {epoch + 1}); lower --lr") from None
        samples = sum(len(x) for x, _ in group)
        writer.log(epoch=epoch, step=step, loss=loss, samples=samples)
        loss_sum, count, step = loss_sum + loss * samples, count + samples, step + 1
    return step, loss_sum, count


def on_cpu(state):
    """A copy of a state (dicts, lists, tensors) with every tensor in CPU memory: what a background write may read."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)  # training goes on changing the original in place
    if isinstance(state, dict):
        return {key: on_cpu(value) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(on_cpu(value) for value in state)
    return state


class Snapshots:
    """--checkpoint's writes: rank 0 writes while every rank waits, or (--async-checkpoint) a thread writes a CPU copy."""

    def __init__(self, path: str, background: bool):
        self.path, self.saves, self.stalled, self.pending = path, 0, 0.0, None
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="checkpoint") if path and background else None

    def save(self, state_of, info: dph.DistInfo) -> None:
        """Save what state_of() returns (called on rank 0 only); time how long this rank was kept from training."""
        start = time.perf_counter()
        if info.is_main:
            self.wait()  # one write at a time; an error of the last write is raised here
            if self.pool:
                state = on_cpu(state_of())
                self.pending = self.pool.submit(write_atomic, self.path, lambda tmp: torch.save(state, tmp))
            else:
                write_atomic(self.path, lambda tmp: torch.save(state_of(), tmp))
        if not self.pool:
            dist.barrier()  # nobody goes on before the file is complete: a failure now resumes from this snapshot
        self.saves, self.stalled = self.saves + 1, self.stalled + time.perf_counter() - start

    @contextlib.contextmanager
    def writing(self, info: dph.DistInfo):
        """Around training: partial files of killed writers go; an error lets the write in flight end first."""
        if self.path and info.is_main:  # torchrun stopped an earlier attempt's rank 0 mid-save (SIGTERM): half a file
            remove_partials(self.path)
        try:
            yield
        except BaseException:
            if self.pending is not None:  # the process exits next (dist.worker): a thread cut short leaves a .tmp
                futures.wait([self.pending], timeout=ABANDON_S)
            raise

    def wait(self) -> None:
        """Wait for the write in flight, if any (raising its error)."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.result()

    def close(self) -> None:
        """The last write complete, the thread gone."""
        self.wait()
        if self.pool:
            self.pool.shutdown()


def checkpoint_state(model, optimizer, epoch: int, step: int, history: dict, cfg: TrainConfig,
                     info: dph.DistInfo) -> dict:
    """What a snapshot holds: model, optimizer, position and history, and the settings and run that wrote it."""
    return {"model": dph.unwrap(model).state_dict(), "optimizer": optimizer.state_dict(),
            "epoch": epoch, "step": step, "history": history, "world_size": info.world_size,
            "batch_size": cfg.batch_size, "grad_accum_steps": cfg.grad_accum_steps, "seed": cfg.seed,
            "config": cfg.as_dict(),  # what trained it: --resume refuses settings that would change the job
            "run_dir": str(info.run_dir), "launch": launch_id()}  # which run wrote it: see own_snapshot


def load_checkpoint(path: str, model, optimizer, cfg: TrainConfig, info: dph.DistInfo) -> tuple[int, int, dict]:
    """Every rank loads the checkpoint onto its own device; returns (next epoch, next step, the epochs' history)."""
    state = torch.load(path, map_location=info.device, weights_only=True)
    changed = changed_settings(state, cfg)  # the optimizer's state would bring the old lr and momentum back
    if changed:
        raise ValueError(f"{path} was trained with {as_flags(changed)}; resume with the same (now: "
                         f"{as_flags({k: getattr(cfg, k) for k in changed})}).")
    dph.unwrap(model).load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    history = state.get("history", {})
    change = layout_change(state, info.world_size, cfg.batch_size, cfg.grad_accum_steps)
    if change:  # another world size: the weights and SGD's state are whole tensors, world-size free
        history.setdefault("resumed_from", []).append(change)
        dph.print0(info, resumed_line(change, info.world_size * cfg.batch_size * cfg.grad_accum_steps))
    return state["epoch"], state["step"], history


def resumed_line(change: dict, global_batch: int) -> str:
    """What a resume at another layout means for the invariant: the same global batch continues the same run."""
    was = (f"resuming at epoch {change['epoch'] + 1} a checkpoint written by world size {change['world_size']} x batch "
           f"{change['batch_size']} x {change['grad_accum_steps']} micro-batch(es)")
    if change["global_batch_size"] == global_batch:
        return f"{was}: the same global batch ({global_batch}), so the same steps as if uninterrupted"
    return (f"{was}: the global batch changes from {change['global_batch_size']} to {global_batch} (same --lr): "
            "training goes on, but not as the uninterrupted run would")


def launch_id() -> str:
    """This launch, the same across torchrun's restarts: the launcher's id, else torchrun's run id."""
    return os.environ.get("DP_LAUNCH_ID") or os.environ.get("TORCHELASTIC_RUN_ID", "")


def own_snapshot(path: str, info: dph.DistInfo) -> bool:
    """Whether `path` holds a snapshot this launch wrote: a restarted group must not resume from another run's file."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError):  # missing, or not a snapshot at all
        return False
    return isinstance(state, dict) and (state.get("run_dir"), state.get("launch")) == (str(info.run_dir), launch_id())


def starting_point(cfg: TrainConfig, model, optimizer, info: dph.DistInfo) -> tuple[int, int, dict, str]:
    """(epoch, step, history, file): after a restart this launch's last snapshot, else --resume's, else the start."""
    choice = [cfg.checkpoint if attempt() and cfg.checkpoint and own_snapshot(cfg.checkpoint, info) else cfg.resume]
    dist.broadcast_object_list(choice, src=0)  # rank 0 decides for all: another node's disk may hold another file
    return (*load_checkpoint(choice[0], model, optimizer, cfg, info), choice[0]) if choice[0] else (0, 0, {}, "")


def note_restart(info: dph.DistInfo, epoch: int, step: int, source: str, cfg: TrainConfig) -> None:
    """After a restart, rank 0 says where the group resumed and appends it to restarts.jsonl (summary.json lists them)."""
    if not (attempt() and info.is_main):
        return
    record = {"attempt": attempt(), "resumed_at_epoch": epoch + 1, "resumed_at_step": step}
    append_text(info.run_dir / "restarts.jsonl", json.dumps(record) + "\n")
    if source and source == cfg.checkpoint:
        where = f"resuming at epoch {epoch + 1} (step {step}) from the last snapshot"
    else:  # it died before this launch's first snapshot
        where = f"no snapshot of this run yet: starting again from {source or 'the beginning'}"
    print(f"restart {attempt()}: the group was started again; {where}", flush=True)


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
    """SGD; under zero1 torch's ZeroRedundancyOptimizer around it, under zero2 ours: each rank keeps its share's state."""
    if cfg.strategy == "zero2":
        return ZeroOptimizer(model.parameters(), torch.optim.SGD, stage=2, lr=cfg.lr, momentum=cfg.momentum)
    if cfg.strategy != "zero1":
        return make_optimizer(model, cfg.lr, cfg.momentum)
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=cfg.lr, momentum=cfg.momentum)


def held_per_rank(model, optimizer, info: dph.DistInfo) -> list[dict]:
    """Every rank's bytes of parameters, gradients and optimizer state (from storages; a collective)."""
    # ZeroRedundancyOptimizer keeps the real optimizer in .optim, ZeroOptimizer in .inner (over its shards)
    inner = getattr(optimizer, "optim", None) or getattr(optimizer, "inner", None) or optimizer
    params = list(model.parameters()) + (optimizer.pieces() if hasattr(optimizer, "pieces") else [])  # zero2: + pieces
    mine = memory.held_bytes(params, [p.grad for p in params], inner)
    table = [None] * info.world_size
    dist.all_gather_object(table, mine)
    return table


def full_weights(model) -> dict:
    """The unwrapped model's full state_dict on CPU (under fsdp and zero3 gathered from the shards: every rank calls it)."""
    if isinstance(model, Zero3Module):
        return {k: v.cpu() for k, v in model.full_state_dict().items()}
    if not any(hasattr(t, "full_tensor") for t in model.state_dict().values()):
        return {k: v.cpu() for k, v in dph.unwrap(model).state_dict().items()}
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).cpu() for k, v in model.state_dict().items()}


def save_outputs(out: Path, weights: dict, summary: dict) -> None:
    """Rank 0 only: the full weights and the summary, each written whole then renamed into place."""
    write_atomic(out / "model.pt", lambda tmp: torch.save(weights, tmp))
    write_text_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")


def end_of_epoch(history: dict, loss: float, model, held_out, cfg: TrainConfig, info: dph.DistInfo, epoch: int,
                 step: int) -> None:
    """Record the epoch's loss (and, for digits, the held-out scores: a collective); rank 0 prints one line."""
    history.setdefault("epoch_losses", []).append(loss)
    line = f"epoch {epoch + 1}/{cfg.epochs}  loss={loss:.6f}  steps={step}"
    if held_out is not None:  # local SGD's ranks differ between averages: each scores it all, rank 0's is reported
        world, rank = (1, 0) if cfg.comm in LOCAL else (info.world_size, info.rank)
        scores = held_out_scores(dph.unwrap(model), held_out, world, rank)
        history.setdefault("held_out_accuracy", []).append(scores["accuracy"])
        history.setdefault("held_out_loss", []).append(scores["loss"])
        line += f"  held-out accuracy={100 * scores['accuracy']:.1f}% (loss {scores['loss']:.4f})"
    dph.print0(info, line)
    if info.is_main and (warning := divergence(info.run_dir, loss)):
        print(warning, flush=True)


def train(cfg: TrainConfig, info: dph.DistInfo) -> dict:
    """Train with DDP and return the summary (every rank runs every collective; rank 0 reports)."""
    seed_everything(cfg.seed)
    model, comm = prepare_model(cfg, info), {"allreduces": 0, "bytes": 0}
    if isinstance(model, DDP):
        register_comm(model, cfg, comm)
    loader, sampler = make_loader(train_set(cfg), cfg.batch_size, info.rank, info.world_size, cfg.seed)
    optimizer, held_out, start = strategy_optimizer(model, cfg), held_out_set(cfg), time.perf_counter()
    optimizer = local_optimizer(cfg, model, optimizer, comm)
    first, step, history, source = starting_point(cfg, model, optimizer, info)
    note_restart(info, first, step, source, cfg)
    last = min(cfg.epochs, cfg.stop_after) if cfg.stop_after else cfg.epochs
    snapshots = Snapshots(cfg.checkpoint, cfg.async_checkpoint)
    restart = (attempt(), step) if attempt() else None
    with MetricsWriter(info.run_dir, info.rank, info.world_size, restart) as writer, snapshots.writing(info):
        for epoch in range(first, last):
            sampler.set_epoch(epoch)  # without it every epoch repeats the same order
            step, loss_sum, count = run_epoch(epoch, step, model, loader, optimizer, writer, cfg, info, comm)
            end_of_epoch(history, dph.epoch_mean_loss(loss_sum, count, info), model, held_out, cfg, info, epoch, step)
            if cfg.checkpoint:
                snapshots.save(partial(checkpoint_state, model, optimizer, epoch + 1, step, history, cfg, info), info)
    snapshots.close()  # the run is not over before its last snapshot is on disk
    if hasattr(optimizer, "finish"):  # local SGD, DiLoCo: the ranks agree on the weights they end with
        optimizer.finish()
    comm["allreduces"], comm["bytes"] = comm_totals(comm, model)
    summary = make_summary(cfg, info, step, history, comm, time.perf_counter() - start)
    summary["checkpoint_saves"], summary["checkpoint_stall_seconds"] = snapshots.saves, round(snapshots.stalled, 4)
    summary["held_bytes"] = held_per_rank(model, optimizer, info)
    weights = full_weights(model)  # a collective under fsdp: every rank takes part
    if info.is_main:
        save_outputs(info.run_dir, weights, summary)
    return summary


def restarts(run_dir: Path) -> list[dict]:
    """Where each restart of this run resumed (restarts.jsonl, written by rank 0), oldest first."""
    path = run_dir / "restarts.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.is_file() else []


def make_summary(cfg: TrainConfig, info: dph.DistInfo, step: int, history: dict, comm: dict, seconds: float) -> dict:
    """What summary.json records about the run."""
    plan = shard_plan(train_samples(cfg), info.world_size, cfg.batch_size, cfg.grad_accum_steps)
    losses, resumes = history.get("epoch_losses", []), restarts(info.run_dir)
    scores = {key: history.get(key, []) for key in ("held_out_accuracy", "held_out_loss")} if cfg.data == "digits" else {}
    ended = {"status": "stopped", "reason": f"--stop-after {cfg.stop_after}"} \
        if cfg.stop_after and len(losses) < cfg.epochs else {"status": "finished"}
    return {**ended, "checkpoint": cfg.checkpoint or None, "config": cfg.as_dict(), "world_size": info.world_size,
            "backend": info.backend, "link": os.environ.get("DP_LINK"),  # an emulated network (tool/link.py), or None
            "sync": cfg.sync if cfg.strategy in ("ddp", "zero1") else None,  # the others reduce their own way
            "device": str(info.device), "global_batch_size": plan.global_batch,
            "steps": step, "epoch_losses": losses, "final_loss": losses[-1] if losses else None, **scores,
            "final_accuracy": scores["held_out_accuracy"][-1] if scores.get("held_out_accuracy") else None,
            "restarts": len(resumes), "resumed": resumes,
            "allreduce_calls": comm["allreduces"], "allreduce_bytes": comm["bytes"],
            "padded_samples_per_epoch": plan.padded, "last_batch_size": plan.last_batch,
            **equivalence(cfg, plan, history, getattr(comm.get("counter"), "compressed", None)),
            **({"powersgd_compressed_matrices": comm["counter"].compressed} if cfg.comm == "powersgd" else {}),
            "resumed_from": history.get("resumed_from", []),
            "train_seconds": round(seconds, 3), "torch": torch.__version__}


@contextlib.contextmanager
def ending_recorded_alone(cfg: TrainConfig, info: dph.DistInfo):
    """Run alone (a group of one, no launcher): summary.json says how a run that did not finish ended."""
    before = file_stamp(cfg.checkpoint)
    try:
        yield
    except BaseException as exc:
        # under a launcher the launcher records the ending; under a bare torchrun this rank's error may be a peer's
        if info.world_size == 1 and "RANK" not in os.environ and "DP_RUN_DIR" not in os.environ:
            interrupted = isinstance(exc, KeyboardInterrupt)
            reason = "interrupted (Ctrl-C)" if interrupted else f"{type(exc).__name__}: {exc}".splitlines()[0]
            record_ending(info.run_dir, cfg, reason, "stopped" if interrupted else "failed", before,
                          info.world_size, getattr(info, "backend", None))
        raise


def main(argv: list[str] | None = None) -> None:
    """Parse flags, then train as one rank of the group (a group of one without torchrun)."""
    args = worker_parser().parse_args(argv)
    cfg = config_from_args(args)
    # torch 2.13 deprecates torch.distributed.nn.functional.all_reduce (GlobalBatchNorm1d's differentiable all-reduce)
    # and warns on every call, on every rank; its suggested replacement is private API
    warnings.filterwarnings("ignore", "torch.distributed.nn.functional.all_reduce is deprecated", FutureWarning)

    def run(info: dph.DistInfo) -> None:
        """Check the config against the world size, train, say where the results are."""
        validate(cfg, info.world_size)
        alone = "DP_RUN_DIR" not in os.environ and info.is_main  # no launcher holds the snapshot's lock: rank 0 does
        with checkpoint_lock(cfg.checkpoint if alone else None), ending_recorded_alone(cfg, info):
            train(cfg, info)
        if "DP_RUN_DIR" not in os.environ:  # run alone or by a bare torchrun: say where the results are
            dph.print0(info, f"run folder: {info.run_dir}")

    dph.worker(run, run_dir=args.out)


if __name__ == "__main__":
    main()
