"""Notebook 07's capstone: DDP for a real job. Write train_step, evaluate, save_checkpoint and load_checkpoint.

check_real_job("my_real_job.py") runs it under torchrun on 2 gloo ranks (stopped after an epoch and resumed) and on 3,
and compares each with one process on the global batch of 48. The rest of the file is examples/train_ddp_real.py's.
"""

import argparse
import contextlib  # noqa: F401 (no_sync or not: your train_step needs it)
import gc
import math
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset  # noqa: F401 (evaluate needs it)


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
    # your code. For each micro-batch (x, y) of the group, moved to the device:
    #   - only the group's last micro-batch may all-reduce: run the others' forward AND backward under model.no_sync()
    #   - the forward under torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None)
    #   - loss = binary_cross_entropy_with_logits(logits.float(), y, reduction="sum"); backward of
    #     scaler.scale(loss / samples), samples being the group's number of samples
    # then unscale the gradients, clip them to max_grad_norm, step through the scaler, update it, zero the gradients.
    raise NotImplementedError


def stop_if_not_finite(loss: float, where: str, rank: int | None = None) -> None:
    """Stop with one line when the loss is NaN or inf: every later step would only spread it. Under torchrun the
    line names the rank, and torchrun then stops the other ranks."""
    if not math.isfinite(loss):
        who = "" if rank is None else f"[rank {rank}] "
        sys.stderr.write(f"{who}loss is {loss} {where}: lower --lr?\n")  # one write: ranks' lines never interleave
        sys.exit(1)


@torch.no_grad()
def evaluate(model: nn.Module, held_out: TensorDataset, rank: int, world_size: int, device) -> tuple[float, float]:
    """Mean loss and accuracy over every held-out sample exactly once, across all ranks."""
    # your code: rank r scores samples r, r + world_size, ... (no DistributedSampler: it pads), sums the loss, the
    # correct predictions and the count, all-reduces the three sums (every rank calls it), and divides.
    raise NotImplementedError


def save_checkpoint(path: str, model, optimizer, scaler, next_epoch: int, rank: int) -> None:
    """Save model, optimizer, scaler, next_epoch and every rank's RNG state, atomically, from rank 0 alone."""
    # your code: gather every rank's torch.get_rng_state() onto rank 0 (a collective: every rank calls it); rank 0
    # writes the state dict to a temporary file and renames it onto `path`; then every rank waits at a barrier.
    raise NotImplementedError


def load_checkpoint(path: str, model, optimizer, scaler, rank: int, device) -> int:
    """Every rank loads the snapshot onto its device; returns the epoch to start from (0 without one)."""
    # your code: nothing at `path` means epoch 0; else load with map_location=device, restore the model (its
    # module), the optimizer, the scaler and this rank's RNG state (if it was saved), and return the saved epoch.
    raise NotImplementedError


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
