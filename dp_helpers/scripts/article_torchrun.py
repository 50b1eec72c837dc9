"""The source article's DDP script fixed, in plain torch: torchrun, derived device and backend, one seeded dataset, set_epoch, the epoch's mean loss, teardown (notebook 03).

Run it with torchrun --standalone --nproc-per-node 2 article_torchrun.py (from the notebook: run_ddp, which does the same).
"""

import gc
import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class SimpleDataset(Dataset):
    """The source article's dataset: pairs of feature rows and targets."""

    def __init__(self, data, target):
        self.data, self.target = data, target

    def __len__(self):
        return len(self.data)

    def __getitem__(self, idx):
        return self.data[idx], self.target[idx]


class SimpleModel(nn.Module):
    """The source article's model: one linear layer and a sigmoid."""

    def __init__(self, input_dim):
        super().__init__()
        self.fc = nn.Linear(input_dim, 1)

    def forward(self, x):
        """Probabilities of shape (batch, 1)."""
        return torch.sigmoid(self.fc(x))


def one_dataset(samples: int = 100, dim: int = 10, seed: int = 0) -> SimpleDataset:
    """The same data on every rank, from one seed: features ~ N(0, 1), labels from a hidden linear rule plus noise."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, dim, generator=gen)
    w_true = torch.randn(dim, generator=gen)
    return SimpleDataset(x, (x @ w_true + 0.5 * torch.randn(samples, generator=gen) > 0).float())


def join() -> tuple[torch.device, int]:
    """Join torchrun's group: one GPU per process with NCCL when there are enough of them, else the CPU with gloo."""
    local_rank = int(os.environ["LOCAL_RANK"])
    on_gpus = torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"])
    device = torch.device("cuda", local_rank) if on_gpus else torch.device("cpu")
    if on_gpus:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if on_gpus else "gloo", timeout=timedelta(seconds=30))
    return device, local_rank


def train(device: torch.device, local_rank: int, epochs: int = 10) -> None:
    """The source article's training loop, one process per rank."""
    torch.manual_seed(0)  # the same initial weights everywhere (DDP would broadcast rank 0's anyway)
    model = DDP(SimpleModel(10).to(device), device_ids=[local_rank] if device.type != "cpu" else None)
    dataset = one_dataset()
    sampler = DistributedSampler(dataset)  # rank and world size from the group
    data_loader = DataLoader(dataset, batch_size=10, sampler=sampler)
    optimizer = optim.SGD(model.parameters(), lr=0.01)
    criterion = nn.BCELoss()
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        loss_sum, count = 0.0, 0
        for inputs, targets in data_loader:
            inputs, targets = inputs.to(device), targets.to(device)
            optimizer.zero_grad()
            outputs = model(inputs)
            loss = criterion(outputs, targets.unsqueeze(1))
            loss.backward()
            optimizer.step()
            loss_sum, count = loss_sum + loss.item() * len(inputs), count + len(inputs)
        totals = torch.tensor([loss_sum, count], dtype=torch.float64, device=device)
        dist.all_reduce(totals)  # every rank calls it: the sums over all ranks (padded when W does not divide 100)
        if dist.get_rank() == 0:
            print(f"epoch {epoch} mean loss {(totals[0] / totals[1]).item():.4f}", flush=True)
    del model, optimizer  # free DDP before its group, or gloo may abort at exit


@record  # a crashing rank's traceback reaches torchrun's error summary
def main() -> None:
    """Join, train, leave."""
    train(*join())
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
