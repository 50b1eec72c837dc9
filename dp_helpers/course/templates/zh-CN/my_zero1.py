"""笔记本 08 的练习：ZeRO-1 的一步。请写出 step()；它周围的扁平缓冲区已经给出。

check_my_zero1("my_zero1.py") 会在 2 个和 3 个 gloo rank 上用这个优化器训练，并与单进程的结果比较。
"""

import torch
import torch.distributed as dist

# torch 2.13 中它们叫 reduce_scatter_single 和 all_gather_single；更早的版本只有 *_tensor 这两个名字
reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class MyZero1:
    """带动量的 SGD：每个 rank 只为参数中属于自己的那一块保存动量（ZeRO 第 1 阶段）。"""

    def __init__(self, params, lr: float, momentum: float):
        self.params, self.lr, self.momentum = list(params), lr, momentum
        self.world_size, self.rank = dist.get_world_size(), dist.get_rank()
        numel = sum(p.numel() for p in self.params)
        self.chunk = -(-numel // self.world_size)  # 每个 rank 在扁平缓冲区中分到的长度（最后一块补零）
        self.velocity = torch.zeros(self.chunk)  # 本 rank 的优化器状态：全部的 1/world_size

    def flat(self, tensors) -> torch.Tensor:
        """把这些张量展平、拼接，再补零到 world_size 块。"""
        flat = torch.cat([t.detach().flatten() for t in tensors])
        return torch.cat([flat, flat.new_zeros(self.chunk * self.world_size - flat.numel())])

    def write_back(self, flat: torch.Tensor) -> None:
        """把扁平（已补零）缓冲区中的值复制回各个参数。"""
        offset = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def zero_grad(self) -> None:
        """丢弃梯度。"""
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        """对梯度做归约-散射，更新本 rank 的那一块（带动量的 SGD），再全收集所有块。"""
        raise NotImplementedError  # 你的代码：见笔记本中的三个步骤
