"""The source article's DDP script as the article wrote it (mp.spawn, nccl and CUDA hard-coded, no set_epoch): kept to be run and seen failing.

Notebook 03 runs it in a subprocess and shows its diff against article_torchrun.py, which fixes every bug.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

from dp_helpers.tool.data import SimpleDataset
from dp_helpers.tool.models import SimpleModel


def init_process(rank, world_size, backend='nccl'):
    dist.init_process_group(backend, rank=rank, world_size=world_size)


def train(rank, world_size):
    init_process(rank, world_size)
    torch.cuda.set_device(rank)
    model = SimpleModel(10).to(rank)
    model = DDP(model, device_ids=[rank])
    dataset = SimpleDataset(torch.randn(100, 10), torch.randint(0, 2, (100,)).float())
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, num_replicas=world_size, rank=rank)
    data_loader = DataLoader(dataset, batch_size=10, sampler=sampler)
    optimizer = optim.SGD(model.parameters(), lr=0.01)
    criterion = nn.BCELoss()
    for epoch in range(10):
        for inputs, targets in data_loader:
            inputs, targets = inputs.to(rank), targets.to(rank)
            optimizer.zero_grad()
            outputs = model(inputs)
            loss = criterion(outputs, targets.unsqueeze(1))
            loss.backward()
            optimizer.step()
        print(f"rank {rank} epoch {epoch} loss {loss.item():.4f}")


if __name__ == "__main__":
    world_size = 4
    torch.multiprocessing.spawn(train, args=(world_size,), nprocs=world_size, join=True)
