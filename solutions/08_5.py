"""Notebook 08, exercise 5: the three functions of my_fsdp.py, as examples/train_fsdp.py has them."""

import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def build_model(args, vocab: int, device: torch.device, mesh) -> nn.Module:
    """The model sharded with FSDP2: built on the meta device, each block sharded, then the root, then allocated."""
    with torch.device("meta"):  # shapes only: no rank ever holds the full model here
        model = CharLM(vocab, args.context, args.dim, args.layers)  # noqa: F821 (the class is my_fsdp.py's)
    bf16 = args.precision == "bf16"
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None, reduce_dtype=torch.float32)
    for block in model.blocks:  # a group per block: whole for its forward and its backward, freed after each
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)  # the embeddings, final norm and head: the root's group
    model.to_empty(device=device)  # allocate this rank's shards, uninitialised
    return model


def save_checkpoint(folder: str, model, optimizer, step: int, rank: int) -> None:
    """Every rank writes its own shards (DCP); rank 0 then renames the folder into place and drops the older ones."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    target = Path(folder) / f"step-{step}"
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=f"{target}.tmp")  # a collective
    if rank == 0:
        os.replace(f"{target}.tmp", target)
        for old in Path(folder).glob("step-*"):
            if old != target and not old.name.endswith(".tmp"):
                shutil.rmtree(old)
    dist.barrier()  # nobody goes on (or stops) before the snapshot is in place


def load_checkpoint(path: Path, model, optimizer) -> None:
    """Every rank reads the pieces of its own shards, whatever the world size that wrote them."""
    model_state, optimizer_state = get_state_dict(model, optimizer)  # the shards this run wants, to fill in place
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
