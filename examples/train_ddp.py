"""Train a small classifier with DistributedDataParallel: train_one_device.py, one process per device.

    torchrun --standalone --nproc-per-node 2 train_ddp.py --batch-size 16
"""

import argparse
import gc
import math
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_data(seed: int, samples: int = 1024, features: int = 20) -> TensorDataset:
    """Points labelled by a hidden linear rule: replace with your own dataset."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=g)
    y = (x @ torch.randn(features, 1, generator=g) > 0).float()
    return TensorDataset(x, y)


def make_model(seed: int, features: int = 20) -> nn.Module:
    """A small MLP: replace with your own model."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(features, 64), nn.ReLU(), nn.Linear(64, 1))


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


def stop_if_not_finite(loss: float, where: str, rank: int | None = None) -> None:
    """Stop with one line when the loss is NaN or inf: every later step would only spread it. Under torchrun the
    line names the rank, and torchrun then stops the other ranks."""
    if not math.isfinite(loss):
        who = "" if rank is None else f"[rank {rank}] "
        sys.stderr.write(f"{who}loss is {loss} {where}: lower --lr?\n")  # one write: ranks' lines never interleave
        sys.exit(1)


def pick_device(local_rank: int, local_world_size: int) -> tuple[torch.device, str]:
    """One GPU per process when this machine has enough of them (NCCL), else the CPU (gloo)."""
    if torch.cuda.device_count() >= local_world_size:
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), "nccl"
    return torch.device("cpu"), "gloo"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=positive_int, default=5)
    parser.add_argument("--batch-size", type=positive_int, default=16,
                        help="samples per step, per process")
    parser.add_argument("--lr", type=positive_float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=file_to_write, default="model.pt")
    parser.add_argument("--timeout", type=positive_float, default=60,
                        help="seconds to wait for the others")
    args = parser.parse_args()
    if "LOCAL_RANK" not in os.environ:
        sys.exit("start me with torchrun: torchrun --standalone --nproc-per-node 2 train_ddp.py")

    # torchrun set RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT
    local_rank, local_world_size = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    device, backend = pick_device(local_rank, local_world_size)
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
    rank, world_size = dist.get_rank(), dist.get_world_size()

    dataset = make_data(args.seed)
    # every rank draws the same permutation, then keeps positions rank, rank + W, rank + 2W, ... of it
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    model = make_model(args.seed).to(device)
    model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)  # rank 0's weights
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = nn.BCEWithLogitsLoss()

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a new order every epoch, the same on every rank
        total = torch.zeros(2, device=device)  # this rank's sum of losses, its number of samples
        for step, (x, y) in enumerate(loader):
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            stop_if_not_finite(loss.item(), f"at step {step + 1} of epoch {epoch + 1}", rank)
            loss.backward()  # DDP averages the gradients over all ranks during the backward
            optimizer.step()
            total += torch.tensor([loss.item() * len(x), len(x)], device=device)
        dist.all_reduce(total)  # every rank calls it: the sums over all ranks
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}  loss {(total[0] / total[1]).item():.4f}")

    if rank == 0:
        torch.save(model.module.state_dict(), args.out)  # the plain model's weights, written once
    del model, optimizer  # free DDP before its group, or gloo may abort at exit (README)
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
