"""笔记本 04 的练习：DDP 的核心。请写出 ready() 和 launch()；其余部分都已给出。

check_my_ddp("my_ddp_core.py") 会在 2 个 gloo rank 上运行这个 MyDDP，并与 torch 的 DistributedDataParallel 对照。
"""

import torch  # noqa: F401 （供你的代码使用）
import torch.distributed as dist  # noqa: F401 （供你的代码使用）
from torch import nn

from dp_helpers.scratch.ddp.mini_ddp import assign_buckets, broadcast_state, engine_callback


class MyDDP(nn.Module):
    """在反向传播仍在进行时，一次一个扁平梯度桶地把梯度在所有 rank 上取平均。"""

    def __init__(self, module: nn.Module, bucket_cap_bytes: int):
        super().__init__()
        self.module = module
        broadcast_state(module)  # 每个 rank 从同一个起点开始
        params = list(reversed(list(module.parameters())))  # 反向传播产生梯度的顺序
        groups = assign_buckets([p.numel() * p.element_size() for p in params], bucket_cap_bytes)
        self.buckets = [[params[i] for i in group] for group in groups]  # 每个梯度桶是一个参数列表
        self.ready_params, self.next, self.pending = set(), 0, []  # pending：(梯度桶编号, 扁平缓冲区, work)
        for p in params:
            p.register_post_accumulate_grad_hook(self.ready)

    def forward(self, *args, **kwargs):
        """被包装模块的前向传播。"""
        return self.module(*args, **kwargs)

    def ready(self, param: nn.Parameter) -> None:
        """钩子：param.grad 已是最终值。把它标记为就绪，再按顺序发起每个轮到且已装满的梯度桶。"""
        if not self.ready_params:  # 本次反向传播的第一个梯度：反向传播结束后运行 finish()
            engine_callback(self.finish)
        raise NotImplementedError  # 你的代码：把 param 加入 self.ready_params；只要已装满，就依次发起 self.next 号梯度桶……

    def launch(self, k: int) -> None:
        """把第 k 个梯度桶的梯度展平到一个缓冲区并除以进程总数，然后开始它的全归约。"""
        raise NotImplementedError  # 你的代码：一个扁平缓冲区、dist.all_reduce(..., async_op=True)、self.pending

    def finish(self) -> None:
        """反向传播之后：等待每个全归约完成，再把平均后的梯度复制回 .grad。"""
        for k, flat, work in self.pending:
            work.wait()
            offset = 0
            for p in self.buckets[k]:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        self.ready_params, self.next, self.pending = set(), 0, []
