"""Notebook 00, exercise 1: the one-device loop (dp_helpers/scripts/one_device_loop.py) as DDP."""

import argparse
import gc

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    """Train a linear model with DDP, one process per device (CPU: gloo), and save its weights on rank 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=24, help="samples per step and process")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--out", default="weights.pt", help="where to save the trained weights")
    args = parser.parse_args()
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")  # torchrun set the rest
    rank = dist.get_rank()

    g = torch.Generator().manual_seed(0)
    features = torch.randn(960, 8, generator=g)
    dataset = TensorDataset(features, features @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(960, 1, generator=g))
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)  # this rank's share, shuffled as one device did
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 1))  # on GPUs: .to(device) first and device_ids=[local_rank]
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a new order every epoch, the same on every rank
        total = torch.zeros(2)
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()  # DDP averages the gradients here
            optimizer.step()
            total += torch.tensor([loss.item() * len(x), len(x)])
        dist.all_reduce(total)  # every rank: the sums over all ranks
        if rank == 0:
            print(f"epoch {epoch + 1} loss {total[0] / total[1]:.6f}")

    if rank == 0:
        torch.save(model.module.state_dict(), args.out)
    # free DDP before its group, or gloo may abort at exit (README: "terminate called without an active exception")
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
