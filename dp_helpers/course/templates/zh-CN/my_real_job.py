"""笔记本 07 的综合练习：用于真实任务的 DDP。请写出 train_step、evaluate、save_checkpoint 和 load_checkpoint。

check_real_job("my_real_job.py") 用 torchrun 在 2 个 gloo rank 上运行它（训练一个 epoch 后停下再恢复），再在 3 个 rank 上运行，
并把每次的结果与全局批次为 48 的单进程对照。文件的其余部分与 examples/train_ddp_real.py 相同。
"""

import argparse
import contextlib  # noqa: F401 （你的 train_step 要用它来选择是否 no_sync）
import gc
import math
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset  # noqa: F401 （evaluate 要用它）


def make_data(seed: int, samples: int = 960, held_out: int = 250, features: int = 20):
    """A training set and a held-out set labelled by one hidden linear rule: replace with your own."""
    g = torch.Generator().manual_seed(seed)
    rule = torch.randn(features, 1, generator=g)
    x = torch.randn(samples + held_out, features, generator=g)
    y = (x @ rule + 0.3 * torch.randn(samples + held_out, 1, generator=g) > 0).float()
    return TensorDataset(x[:samples], y[:samples]), TensorDataset(x[samples:], y[samples:])


def make_model(seed: int, features: int = 20) -> nn.Module:
    """A small MLP: replace with your own model."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(features, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))


def pick_device(local_rank: int, local_world_size: int) -> tuple[torch.device, str]:
    """One GPU per process when this machine has enough of them (NCCL), else the CPU (gloo)."""
    if torch.cuda.device_count() >= local_world_size:
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), "nccl"
    return torch.device("cpu"), "gloo"


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
    parser.add_argument("--epochs", type=positive_int, default=6)
    parser.add_argument("--batch-size", type=positive_int, default=16,
                        help="samples per micro-batch, per process")
    parser.add_argument("--grad-accum-steps", type=positive_int, default=2,
                        help="micro-batches per optimizer step")
    parser.add_argument("--lr", type=positive_float, default=0.05)
    parser.add_argument("--max-grad-norm", type=positive_float, default=1.0,
                        help="clip the global gradient norm to this")
    parser.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32",
                        help="bf16: autocast; fp16: autocast with a GradScaler (GPUs, in this script)")
    parser.add_argument("--checkpoint", type=file_to_write, default=None,
                        help="save after every epoch; resume from it if it exists")
    parser.add_argument("--stop-after", type=positive_int, default=None,
                        help="stop after this many epochs of this run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=file_to_write, default="model.pt")
    parser.add_argument("--timeout", type=positive_float, default=60,
                        help="seconds to wait for the others")
    return parser.parse_args()


def micro_batch_groups(loader, k: int):
    """The loader's batches in groups of k: one optimizer step each (the epoch's last group may be shorter)."""
    group = []
    for batch in loader:
        group.append(batch)
        if len(group) == k:
            yield group
            group = []
    if group:
        yield group


def train_step(model, group, optimizer, scaler, amp_dtype, max_grad_norm: float, device) -> float:
    """对一组微批次做一次优化器步骤；只有最后一次反向做全归约。返回损失之和。"""
    # 你的代码。对这一组里的每个微批次 (x, y)（先移到 device 上）：
    #   - 只有这一组的最后一个微批次可以做全归约：其余微批次的前向和反向都要放在 model.no_sync() 里
    #   - 前向放在 torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None) 里
    #   - loss = binary_cross_entropy_with_logits(logits.float(), y, reduction="sum")；对
    #     scaler.scale(loss / samples) 做反向，samples 是这一组的样本数
    # 然后 unscale 梯度，把它裁剪到 max_grad_norm，通过 scaler 执行优化器步骤、更新 scaler，再把梯度清零。
    raise NotImplementedError


def stop_if_not_finite(loss: float, where: str, rank: int | None = None) -> None:
    """Stop with one line when the loss is NaN or inf: every later step would only spread it. Under torchrun the
    line names the rank, and torchrun then stops the other ranks."""
    if not math.isfinite(loss):
        who = "" if rank is None else f"[rank {rank}] "
        sys.stderr.write(f"{who}loss is {loss} {where}: lower --lr?\n")  # one write: ranks' lines never interleave
        sys.exit(1)


@torch.no_grad()
def evaluate(model: nn.Module, held_out: TensorDataset, rank: int, world_size: int, device) -> tuple[float, float]:
    """在所有 rank 上，对每个验证集样本恰好评估一次，返回平均损失和准确率。"""
    # 你的代码：rank r 评估第 r、r + world_size、……个样本（不要用 DistributedSampler：它会填充），对损失、预测正确的个数
    # 和样本数分别求和，对这三个和做全归约（每个 rank 都要调用），再相除。
    raise NotImplementedError


def save_checkpoint(path: str, model, optimizer, scaler, next_epoch: int, rank: int) -> None:
    """只由 rank 0 原子地保存模型、优化器、scaler、next_epoch 和每个 rank 的随机数状态。"""
    # 你的代码：把每个 rank 的 torch.get_rng_state() 收集到 rank 0（这是集合通信：每个 rank 都要调用）；rank 0 把状态字典
    # 写进一个临时文件，再把它重命名为 `path`；然后每个 rank 都在屏障处等待。
    raise NotImplementedError


def load_checkpoint(path: str, model, optimizer, scaler, rank: int, device) -> int:
    """每个 rank 把快照加载到自己的设备上；返回开始训练的 epoch（没有快照时为 0）。"""
    # 你的代码：`path` 处没有文件就返回 0；否则用 map_location=device 加载，恢复模型（它的 module）、优化器、scaler
    # 和本 rank 的随机数状态（如果保存了的话），并返回保存的 epoch。
    raise NotImplementedError


def main() -> None:
    args = parse_args()
    if "LOCAL_RANK" not in os.environ:
        sys.exit("start me with torchrun: torchrun --standalone --nproc-per-node 2 train_ddp_real.py")
    local_rank, local_world_size = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    device, backend = pick_device(local_rank, local_world_size)
    if args.precision == "fp16" and device.type != "cuda":
        sys.exit("--precision fp16 runs on GPUs in this script (a GradScaler guards its range); on CPUs use bf16.")
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
    rank, world_size = dist.get_rank(), dist.get_world_size()

    train_set, held_out = make_data(args.seed)
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    model = DDP(make_model(args.seed).to(device), device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    amp_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]
    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "fp16")  # 只有 fp16 时才起作用
    start = load_checkpoint(args.checkpoint, model, optimizer, scaler, rank, device) if args.checkpoint else 0
    if rank == 0 and start >= args.epochs:
        print(f"nothing left to train: {args.checkpoint} already holds {start} epochs and --epochs "
              f"is {args.epochs}", flush=True)
    elif rank == 0 and start:
        print(f"resumed from {args.checkpoint} at epoch {start + 1}", flush=True)

    last = args.epochs if args.stop_after is None else min(args.epochs, start + args.stop_after)
    for epoch in range(start, last):
        sampler.set_epoch(epoch)  # 每个 epoch 换一种顺序，每个 rank 都相同，恢复之后也一样
        total = torch.zeros(2, device=device)  # 本 rank 的损失之和与样本数
        for step, group in enumerate(micro_batch_groups(loader, args.grad_accum_steps)):
            loss_sum = train_step(model, group, optimizer, scaler, amp_dtype, args.max_grad_norm, device)
            stop_if_not_finite(loss_sum, f"at step {step + 1} of epoch {epoch + 1}", rank)
            total += torch.tensor([loss_sum, sum(len(x) for x, _ in group)], device=device)
        dist.all_reduce(total)
        held_loss, accuracy = evaluate(model.module, held_out, rank, world_size, device)
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}  train loss {(total[0] / total[1]).item():.4f}  "
                  f"held-out loss {held_loss:.4f}  accuracy {accuracy:.1%}", flush=True)
        if args.checkpoint:
            save_checkpoint(args.checkpoint, model, optimizer, scaler, epoch + 1, rank)

    if rank == 0 and last == args.epochs:
        torch.save(model.module.state_dict(), args.out)  # 未包装模型的权重，只写一次
    del model, optimizer  # 先释放 DDP 再销毁进程组，否则 gloo 可能在退出时异常终止
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
