"""The source article's DDP script fixed: torchrun, derived device and backend, one seeded dataset, set_epoch, the epoch's mean loss, teardown (notebook 03).

Run it with run_ddp("dp_helpers.scripts.article_torchrun", world_size=2) or
python -m torch.distributed.run --standalone --nproc-per-node 2 -m dp_helpers.scripts.article_torchrun
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from dp_helpers import dist as dph
from dp_helpers.data import make_synthetic
from dp_helpers.models import build_model


def train(info: dph.DistInfo, epochs: int = 10) -> None:
    """The source article's training loop, one process per rank under torchrun (dph.worker joins and leaves the group)."""
    model = build_model("linear", 10, seed=0).to(info.device)
    model = DDP(model, device_ids=[info.local_rank] if info.device.type != "cpu" else None)  # None on CPU
    dataset = make_synthetic(100, 10, seed=0)
    sampler = DistributedSampler(dataset, num_replicas=info.world_size, rank=info.rank)
    data_loader = DataLoader(dataset, batch_size=10, sampler=sampler)
    optimizer = optim.SGD(model.parameters(), lr=0.01)
    criterion = nn.BCELoss()
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        loss_sum, count = 0.0, 0
        for inputs, targets in data_loader:
            inputs, targets = inputs.to(info.device), targets.to(info.device)
            optimizer.zero_grad()
            outputs = model(inputs)
            loss = criterion(outputs, targets.unsqueeze(1))
            loss.backward()
            optimizer.step()
            loss_sum, count = loss_sum + loss.item() * len(inputs), count + len(inputs)
        totals = torch.tensor([loss_sum, count], dtype=torch.float64, device=info.device)
        dist.all_reduce(totals)  # every rank calls it: the sums over all ranks
        if info.rank == 0:
            print(f"epoch {epoch} mean loss {(totals[0] / totals[1]).item():.4f}", flush=True)


if __name__ == "__main__":
    dph.worker(train)
