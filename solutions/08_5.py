"""Notebook 08, exercise 5: the three functions of my_fsdp.py, as examples/train_fsdp.py has them."""

import os
import shutil
import sys
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
    tmp = [f"{target}.tmp{os.getpid()}"]  # rank 0's pid: two runs in one folder never share it
    dist.broadcast_object_list(tmp, src=0)  # every rank writes into rank 0's name
    state = {"model": model_state, "optimizer": optimizer_state}
    try:
        dcp.save(state, checkpoint_id=tmp[0])  # a collective; DCP fsyncs each file it writes
    except BaseException:
        if rank == 0:
            shutil.rmtree(tmp[0], ignore_errors=True)  # a failed save leaves no temporary folder
        raise
    if rank == 0:
        os.replace(tmp[0], target)  # the whole snapshot appears at once
        for old in Path(folder).glob("step-*"):
            if old != target and old.name[5:].isdigit():  # older snapshots, not temporary ones
                shutil.rmtree(old)
        if os.name == "posix":  # the rename on the disk too (Windows cannot fsync a folder)
            handle = os.open(folder, os.O_RDONLY)
            os.fsync(handle)
            os.close(handle)
    dist.barrier()  # nobody goes on (or stops) before the snapshot is in place


def load_checkpoint(path: Path, model, optimizer) -> None:
    """Every rank reads the pieces of its own shards, whatever the world size that wrote them."""
    model_state, optimizer_state = get_state_dict(model, optimizer)  # the shards this run wants, to fill in place
    state = {"model": model_state, "optimizer": optimizer_state}
    try:
        dcp.FileSystemReader(path).read_metadata()  # its index first: else DCP logs tracebacks
        dcp.load(state, checkpoint_id=str(path))
    except (Exception, dcp.api.CheckpointException) as exc:  # on every rank if one failed
        failures = getattr(exc, "failures", {0: (exc, None)})  # a CheckpointException: each rank's
        failure = next(iter(failures.values()))[0]
        said = (str(failure) or "it ends early").splitlines()[0].split(". ")[0]  # a sentence
        sys.exit(f"[rank {dist.get_rank()}] cannot resume from {path}, a damaged DCP checkpoint or "
                 f"another model's: {type(failure).__name__}: {said}")
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
