"""Train a small classifier on one device: the loop that train_ddp.py turns into DDP.

    python train_one_device.py --batch-size 32
"""

import argparse
import math
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, RandomSampler, TensorDataset


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=positive_int, default=5)
    parser.add_argument("--batch-size", type=positive_int, default=32, help="samples per step")
    parser.add_argument("--lr", type=positive_float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=file_to_write, default="model.pt")
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dataset = make_data(args.seed)
    order = torch.Generator()  # shuffle=True would build this sampler with a generator of its own
    sampler = RandomSampler(dataset, generator=order)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    model = make_model(args.seed).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = nn.BCEWithLogitsLoss()

    for epoch in range(args.epochs):
        order.manual_seed(args.seed + epoch)  # a new order every epoch, reproducible
        total, count = 0.0, 0
        for step, (x, y) in enumerate(loader):
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            stop_if_not_finite(loss.item(), f"at step {step + 1} of epoch {epoch + 1}")
            loss.backward()
            optimizer.step()
            total, count = total + loss.item() * len(x), count + len(x)
        print(f"epoch {epoch + 1}/{args.epochs}  loss {total / count:.4f}")

    torch.save(model.state_dict(), args.out)


if __name__ == "__main__":
    main()
