"""Notebook 07, exercise 4 (the capstone): the four functions of my_real_job.py, as examples/train_ddp_real.py has them."""

import contextlib
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Subset, TensorDataset


def train_step(model, group, optimizer, scaler, amp_dtype, max_grad_norm: float, device) -> float:
    """One optimizer step over a group of micro-batches; only the last backward all-reduces. Returns the loss sum."""
    samples, total = sum(len(x) for x, _ in group), 0.0
    for i, (x, y) in enumerate(group):
        x, y = x.to(device), y.to(device)
        # DDP decides in the forward whether the backward all-reduces: no_sync must wrap the forward as well
        sync = contextlib.nullcontext() if i == len(group) - 1 else model.no_sync()
        with sync:
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                logits = model(x)
            loss = nn.functional.binary_cross_entropy_with_logits(logits.float(), y, reduction="sum")
            scaler.scale(loss / samples).backward()  # this rank's mean over the group; DDP averages over ranks
        total += loss.item()
    scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
    nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)  # after DDP's all-reduce: the global norm
    scaler.step(optimizer)  # skips the step if fp16 overflowed
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return total


@torch.no_grad()
def evaluate(model: nn.Module, held_out: TensorDataset, rank: int, world_size: int, device) -> tuple[float, float]:
    """Mean loss and accuracy over every held-out sample exactly once: rank r scores r, r + W, ... (no padding)."""
    mine = Subset(held_out, range(rank, len(held_out), world_size))
    totals = torch.zeros(3, device=device)  # loss sum, correct, count
    model.eval()
    for x, y in DataLoader(mine, batch_size=256):
        x, y = x.to(device), y.to(device)
        logits = model(x)
        totals += torch.stack([nn.functional.binary_cross_entropy_with_logits(logits, y, reduction="sum"),
                               ((logits > 0).float() == y).sum(), torch.tensor(float(len(x)), device=device)])
    model.train()
    dist.all_reduce(totals)  # every rank calls it, even one with no held-out sample
    return (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()


def save_checkpoint(path: str, model, optimizer, scaler, next_epoch: int, rank: int) -> None:
    """Rank 0 writes the whole state to a temporary file and renames it: the old snapshot or the new, never half."""
    rng = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(torch.get_rng_state(), rng, dst=0)  # every rank calls it: each rank's random state
    if rank == 0:
        state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                 "scaler": scaler.state_dict(), "epoch": next_epoch, "rng": rng}
        tmp = f"{path}.tmp{os.getpid()}"  # this process's own: two runs on one path never share it
        try:
            torch.save(state, tmp)
            with open(tmp, "rb") as written:
                os.fsync(written.fileno())  # on the disk before the rename, power cut or not
            os.replace(tmp, path)  # one step: whoever reads path finds the old snapshot or the new
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)  # a failed save leaves no temporary file behind
            raise
        if os.name == "posix":  # the rename on the disk too (Windows cannot fsync a folder)
            folder = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
            os.fsync(folder)
            os.close(folder)
    dist.barrier()  # nobody goes on (or stops) before the snapshot is complete


def load_checkpoint(path: str, model, optimizer, scaler, rank: int, device) -> int:
    """Every rank loads the snapshot onto its device; returns the epoch to start from (0 without one)."""
    if not os.path.exists(path):
        return 0
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except Exception:  # one sentence instead of torch's traceback
        sys.exit(f"[rank {rank}] cannot resume: {path} is empty, cut short or not torch.save's.")
    asked = [group["lr"] for group in optimizer.param_groups]  # --lr: load_state_dict restores the saved one
    try:
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        rng, epoch = state["rng"], state["epoch"]
    except (KeyError, TypeError, IndexError) as exc:  # not the dict save_checkpoint writes
        sys.exit(f"[rank {rank}] cannot resume: {path} is not a checkpoint of this script "
                 f"({type(exc).__name__}: {exc}).")
    except (RuntimeError, ValueError):  # the right entries, for other shapes
        sys.exit(f"[rank {rank}] cannot resume: {path} is another model's, optimizer's or "
                 "--precision's.")
    saved = [group["lr"] for group in optimizer.param_groups]
    if saved != asked:  # a silent change of --lr on resume would train on with the old one
        sys.exit(f"[rank {rank}] cannot resume: {path} was trained with --lr {saved[0]:g}; resume with it, or start "
                 "a new --checkpoint.")
    if rank < len(rng):  # at another world size a new rank keeps its own
        torch.set_rng_state(rng[rank].cpu())
    return epoch  # the sampler's order follows from it: set_epoch(epoch) below
