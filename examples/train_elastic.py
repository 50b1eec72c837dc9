"""A job that shrinks and grows: DDP under torchrun with a range of nodes, resuming from a checkpoint each time.

    # one agent per node, a rendezvous store both reach (HOST:PORT, held by one agent or by a host of its own):
    torchrun --nnodes 1:2 --nproc-per-node 1 --max-restarts 3 --rdzv-backend c10d --rdzv-endpoint HOST:PORT \
        --rdzv-id job train_elastic.py --global-batch-size 8

Notebook 11 runs two such agents on one machine, each with `--rdzv-conf is_host=false,last_call_timeout=1
--monitor-interval 0.5`: the store is held by the notebook (so killing either agent leaves it), the rendezvous
waits 1 s for more nodes once it has the minimum (torch's default: 30 s), and each agent checks its workers every
0.5 s (torch's default: 0.1 s). It keeps torch's keep-alive: a node counts as gone after 3 missed heartbeats, 5 s
apart. torch 2.13's agents also needed TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 there, or a node joining a later round
waited for a MASTER_ADDR the first round had written once.

When a node dies, the survivors' workers fail in their next all-reduce; their agent restarts them (one of its
--max-restarts: each agent counts its own), the rendezvous closes with the nodes still there, and the script resumes
from the last step rank 0 saved. When a node comes back, the agents restart their workers to let it in (that restart
is not counted). The global batch stays --global-batch-size: each of the W ranks takes its W-th of every step's rows,
so the weights are the ones one process with the whole batch would reach, whatever W each step had.
Every rank reads rank 0's file: on several machines it must be on a file system they share. Rank 0 saves alone with
torch.save while the others go on: fine for a model whose save takes far less than --timeout (notebook 11 shows the
failure when it does not); DCP, which every rank writes, is the general answer.
"""

import argparse
import contextlib
import gc
import math
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def make_model(seed: int = 0, features: int = 16) -> nn.Module:
    """A small MLP: replace with your own model."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(features, 32), nn.Tanh(), nn.Linear(32, 1))


def global_batch(step: int, size: int, features: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank draws the step's whole global batch alike, then keeps its own rows."""
    g = torch.Generator().manual_seed(step)
    x = torch.randn(size, features, generator=g)
    return x, torch.tanh(x @ torch.linspace(-0.5, 0.5, features)).unsqueeze(1)  # a rule the model can learn


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 (argparse refuses anything else in one line)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return int(text)


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0 (float() alone takes 'nan' and 'inf' too)."""
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number > 0")
    return value


def file_to_write(text: str) -> str:
    """An argparse type: a file in a folder that exists, checked now rather than after training."""
    folder = os.path.dirname(os.path.abspath(text))
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file name")
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"there is no folder {folder} to write {text} in")
    return text


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=positive_int, default=30)
    parser.add_argument("--global-batch-size", type=positive_int, default=8,
                        help="rows per step over all ranks, kept")
    parser.add_argument("--lr", type=positive_float, default=0.02)
    parser.add_argument("--checkpoint", type=file_to_write, default="elastic.pt",
                        help="rank 0 saves here after every step")
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep in each step (time to kill a node)")
    parser.add_argument("--timeout", type=positive_float, default=30,
                        help="seconds a collective waits for the others")
    parser.add_argument("--out", type=file_to_write, default=None,
                        help="write the final weights here (rank 0)")
    args = parser.parse_args()
    if not 0 <= args.step_seconds < math.inf:  # time.sleep refuses a negative time; nan is neither
        parser.error(f"argument --step-seconds: {args.step_seconds} is not a finite number >= 0")
    return args


def resume(model: DDP, optimizer, path: Path) -> int:
    """Every rank loads the last step rank 0 saved; the step to start from."""
    if not path.exists():
        return 0
    try:
        saved = torch.load(path, map_location="cpu")
        model.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        return saved["step"]
    except Exception as exc:  # empty, cut short, another script's or model's: a sentence
        said = (str(exc) or "it ends early").splitlines()[0].split(". ")[0]  # a sentence
        sys.exit(f"[rank {dist.get_rank()}] cannot resume from {path}, damaged or not this "
                 f"script's: {type(exc).__name__}: {said}")


def save(model: DDP, optimizer, step: int, path: Path) -> None:
    """Rank 0 writes a new file and renames it into place: a node that dies mid-write leaves the old one whole."""
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")  # this process's own: runs never share it
    state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
    try:
        torch.save(state, tmp)
        with open(tmp, "rb") as written:
            os.fsync(written.fileno())  # on the disk before the rename, power cut or not
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()  # a failed save leaves no temporary file behind
        raise
    if os.name == "posix":  # the rename on the disk too (Windows cannot fsync a folder)
        handle = os.open(path.resolve().parent, os.O_RDONLY)
        os.fsync(handle)
        os.close(handle)


def stop_if_not_finite(loss: float, where: str, rank: int | None = None) -> None:
    """Stop with one line when the loss is NaN or inf: every later step would only spread it. Under torchrun the
    line names the rank, and torchrun then stops the other ranks."""
    if not math.isfinite(loss):
        who = "" if rank is None else f"[rank {rank}] "
        sys.stderr.write(f"{who}loss is {loss} {where}: lower --lr?\n")  # one write: ranks' lines never interleave
        sys.exit(1)


def main() -> None:
    args = parse_args()
    if "LOCAL_RANK" not in os.environ:
        sys.exit("start me with torchrun: torchrun --standalone --nproc-per-node 2 train_elastic.py")
    dist.init_process_group("gloo", timeout=timedelta(seconds=max(args.timeout, 60)))  # CPU: see train_ddp.py for GPUs
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if args.global_batch_size % world_size:
        sys.exit(f"--global-batch-size {args.global_batch_size} does not split over {world_size} ranks.")
    per_rank, restarts = args.global_batch_size // world_size, os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    print(f"[rank {rank}/{world_size}] started; this rank's agent has restarted its workers {restarts} times",
          flush=True)
    group = dist.new_group(timeout=timedelta(seconds=args.timeout))
    model = DDP(make_model(), process_group=group)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)  # momentum: state that must resume
    path = Path(args.checkpoint)
    start = resume(model, optimizer, path)
    if rank == 0 and start >= args.steps:
        print(f"nothing left to train: {path} already holds {start} steps and --steps is "
              f"{args.steps}", flush=True)
    elif rank == 0:
        print(f"steps {start + 1}-{args.steps} on {world_size} ranks: global batch {args.global_batch_size} = "
              f"{world_size} x {per_rank}", flush=True)
    for step in range(start, args.steps):
        x, y = global_batch(step, args.global_batch_size)
        mine = slice(rank * per_rank, (rank + 1) * per_rank)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x[mine]), y[mine])
        stop_if_not_finite(loss.item(), f"at step {step + 1}", rank)
        loss.backward()  # the mean over ranks of equal shares: the gradient of the whole batch's mean loss
        optimizer.step()
        if rank == 0:
            save(model, optimizer, step + 1, path)
            print(f"step {step + 1}/{args.steps} on {world_size} ranks  loss {loss.item():.4f}", flush=True)
        time.sleep(args.step_seconds)
    if rank == 0 and args.out:
        torch.save(model.module.state_dict(), args.out)
    del model, optimizer  # free DDP before its groups (see train_ddp.py)
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
