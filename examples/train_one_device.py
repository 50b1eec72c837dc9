"""Train a small classifier on one device: the loop that train_ddp.py turns into DDP.

    python train_one_device.py --batch-size 32
"""

import argparse

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="samples per step")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="model.pt")
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
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            total, count = total + loss.item() * len(x), count + len(x)
        print(f"epoch {epoch + 1}/{args.epochs}  loss {total / count:.4f}")

    torch.save(model.state_dict(), args.out)


if __name__ == "__main__":
    main()
