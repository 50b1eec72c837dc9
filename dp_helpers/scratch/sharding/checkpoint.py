"""Checkpoints that change world size, with torch.distributed.checkpoint (DCP).

`save` has every rank write the shards it holds (a DDP model's replicated tensors once, an FSDP2 model's DTensor
shards with their global offsets) into one checkpoint folder; `load` has every rank read the pieces its own shards
need, however many ranks wrote them: written on 2 ranks, it loads on 3 or on 1. `get_state_dict` and
`set_state_dict` put the model and optimizer state into that form and back, whatever the wrapper. Both are
collectives: every rank calls them.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


def save(folder: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Write this rank's share of the model's and the optimizer's state into the checkpoint folder."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(folder))


def load(folder: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Fill the model and optimizer from a checkpoint folder, resharded onto this run's ranks."""
    model_state, optimizer_state = get_state_dict(model, optimizer)  # the shapes and shards this run wants
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=str(folder))  # in place: each rank reads the pieces of its own shards
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
