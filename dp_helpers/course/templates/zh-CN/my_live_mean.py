"""练习：存活副本的平均，即逐步容错的训练任务所取的平均。请写出 live_mean()。

check_my_live_mean("my_live_mean.py") 会在 3 个和 4 个 gloo rank 上运行它，其中一些 rank 代表已经死掉的副本。
"""

import torch
import torch.distributed as dist  # noqa: F401 （你的代码会用到它）


def live_mean(grads: list[torch.Tensor], alive: bool) -> int:
    """每个 rank 的 grads 就地变为它们在存活 rank 上的平均；返回存活的 rank 数。"""
    # 每个 rank 都会调用它。alive=False 的 rank 代表在这一步死掉的副本：它的值不能计入，但它同样要拿到平均值。
    # 至少有一个 rank 存活。
    raise NotImplementedError  # 你的代码：对存活 rank 持有的值及其个数做全归约，再相除
