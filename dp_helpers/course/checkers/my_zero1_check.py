"""A learner's MyZero1 (notebook 08's exercise) training on every rank, next to one process on the global batch.

    python -m torch.distributed.run --nproc-per-node 2 -m dp_helpers.course.checkers.my_zero1_check --module my_zero1.py

Every rank records which collectives the optimizer called and on how many values, how much momentum it keeps, its
weights after each step and their distance to one process with the global batch (SGD, momentum 0.9, and the
same with the gradient summed, or divided twice, instead of averaged). Rank 0 writes my_zero1.json with every rank's record.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util

import torch
import torch.distributed as dist

from dp_helpers.scripts.from_scratch import batch, global_batch, mlp
from dp_helpers.tool import dist as dph
from dp_helpers.tool.training import bce_loss

COLLECTIVES = ("all_reduce", "reduce_scatter_single", "reduce_scatter_tensor", "all_gather_single",
               "all_gather_into_tensor", "all_gather", "broadcast", "reduce_scatter")
LR, MOMENTUM = 0.5, 0.9


def count_calls(calls: list, names=COLLECTIVES) -> None:
    """Note every call of these torch.distributed functions: its name, the values it was handed, its peer (send/recv)."""
    for name in filter(lambda n: hasattr(dist, n), names):
        original = getattr(dist, name)

        @functools.wraps(original)
        def counted(*args, _name=name, _original=original, **kwargs):
            """The original, after a record."""
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            peer = kwargs.get("dst", kwargs.get("src", args[1] if len(args) > 1 else None))
            calls.append({"name": _name, "values": max((t.numel() for t in tensors), default=0),
                          "peer": peer if "send" in _name or "recv" in _name else None})
            return _original(*args, **kwargs)

        setattr(dist, name, counted)


def load(path: str, module_name: str = "my_zero1", attribute: str = "MyZero1"):
    """The class or function the learner's file defines (imported after the counting is in place)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, attribute)


def alone(lr: float):
    """One process's model and optimizer: the reference."""
    model = mlp(seed=0)
    return model, torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)


def step(model, optimizer, x, y) -> None:
    """One training step."""
    optimizer.zero_grad()
    bce_loss(model(x), y).backward()
    optimizer.step()


def gap(a, b) -> float:
    """The largest difference between two models' parameters."""
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters(), strict=True))


def main(info: dph.DistInfo) -> None:
    """Train with the learner's optimizer and with the references; rank 0 writes every rank's record."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", required=True)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    calls: list[dict] = []
    count_calls(calls)
    model = mlp(seed=0)
    optimizer = load(args.module)(model.parameters(), lr=LR, momentum=MOMENTUM)
    (ref, ref_opt), (summed, summed_opt), (twice, twice_opt) = (alone(LR * f) for f in (1, info.world_size,
                                                                                       1 / info.world_size))
    record = {"numel": sum(p.numel() for p in model.parameters()), "steps": []}
    for s in range(args.steps):
        del calls[:]
        step(model, optimizer, *batch(info, s))
        step(ref, ref_opt, *global_batch(s, info.world_size))
        step(summed, summed_opt, *global_batch(s, info.world_size))
        step(twice, twice_opt, *global_batch(s, info.world_size))
        record["steps"].append({"calls": list(calls), "gap": gap(model, ref), "gap_if_summed": gap(model, summed),
                                "gap_if_divided_twice": gap(model, twice)})
    # the template's state is its velocity; other tensors kept between steps (reused buffers) are not optimizer state
    state = getattr(optimizer, "velocity", None)
    record["state"] = state.numel() if isinstance(state, torch.Tensor) else \
        sum(t.numel() for t in vars(optimizer).values() if isinstance(t, torch.Tensor))
    record["weights"] = [p.detach().flatten().tolist() for p in model.parameters()]
    dph.gather_to_file(info, record, "my_zero1.json")


if __name__ == "__main__":
    dph.worker(main)
