"""The seed's DDP script fixed: launched by torchrun, device and backend derived, set_epoch, rank-0 output, teardown (notebook 03).

Run it with run_ddp("dp_helpers.scripts.seed_torchrun", world_size=2) or
python -m torch.distributed.run --standalone --nproc-per-node 2 -m dp_helpers.scripts.seed_torchrun
"""

import torch.nn as nn
import torch.optim as optim
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from dp_helpers import dist as dph
from dp_helpers.data import make_synthetic
from dp_helpers.models import build_model


@record
def train(epochs=10):
    """The seed's training loop, one process per rank under torchrun."""
    info = dph.setup()
    try:
        model = build_model("linear", 10, seed=0).to(info.device)
        model = DDP(model, device_ids=[info.device] if info.device.type != "cpu" else None)
        dataset = make_synthetic(100, 10, seed=0)
        sampler = DistributedSampler(dataset, num_replicas=info.world_size, rank=info.rank)
        data_loader = DataLoader(dataset, batch_size=10, sampler=sampler)
        optimizer = optim.SGD(model.parameters(), lr=0.01)
        criterion = nn.BCELoss()
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for inputs, targets in data_loader:
                inputs, targets = inputs.to(info.device), targets.to(info.device)
                optimizer.zero_grad()
                outputs = model(inputs)
                loss = criterion(outputs, targets.unsqueeze(1))
                loss.backward()
                optimizer.step()
            dph.print0(info, f"epoch {epoch} loss {loss.item():.4f}")
    finally:
        dph.teardown()


if __name__ == "__main__":
    train()
