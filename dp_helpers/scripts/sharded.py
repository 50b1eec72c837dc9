"""Sharded data parallelism measured: ZeRO-1/2/3 from scratch, ZeroRedundancyOptimizer and FSDP2 next to DDP (notebook 08).

Run with run_ddp("dp_helpers.scripts.sharded", "--experiment", "weights", "memory", world_size=2); rank 0 writes
<experiment>.json with every rank's result.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from dp_helpers.scratch.sharding import fsdp, zero, zero3
from dp_helpers.scratch.sharding.memory import held_bytes, local
from dp_helpers.scripts.from_scratch import batch, global_batch
from dp_helpers.scripts.train import counting_hook
from dp_helpers.tool import dist as dph
from dp_helpers.tool.env import worker_numerics
from dp_helpers.tool.training import bce_loss


def mlp(seed: int, width: int = 32, depth: int = 3) -> nn.Module:
    """Tanh MLP, the second hidden layer without bias, seeded."""
    # not ReLU: with it one first gradient was -2.9e-9 in one process and -3.0e-9 summed from two halves, and Adam,
    # which divides by sqrt(v) + eps, turned that rounding into a 5e-5 difference in a weight (DDP vs one process)
    torch.manual_seed(seed)
    layers, dim = [], 10
    for i in range(depth):
        layers += [nn.Linear(dim, width, bias=i != 1), nn.Tanh()]
        dim = width
    return nn.Sequential(*layers, nn.Linear(dim, 1), nn.Sigmoid())


class Plain:
    """A model and its optimizer: the common face of every strategy (step, zero_grad, sent, full weights)."""

    def __init__(self, model: nn.Module, opt):
        self.model, self.opt, self.comm = model, opt, {"allreduces": 0, "bytes": 0}
        if isinstance(model, DDP):
            model.register_comm_hook(self.comm, counting_hook)  # DDP's all-reduce, counting the bytes it hands over

    @property
    def sent(self) -> dict:
        """Bytes handed to each collective so far (DDP's buckets, Zero3Module's; FSDP2's are not counted here)."""
        if isinstance(self.model, DDP):
            return {"all_reduce": self.comm["bytes"]}
        return dict(getattr(self.model, "sent", {}))

    def step(self) -> None:
        """The optimizer step."""
        self.opt.step()

    def zero_grad(self) -> None:
        """Forget the gradients."""
        self.opt.zero_grad()

    def full_weights(self) -> list[torch.Tensor]:
        """Every parameter in full (a collective for DTensors and for Zero3Module's pieces)."""
        if hasattr(self.model, "full_state_dict"):
            return list(self.model.full_state_dict().values())
        return [p.full_tensor() if hasattr(p, "full_tensor") else p.detach() for p in self.model.parameters()]


def ddp(model: nn.Module, **adam) -> Plain:
    """DDP with gradient_as_bucket_view (gradients stored once) and Adam."""
    wrapped = DDP(model, gradient_as_bucket_view=True)
    return Plain(wrapped, torch.optim.Adam(wrapped.parameters(), **adam))


def torch_zero(model: nn.Module, **adam) -> Plain:
    """DDP and torch's ZeroRedundancyOptimizer (stage 1; whole tensors assigned to ranks)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    wrapped = DDP(model, gradient_as_bucket_view=True)
    return Plain(wrapped, ZeroRedundancyOptimizer(wrapped.parameters(), optimizer_class=torch.optim.Adam, **adam))


def zero_3(model: nn.Module, **adam) -> Plain:
    """Our ZeRO-3 (Zero3Module) and Adam over this rank's pieces."""
    sharded = zero3.Zero3Module(model)
    return Plain(sharded, torch.optim.Adam(sharded.parameters(), **adam))


def fsdp2(model: nn.Module, **adam) -> Plain:
    """torch's fully_shard (FSDP2) and Adam."""
    sharded = fsdp.fully_sharded(model)
    return Plain(sharded, torch.optim.Adam(sharded.parameters(), **adam))


STRATEGIES = {"DDP": ddp, "ZeRO-1": lambda m, **adam: zero.ZeroAdam(m, stage=1, **adam),
              "ZeRO-2": lambda m, **adam: zero.ZeroAdam(m, stage=2, **adam), "ZeRO-3": zero_3,
              "ZeroRedundancyOptimizer": torch_zero, "fully_shard": fsdp2}
# weight decay makes the update depend on the gradient's scale (Adam alone would not notice a missing / world_size)
ADAM = {"lr": 0.01, "weight_decay": 0.1}


def held(strategy) -> dict:
    """Bytes this rank holds under a strategy: the model's parameters and gradients, and the optimizer's state."""
    if isinstance(strategy, zero.ZeroAdam):  # the flat chunk's gradient is where the reduced gradient lives
        params = strategy.params
        return held_bytes(params, [p.grad for p in params] + [strategy.shard.grad], strategy.adam)
    params = list(strategy.model.parameters())
    return held_bytes(params, [p.grad for p in params], getattr(strategy.opt, "optim", strategy.opt))


def train(strategy, info: dph.DistInfo, steps: int) -> list[float]:
    """Adam steps on this rank's rows through the strategy's model (gradients of the last step kept); seconds per step."""
    seconds = []
    for step in range(steps):
        start = time.perf_counter()
        x, y = batch(info, step)
        strategy.zero_grad()
        bce_loss(strategy.model(x), y).backward()
        strategy.step()
        seconds.append(time.perf_counter() - start)
    return seconds


def weights(info: dph.DistInfo, args) -> dict:
    """Every strategy from a different start per rank: its full weights after training."""
    out = {}
    for name in args.strategies or list(STRATEGIES):
        strategy = STRATEGIES[name](mlp(seed=info.rank), **ADAM)
        train(strategy, info, args.steps)
        out[name] = [t.tolist() for t in strategy.full_weights()]
    return out


def memory(info: dph.DistInfo, args) -> dict:
    """Every strategy on a wider MLP: bytes held after a step, bytes handed to collectives per step, median step time."""
    out = {}
    for name in args.strategies or list(STRATEGIES):
        strategy = STRATEGIES[name](mlp(seed=0, width=args.width, depth=args.depth), **ADAM)
        seconds = train(strategy, info, args.steps)
        grads = [local(p.grad) for p in strategy.model.parameters() if p.grad is not None]
        out[name] = {"held": held(strategy), "sent_per_step": {k: v // args.steps for k, v in strategy.sent.items()},
                     "seconds": statistics.median(seconds[1:]),
                     "gradient storages": len({g.untyped_storage().data_ptr() for g in grads})}
    return out


def dtensors(info: dph.DistInfo, args) -> list[dict]:
    """What fully_shard made of each parameter on this rank: a DTensor, its placement, global and local shapes."""
    model = fsdp.fully_sharded(mlp(seed=0))
    return [{"name": name, "type": type(p).__name__, "placements": str(p.placements), "global": list(p.shape),
             "local": list(p.to_local().shape), "stored rows": p.to_local().untyped_storage().nbytes() // 4
             // max(1, p.shape[1:].numel())} for name, p in model.named_parameters()]


@worker_numerics()  # as a rank computes: its thread count
def alone(world_size: int, steps: int) -> list[list]:
    """The reference: one process, Adam, rank 0's start, the whole global batch at every step."""
    model = mlp(seed=0)
    opt = torch.optim.Adam(model.parameters(), **ADAM)
    for step in range(steps):
        x, y = global_batch(step, world_size)
        opt.zero_grad()
        bce_loss(model(x), y).backward()
        opt.step()
    return [p.tolist() for p in model.parameters()]


def prefetch(info: dph.DistInfo, args) -> dict:
    """ZeRO-3 with and without prefetching, and the plain model alone: median seconds of a forward and backward."""
    build = lambda: mlp(seed=0, width=args.width, depth=args.depth)  # noqa: E731
    modes = {"compute only": build(), "prefetch": zero3.Zero3Module(build()),
             "no prefetch": zero3.Zero3Module(build(), prefetch=False)}
    x = torch.randn(args.rows, 10, generator=torch.Generator().manual_seed(info.rank))
    times = {mode: [] for mode in modes}
    for _ in range(args.steps):  # alternating, so that a slow moment of the machine hits every mode alike
        for mode, model in modes.items():
            start = time.perf_counter()
            model(x).square().mean().backward()
            times[mode].append(time.perf_counter() - start)
    units = modes["prefetch"].units
    return {"seconds": {mode: statistics.median(t[1:]) for mode, t in times.items()},
            "unit bytes": [unit.nbytes for unit in units]}


EXPERIMENTS = {"weights": weights, "memory": memory, "dtensors": dtensors, "prefetch": prefetch}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Which experiments, and their settings."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", choices=sorted(EXPERIMENTS), nargs="+", required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--width", type=int, default=256, help="the memory and prefetch experiments' hidden width")
    parser.add_argument("--depth", type=int, default=4, help="the memory and prefetch experiments' hidden layers")
    parser.add_argument("--rows", type=int, default=512, help="the prefetch experiment's rows per rank")
    parser.add_argument("--strategies", choices=sorted(STRATEGIES), nargs="+", help="the memory experiment's (default: all)")
    return parser.parse_args(argv)


def main(info: dph.DistInfo) -> None:
    """Run the chosen experiments on every rank; rank 0 writes <experiment>.json for each."""
    args = parse_args()
    dph.write_experiments(info, EXPERIMENTS, args.experiment, args)


if __name__ == "__main__":
    dph.worker(main)
