"""Checkpoints that do not stall training: DDP saving with DCP's async_save, against a synchronous save.

    torchrun --standalone --nproc-per-node 2 checkpoint_async.py --mode async --slow-disk 0.5
    torchrun --standalone --nproc-per-node 2 checkpoint_async.py --mode async   # again: it resumes

--mode sync: every rank waits in dcp.save until every rank's part and the metadata are written. --mode async: dcp.async_save copies the state to
CPU memory and returns; a thread writes it while training goes on, over a gloo group of its own. --mode rank0: the
common mistake, rank 0 alone writes with torch.save while the others go on to the next step's all-reduce; a save
longer than --timeout fails the others. --slow-disk S makes each rank's write take S seconds longer (an emulated slow
disk). Rank 0 prints one JSON line: the seconds each rank spent stalled in saving.
"""

import argparse
import contextlib
import gc
import json
import math
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP


class SlowDisk(dcp.FileSystemWriter):
    """A FileSystemWriter whose writes take `delay` seconds longer: a slow disk or a network file system, emulated."""

    def __init__(self, path, delay: float):
        super().__init__(path)
        self.delay = delay

    def write_data(self, plan, planner):
        time.sleep(self.delay)
        return super().write_data(plan, planner)


def make_model(seed: int = 0, width: int = 256, layers: int = 4) -> nn.Module:
    """An MLP of a few MB: replace with your own model."""
    torch.manual_seed(seed)
    return nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())], nn.Linear(width, 1))


def batch(step: int, rank: int, size: int, device, width: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch for this step, the same whether the run was interrupted or not."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(size, width, generator=g)
    return x.to(device), x[:, :1].sin().to(device)


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 (argparse refuses anything else in one line)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return int(text)


def seconds(text: str) -> float:
    """An argparse type: a finite number of seconds >= 0 (float() alone takes 'nan', 'inf')."""
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number >= 0")
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
    parser.add_argument("--mode", choices=("sync", "async", "rank0"), default="async")
    parser.add_argument("--steps", type=positive_int, default=20)
    parser.add_argument("--save-every", type=positive_int, default=5)
    parser.add_argument("--stop-after", type=positive_int, default=None,
                        help="stop after this many steps (to resume later)")
    parser.add_argument("--checkpoint", default="ck_async",
                        help="a folder: step-N in it, resumed from the newest complete one")
    parser.add_argument("--slow-disk", type=seconds, default=0.0,
                        help="seconds added to each rank's write")
    parser.add_argument("--batch-size", type=positive_int, default=32,
                        help="samples per step, per process")
    parser.add_argument("--timeout", type=seconds, default=60,
                        help="seconds a collective waits for the others")
    parser.add_argument("--out", type=file_to_write, default=None,
                        help="write the final weights here (rank 0)")
    args = parser.parse_args()
    if args.timeout == 0:
        parser.error("argument --timeout: must be more than 0 seconds")
    if os.path.isfile(args.checkpoint):
        parser.error(f"argument --checkpoint: {args.checkpoint} is a file, not a folder")
    return args


def latest(folder: Path) -> tuple[Path | None, int]:
    """The newest complete checkpoint and its step: DCP writes a folder's .metadata last; step-N.pt is renamed when done."""
    done = [p for p in folder.glob("step-*") if (p / ".metadata").exists() or p.name.endswith(".pt")]
    steps = {int(p.name.removeprefix("step-").removesuffix(".pt")): p for p in done}
    return (steps[max(steps)], max(steps)) if steps else (None, 0)


def resume(model: DDP, optimizer, folder: Path) -> int:
    """Load the newest complete checkpoint into the model and the optimizer on every rank; the step it was taken at."""
    path, step = latest(folder)
    if path is None:
        return 0
    try:
        if path.suffix == ".pt":  # rank 0's torch.save: every rank reads the whole file
            saved = torch.load(path, map_location="cpu")
            model.module.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
        else:
            model_state, optimizer_state = get_state_dict(model, optimizer)
            state = {"model": model_state, "optimizer": optimizer_state}
            dcp.FileSystemReader(path).read_metadata()  # its index first: else DCP logs tracebacks
            dcp.load(state, checkpoint_id=str(path))  # a collective: each rank reads what it needs
            set_state_dict(model, optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optimizer"])
    except (Exception, dcp.api.CheckpointException) as exc:  # on every rank if one failed
        failures = getattr(exc, "failures", {0: (exc, None)})  # a CheckpointException: each rank's
        failure = next(iter(failures.values()))[0]
        said = (str(failure) or "it ends early").splitlines()[0].split(". ")[0]  # a sentence
        sys.exit(f"[rank {dist.get_rank()}] cannot resume from {path}, damaged or another model's: "
                 f"{type(failure).__name__}: {said}")
    return step


class Saver:
    """Saves every --save-every steps in the chosen mode and counts the seconds this rank was stalled by it."""

    def __init__(self, args, rank: int):
        self.args, self.rank, self.folder = args, rank, Path(args.checkpoint)
        self.stalled, self.pending = 0.0, None
        # async_save's thread runs collectives of its own: on the training group they would interleave with DDP's
        self.group = dist.new_group(backend="gloo") if args.mode == "async" else None

    def save(self, model: DDP, optimizer, step: int) -> None:
        """One checkpoint at this step; the time this rank spends in here is its stall."""
        start = time.perf_counter()
        if self.args.mode == "rank0":
            self.save_on_rank0(model, optimizer, step)
        else:
            model_state, optimizer_state = get_state_dict(model, optimizer)
            state, writer = {"model": model_state, "optimizer": optimizer_state}, SlowDisk(
                self.folder / f"step-{step}", self.args.slow_disk)
            if self.args.mode == "sync":
                dcp.save(state, storage_writer=writer)
            else:
                self.wait()  # one save in flight at a time: the previous one must be on disk first
                self.pending = dcp.async_save(state, storage_writer=writer, process_group=self.group)
        self.stalled += time.perf_counter() - start

    def save_on_rank0(self, model: DDP, optimizer, step: int) -> None:
        """The mistake: rank 0 writes alone while the others run on into the next all-reduce."""
        if self.rank == 0:
            self.folder.mkdir(parents=True, exist_ok=True)
            time.sleep(self.args.slow_disk)
            tmp = self.folder / f"step-{step}.tmp{os.getpid()}"  # this process's: no run shares it
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}
            try:
                torch.save(state, tmp)
                with open(tmp, "rb") as written:
                    os.fsync(written.fileno())  # on the disk before the rename, power cut or not
                tmp.replace(self.folder / f"step-{step}.pt")
            except BaseException:
                with contextlib.suppress(OSError):
                    tmp.unlink()  # a failed save leaves no temporary file behind
                raise
            if os.name == "posix":  # the rename on the disk too (Windows cannot fsync a folder)
                handle = os.open(self.folder, os.O_RDONLY)
                os.fsync(handle)
                os.close(handle)

    def wait(self) -> None:
        """Block until the save in flight, if any, is on disk."""
        if self.pending is not None:
            self.pending.result()
            self.pending = None


def stalls(seconds: float, world_size: int) -> list[float]:
    """Every rank's stall, gathered (every rank calls this)."""
    each = torch.zeros(world_size, dtype=torch.float64)
    each[dist.get_rank()] = seconds
    dist.all_reduce(each)
    return [round(s, 4) for s in each.tolist()]


def main() -> None:
    args = parse_args()
    if "LOCAL_RANK" not in os.environ:
        sys.exit("start me with torchrun: torchrun --standalone --nproc-per-node 2 checkpoint_async.py")
    local_rank = int(os.environ["LOCAL_RANK"])
    on_gpu = torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"])
    device = torch.device("cuda", local_rank) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    # 60 s for every rank to arrive; then the training group's collectives wait --timeout for the others
    dist.init_process_group("cpu:gloo,cuda:nccl" if on_gpu else "gloo", timeout=timedelta(seconds=60))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(timeout=timedelta(seconds=args.timeout))
    model = DDP(make_model().to(device), device_ids=[local_rank] if on_gpu else None, process_group=group)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)  # state to save: two moments per weight
    start = resume(model, optimizer, Path(args.checkpoint))
    if rank == 0 and start >= args.steps:
        print(f"nothing left to train: {args.checkpoint} already holds {start} steps and --steps "
              f"is {args.steps}", flush=True)
    elif rank == 0 and start:
        print(f"resumed at step {start + 1}", flush=True)
    saver, last = Saver(args, rank), min(args.steps, start + (args.stop_after or args.steps))
    began = time.perf_counter()
    for step in range(start, last):
        x, y = batch(step, rank, args.batch_size, device)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()  # DDP's all-reduce: every rank must be here
        optimizer.step()
        if (step + 1) % args.save_every == 0:
            saver.save(model, optimizer, step + 1)
    saver.wait()  # the last save on disk before anyone reads it or the process ends
    seconds = time.perf_counter() - began
    report = {"mode": args.mode, "steps": last - start, "seconds": round(seconds, 3),
              "stalled_s": stalls(saver.stalled, world_size)}
    if rank == 0:
        print(json.dumps(report), flush=True)
        if args.out:
            torch.save(model.module.state_dict(), args.out)
    del model, optimizer, saver  # free DDP before its groups (see train_ddp.py)
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
