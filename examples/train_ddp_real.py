"""DDP for a real job: mixed precision, gradient accumulation, clipping, exact evaluation, checkpoint and resume.

    torchrun --standalone --nproc-per-node 2 train_ddp_real.py --checkpoint ck.pt
    torchrun --standalone --nproc-per-node 2 train_ddp_real.py --checkpoint ck.pt   # again: resumes where it stopped

Plain PyTorch, nothing else: train_ddp.py plus what a real run needs. One process with --batch-size W x B ends with
the same weights as W processes with --batch-size B (up to float rounding), stopped and resumed or not.
"""

import argparse
import contextlib
import gc
import math
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset


def make_data(seed: int, samples: int = 960, held_out: int = 250, features: int = 20):
    """A training set and a held-out set labelled by one hidden linear rule: replace with your own."""
    g = torch.Generator().manual_seed(seed)
    rule = torch.randn(features, 1, generator=g)
    x = torch.randn(samples + held_out, features, generator=g)
    y = (x @ rule + 0.3 * torch.randn(samples + held_out, 1, generator=g) > 0).float()
    return TensorDataset(x[:samples], y[:samples]), TensorDataset(x[samples:], y[samples:])


def make_model(seed: int, features: int = 20) -> nn.Module:
    """A small MLP: replace with your own model."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(features, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))


def pick_device(local_rank: int, local_world_size: int) -> tuple[torch.device, str]:
    """One GPU per process when this machine has enough of them (NCCL), else the CPU (gloo)."""
    if torch.cuda.device_count() >= local_world_size:
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), "nccl"
    return torch.device("cpu"), "gloo"


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 (argparse refuses anything else in one line)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return int(text)


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0 (float() alone takes 'nan' and 'inf' too)."""
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number > 0")
    return value


def file_to_write(text: str) -> str:
    """An argparse type: a file in a folder that exists, checked now rather than after training."""
    folder = os.path.dirname(os.path.abspath(text))
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file name")
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"there is no folder {folder} to write {text} in")
    return text


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=positive_int, default=6)
    parser.add_argument("--batch-size", type=positive_int, default=16,
                        help="samples per micro-batch, per process")
    parser.add_argument("--grad-accum-steps", type=positive_int, default=2,
                        help="micro-batches per optimizer step")
    parser.add_argument("--lr", type=positive_float, default=0.05)
    parser.add_argument("--max-grad-norm", type=positive_float, default=1.0,
                        help="clip the global gradient norm to this")
    parser.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32",
                        help="bf16: autocast; fp16: autocast with a GradScaler (GPUs, in this script)")
    parser.add_argument("--checkpoint", type=file_to_write, default=None,
                        help="save after every epoch; resume from it if it exists")
    parser.add_argument("--stop-after", type=positive_int, default=None,
                        help="stop after this many epochs of this run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=file_to_write, default="model.pt")
    parser.add_argument("--timeout", type=positive_float, default=60,
                        help="seconds to wait for the others")
    return parser.parse_args()


def micro_batch_groups(loader, k: int):
    """The loader's batches in groups of k: one optimizer step each (the epoch's last group may be shorter)."""
    group = []
    for batch in loader:
        group.append(batch)
        if len(group) == k:
            yield group
            group = []
    if group:
        yield group


def train_step(model, group, optimizer, scaler, amp_dtype, max_grad_norm: float, device) -> float:
    """One optimizer step over a group of micro-batches; only the last backward all-reduces. Returns the loss sum."""
    samples, total = sum(len(x) for x, _ in group), 0.0
    for i, (x, y) in enumerate(group):
        x, y = x.to(device), y.to(device)
        # DDP decides in the forward whether the backward all-reduces: no_sync must wrap the forward as well
        sync = contextlib.nullcontext() if i == len(group) - 1 else model.no_sync()
        with sync:
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                logits = model(x)
            loss = nn.functional.binary_cross_entropy_with_logits(logits.float(), y, reduction="sum")
            scaler.scale(loss / samples).backward()  # this rank's mean over the group; DDP averages over ranks
        total += loss.item()
    scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
    nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)  # after DDP's all-reduce: the global norm
    scaler.step(optimizer)  # skips the step if fp16 overflowed
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return total


def stop_if_not_finite(loss: float, where: str, rank: int | None = None) -> None:
    """Stop with one line when the loss is NaN or inf: every later step would only spread it. Under torchrun the
    line names the rank, and torchrun then stops the other ranks."""
    if not math.isfinite(loss):
        who = "" if rank is None else f"[rank {rank}] "
        sys.stderr.write(f"{who}loss is {loss} {where}: lower --lr?\n")  # one write: ranks' lines never interleave
        sys.exit(1)


@torch.no_grad()
def evaluate(model: nn.Module, held_out: TensorDataset, rank: int, world_size: int, device) -> tuple[float, float]:
    """Mean loss and accuracy over every held-out sample exactly once: rank r scores r, r + W, ... (no padding)."""
    mine = Subset(held_out, range(rank, len(held_out), world_size))
    totals = torch.zeros(3, device=device)  # loss sum, correct, count
    model.eval()
    for x, y in DataLoader(mine, batch_size=256):
        x, y = x.to(device), y.to(device)
        logits = model(x)
        totals += torch.stack([nn.functional.binary_cross_entropy_with_logits(logits, y, reduction="sum"),
                               ((logits > 0).float() == y).sum(), torch.tensor(float(len(x)), device=device)])
    model.train()
    dist.all_reduce(totals)  # every rank calls it, even one with no held-out sample
    return (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()


def save_checkpoint(path: str, model, optimizer, scaler, next_epoch: int, rank: int) -> None:
    """Rank 0 writes the whole state to a temporary file and renames it: the old snapshot or the new, never half."""
    rng = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(torch.get_rng_state(), rng, dst=0)  # every rank calls it: each rank's random state
    if rank == 0:
        state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                 "scaler": scaler.state_dict(), "epoch": next_epoch, "rng": rng}
        tmp = f"{path}.tmp{os.getpid()}"  # this process's own: two runs on one path never share it
        try:
            torch.save(state, tmp)
            with open(tmp, "rb") as written:
                os.fsync(written.fileno())  # on the disk before the rename, power cut or not
            os.replace(tmp, path)  # one step: whoever reads path finds the old snapshot or the new
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)  # a failed save leaves no temporary file behind
            raise
        if os.name == "posix":  # the rename on the disk too (Windows cannot fsync a folder)
            folder = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
            os.fsync(folder)
            os.close(folder)
    dist.barrier()  # nobody goes on (or stops) before the snapshot is complete


def load_checkpoint(path: str, model, optimizer, scaler, rank: int, device) -> int:
    """Every rank loads the snapshot onto its device; returns the epoch to start from (0 without one)."""
    if not os.path.exists(path):
        return 0
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except Exception:  # one sentence instead of torch's traceback
        sys.exit(f"[rank {rank}] cannot resume: {path} is empty, cut short or not torch.save's.")
    asked = [group["lr"] for group in optimizer.param_groups]  # --lr: load_state_dict restores the saved one
    try:
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        rng, epoch = state["rng"], state["epoch"]
    except (KeyError, TypeError, IndexError) as exc:  # not the dict save_checkpoint writes
        sys.exit(f"[rank {rank}] cannot resume: {path} is not a checkpoint of this script "
                 f"({type(exc).__name__}: {exc}).")
    except (RuntimeError, ValueError):  # the right entries, for other shapes
        sys.exit(f"[rank {rank}] cannot resume: {path} is another model's, optimizer's or "
                 "--precision's.")
    saved = [group["lr"] for group in optimizer.param_groups]
    if saved != asked:  # a silent change of --lr on resume would train on with the old one
        sys.exit(f"[rank {rank}] cannot resume: {path} was trained with --lr {saved[0]:g}; resume with it, or start "
                 "a new --checkpoint.")
    if rank < len(rng):  # at another world size a new rank keeps its own
        torch.set_rng_state(rng[rank].cpu())
    return epoch  # the sampler's order follows from it: set_epoch(epoch) below


def main() -> None:
    args = parse_args()
    if "LOCAL_RANK" not in os.environ:
        sys.exit("start me with torchrun: torchrun --standalone --nproc-per-node 2 train_ddp_real.py")
    local_rank, local_world_size = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    device, backend = pick_device(local_rank, local_world_size)
    if args.precision == "fp16" and device.type != "cuda":
        sys.exit("--precision fp16 runs on GPUs in this script (a GradScaler guards its range); on CPUs use bf16.")
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
    rank, world_size = dist.get_rank(), dist.get_world_size()

    train_set, held_out = make_data(args.seed)
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    model = DDP(make_model(args.seed).to(device), device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    amp_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]
    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "fp16")  # a no-op unless fp16
    start = load_checkpoint(args.checkpoint, model, optimizer, scaler, rank, device) if args.checkpoint else 0
    if rank == 0 and start >= args.epochs:
        print(f"nothing left to train: {args.checkpoint} already holds {start} epochs and --epochs "
              f"is {args.epochs}", flush=True)
    elif rank == 0 and start:
        print(f"resumed from {args.checkpoint} at epoch {start + 1}", flush=True)

    last = args.epochs if args.stop_after is None else min(args.epochs, start + args.stop_after)
    for epoch in range(start, last):
        sampler.set_epoch(epoch)  # a new order every epoch, the same on every rank, and again after a resume
        total = torch.zeros(2, device=device)  # this rank's loss sum and samples
        for step, group in enumerate(micro_batch_groups(loader, args.grad_accum_steps)):
            loss_sum = train_step(model, group, optimizer, scaler, amp_dtype, args.max_grad_norm, device)
            stop_if_not_finite(loss_sum, f"at step {step + 1} of epoch {epoch + 1}", rank)
            total += torch.tensor([loss_sum, sum(len(x) for x, _ in group)], device=device)
        dist.all_reduce(total)
        held_loss, accuracy = evaluate(model.module, held_out, rank, world_size, device)
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}  train loss {(total[0] / total[1]).item():.4f}  "
                  f"held-out loss {held_loss:.4f}  accuracy {accuracy:.1%}", flush=True)
        if args.checkpoint:
            save_checkpoint(args.checkpoint, model, optimizer, scaler, epoch + 1, rank)

    if rank == 0 and last == args.epochs:
        torch.save(model.module.state_dict(), args.out)  # the plain model's weights, written once
    del model, optimizer  # free DDP before its group, or gloo may abort at exit
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
