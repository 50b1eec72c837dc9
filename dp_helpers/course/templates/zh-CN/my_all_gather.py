"""笔记本 03 的练习：用沿环传递的消息实现全收集（all-gather）。请写出 ring_all_gather()。

check_my_all_gather("my_all_gather.py") 会在 3 个和 4 个 gloo rank 上运行它，并与 dist.all_gather 对照。
"""

import torch
import torch.distributed as dist


def ring_all_gather(mine: torch.Tensor) -> torch.Tensor:
    """每个 rank 的 `mine`（所有 rank 上形状相同），按 rank 顺序沿第 0 维拼接。"""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world_size, (rank - 1) % world_size  # noqa: F841 （只需要与这两个 rank 通信）
    pieces = [torch.empty_like(mine) for _ in range(world_size)]  # pieces[k] 将存放 rank k 的张量
    pieces[rank] = mine.clone()
    raise NotImplementedError  # 你的代码：world_size - 1 步，每步向右发送一块、从左边接收一块
    return torch.cat(pieces)
