"""Exercise: the survivors' average, as a per-step fault-tolerant job takes it. Write live_mean().

check_my_live_mean("my_live_mean.py") runs it on 3 and 4 gloo ranks, some of them standing for replicas that died.
"""

import torch
import torch.distributed as dist  # noqa: F401 (your code will use it)


def live_mean(grads: list[torch.Tensor], alive: bool) -> int:
    """Every rank's grads become, in place, their mean over the live ranks only; returns how many ranks are alive."""
    # Every rank calls this. A rank with alive=False stands for a replica that died in this step: its values must not
    # count, yet it takes the mean too. At least one rank is alive.
    raise NotImplementedError  # your code: all-reduce what the live ranks hold, and how many they are; then divide
