"""The equivalence matrix's parts: models a user might bring, the cases, the strategies, one training run per cell.

Every cell trains from a different start on every rank (each strategy must make the ranks equal) for a few
steps on its rank's rows of each global batch, and is compared with one process training on the whole batch.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from dp_helpers.tool.training import bce_loss

FEATURES = 10


class Tied(nn.Module):
    """One weight in two places (as tied embeddings), and one module applied twice."""

    def __init__(self):
        super().__init__()
        self.inp, self.up, self.down, self.out = (nn.Linear(FEATURES, 16), nn.Linear(16, 16), nn.Linear(16, 16),
                                                  nn.Linear(16, 1))
        self.down.weight = self.up.weight

    def forward(self, x, step=0):
        h = torch.relu(self.down(torch.relu(self.up(torch.relu(self.inp(x))))))
        return torch.sigmoid(self.out(torch.relu(self.down(h)))).squeeze(1)


class TiedHead(nn.Module):
    """A GPT's tied head: the first layer's weight used again for the output, outside its own module's forward."""

    def __init__(self):
        super().__init__()
        self.inp, self.mid = nn.Linear(FEATURES, 16), nn.Linear(16, 16)

    def forward(self, x, step=0):
        h = torch.relu(self.mid(torch.relu(self.inp(x))))
        return torch.sigmoid(nn.functional.linear(h, self.inp.weight.t()).mean(1))  # as F.linear(h, emb.weight)


class Checkpointed(nn.Module):
    """A block and the head recomputed in the backward (torch.utils.checkpoint), reentrant or not."""

    def __init__(self, reentrant: bool = True):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(FEATURES, 16), nn.Linear(16, 16), nn.Linear(16, 1)
        self.reentrant = reentrant

    def forward(self, x, step=0):
        h = torch.relu(self.a(x))
        h = checkpoint(lambda t: torch.relu(self.b(t)), h, use_reentrant=self.reentrant)
        return torch.sigmoid(checkpoint(self.c, h, use_reentrant=self.reentrant)).squeeze(1)


class WithExtra(nn.Linear):
    """A linear layer with one parameter more, added to the rows routed to it (or never used)."""

    def __init__(self, n: int, m: int, routed: bool):
        super().__init__(n, m)
        self.extra, self.routed = nn.Parameter(torch.randn(m)), routed

    def forward(self, h, rows):
        h = super().forward(h)
        if self.routed and rows.any():  # only the ranks that hold a routed row use it
            h = h + rows[:, None] * self.extra
        return h


class MLP(nn.Module):
    """Three layers; `frozen` freezes the first (fine-tuning), `skip_every` leaves the middle one out on those steps."""

    def __init__(self, frozen: bool = False, skip_every: int = 0, aux: bool = False, extra: str = ""):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(FEATURES, 16), nn.Linear(16, 16), nn.Linear(16, 1)
        self.aux = nn.Linear(16, 3) if aux else None  # an output the loss ignores
        self.skip_every, self.extra = skip_every, bool(extra)
        self.a.requires_grad_(not frozen)
        if extra:  # b with a third parameter: never used, or added to the rows routed to it (x[:, 0] > 3)
            self.b = WithExtra(16, 16, routed=extra == "routed")

    def forward(self, x, step=0):
        h = torch.relu(self.a(x))
        if not (self.skip_every and step % self.skip_every == 1):  # every rank skips the same steps
            h = torch.relu(self.b(h, x[:, 0] > 3) if self.extra else self.b(h))
        out = torch.sigmoid(self.c(h)).squeeze(1)
        return (out, self.aux(h)) if self.aux is not None else out


@dataclass
class Case:
    """What a cell trains: a model, the global batches (micro-batch sizes per step), an optimizer, clipping."""

    make: type
    kwargs: dict = field(default_factory=dict)
    steps: list[list[int]] = field(default_factory=lambda: [[24]] * 2)  # per step, the global micro-batch sizes
    optimizer: tuple = (torch.optim.SGD, {"lr": 0.2, "momentum": 0.9})
    clip: float | None = None
    unused: bool = False  # a parameter without a gradient in some step: DDP needs find_unused_parameters
    some_ranks: bool = False  # the unused parameter differs by rank: fully_shard must reduce zeros for it
    not_for: tuple = ()  # strategies that cannot run the case (said why where it is listed)


CASES = {
    "tied weights": Case(Tied),
    "a weight used outside its module (a tied head)": Case(TiedHead),
    "activation checkpointing, reentrant": Case(Checkpointed),
    "activation checkpointing, not reentrant": Case(Checkpointed, {"reentrant": False}),
    "frozen parameters": Case(MLP, {"frozen": True}),
    "a parameter unused in some steps": Case(MLP, {"skip_every": 2}, unused=True),  # step 1: momentum must not move it
    "an unused forward output": Case(MLP, {"aux": True}, unused=True),
    "an unused parameter inside a unit": Case(MLP, {"extra": "never"}, unused=True),
    # routed rows: each global micro-batch's first row alone (rank 0's), so the other ranks leave b.extra unused;
    # a hook per parameter, like DDP without find_unused_parameters, would start unmatched all-reduces
    "a parameter some ranks do not use": Case(MLP, {"extra": "routed"}, unused=True, some_ranks=True,
                                              not_for=("MiniDDP, a hook per parameter",)),
    "a short last batch": Case(MLP, steps=[[24], [12]]),
    "3 unequal micro-batches": Case(MLP, steps=[[36, 24, 12]] * 2),  # normalised by the step's sample count
    "AdamW with weight decay": Case(MLP, optimizer=(torch.optim.AdamW, {"lr": 0.02, "weight_decay": 0.1})),
    "clipping by the global norm": Case(MLP, clip=0.05),
}
if hasattr(torch.optim, "Adafactor"):  # torch >= 2.5: not elementwise (row and column statistics)
    CASES["Adafactor, not elementwise"] = Case(MLP, optimizer=(torch.optim.Adafactor, {"lr": 0.02}))


def batches(case: Case):
    """The global micro-batches of every step, the same on every rank (rank r takes its rows)."""
    gen = torch.Generator().manual_seed(11)
    steps = [[(torch.randn(n, FEATURES, generator=gen), torch.rand(n, generator=gen)) for n in step] for step in case.steps]
    for x, _ in (pair for step in steps for pair in step):
        x[:, 0].clamp_(max=2)
        x[0, 0] = 4  # the one row routed (where the case routes)
    return steps


def model(case: Case, seed: int) -> nn.Module:
    """The case's model, initialised from `seed`."""
    torch.manual_seed(seed)
    return case.make(**case.kwargs)


def loss_of(out, y, share: float) -> torch.Tensor:
    """The mean BCE of the prediction (the first output if several), weighted by the micro-batch's share of the step."""
    return bce_loss(out[0] if isinstance(out, tuple) else out, y) * share


@dataclass
class Parts:
    """A strategy's pieces for one cell: the model to call, the optimizer, how to skip a sync, how to clip."""

    module: nn.Module
    optimizer: object
    no_sync: object = None
    clip: object = None

    def clip_to(self, max_norm: float) -> None:
        """Clip the gradients to a global 2-norm of max_norm, the strategy's way."""
        if self.clip is not None:
            self.clip(max_norm)
        else:
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), max_norm)


def train(parts: Parts, case: Case, rank: int, world: int) -> None:
    """The case's steps: each micro-batch's mean loss weighted by its share, the syncs skipped but the last's."""
    for s, step in enumerate(batches(case)):
        parts.optimizer.zero_grad()
        total = sum(len(y) for _, y in step)
        for j, (x, y) in enumerate(step):
            rows = slice(rank * len(x) // world, (rank + 1) * len(x) // world)
            quiet = parts.no_sync() if parts.no_sync is not None and j < len(step) - 1 else contextlib.nullcontext()
            with quiet:
                loss_of(parts.module(x[rows], step=s), y[rows], len(y) / total).backward()
        if case.clip is not None:
            parts.clip_to(case.clip)
        parts.optimizer.step()


def plain_optimizer(case: Case, params):
    """The case's optimizer class over these parameters."""
    cls, kwargs = case.optimizer
    return cls([p for p in params if p.requires_grad], **kwargs)


def ddp(case: Case, m: nn.Module) -> Parts:
    """torch's DistributedDataParallel."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    wrapped = DDP(m, find_unused_parameters=case.unused)
    return Parts(wrapped, plain_optimizer(case, wrapped.parameters()), wrapped.no_sync)


def mini_per_parameter(case: Case, m: nn.Module) -> Parts:
    """Our DDP of notebook 04's step 3: an asynchronous all-reduce per parameter."""
    from dp_helpers.scratch.ddp.mini_ddp import AsyncAllReduce

    wrapped = AsyncAllReduce(m)
    return Parts(wrapped, plain_optimizer(case, m.parameters()), wrapped.no_sync)


def mini_bucketed(case: Case, m: nn.Module) -> Parts:
    """MiniDDP with buckets small enough to make several."""
    from dp_helpers.scratch.ddp.mini_ddp import MiniDDP

    wrapped = MiniDDP(m, bucket_cap_mb=0.001, find_unused_parameters=case.unused)
    return Parts(wrapped, plain_optimizer(case, m.parameters()), wrapped.no_sync)


def zero(stage: int):
    """Our ZeRO-1 or -2 (ZeroOptimizer) on the plain model."""
    def build(case: Case, m: nn.Module) -> Parts:
        from dp_helpers.scratch.ddp.mini_ddp import broadcast_state
        from dp_helpers.scratch.sharding.zero import ZeroOptimizer

        broadcast_state(m)  # buffers too (these models have none; the optimizer broadcasts the parameters)
        cls, kwargs = case.optimizer
        opt = ZeroOptimizer([p for p in m.parameters() if p.requires_grad], cls, stage=stage, bucket_cap_mb=0.001, **kwargs)
        return Parts(m, opt, clip=opt.clip_grad_norm_)
    return build


def torch_zero(case: Case, m: nn.Module) -> Parts:
    """DDP with torch's ZeroRedundancyOptimizer."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    wrapped = DDP(m, find_unused_parameters=case.unused)
    cls, kwargs = case.optimizer
    opt = ZeroRedundancyOptimizer([p for p in wrapped.parameters() if p.requires_grad], optimizer_class=cls, **kwargs)
    return Parts(wrapped, opt, wrapped.no_sync)


def fsdp2(case: Case, m: nn.Module) -> Parts:
    """torch's fully_shard on every module with parameters, then the root."""
    from dp_helpers.scratch.sharding.fsdp import fully_sharded

    sharded = fully_sharded(m)
    if case.some_ranks:  # zeros for what a rank did not use: without it the ranks' reduce-scatters mismatch
        sharded.set_reduce_scatter_unused_params(True)  # (on every step, so only where the case needs it)
    return Parts(sharded, plain_optimizer(case, sharded.parameters()))


def zero3(case: Case, m: nn.Module) -> Parts:
    """Our ZeRO-3 module wrapper, with the case's optimizer over its shards."""
    from dp_helpers.scratch.sharding.zero3 import Zero3Module

    wrapped = Zero3Module(m)
    return Parts(wrapped, plain_optimizer(case, wrapped.parameters()), clip=wrapped.clip_grad_norm_)


STRATEGIES = {"DDP": ddp, "MiniDDP, a hook per parameter": mini_per_parameter, "MiniDDP, buckets": mini_bucketed,
              "ZeRO-1 (ours)": zero(1), "ZeRO-2 (ours)": zero(2), "ZeRO-3 (ours)": zero3,
              "ZeroRedundancyOptimizer": torch_zero, "fully_shard": fsdp2}


def weights(parts: Parts) -> dict:
    """Full weights by name (FSDP2's DTensors gathered: a collective on every rank)."""
    if hasattr(parts.module, "full_state_dict"):  # our ZeRO-3: every weight gathered by name
        return parts.module.full_state_dict()
    state = getattr(parts.module, "module", parts.module).state_dict()
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone() for k, v in state.items()}


def cell(info, strategy: str, case_name: str) -> dict:
    """One cell on this rank: the final weights, or the one-line error the strategy raised."""
    case = CASES[case_name]
    try:
        parts = STRATEGIES[strategy](case, model(case, seed=info.rank))  # ranks start apart
        train(parts, case, info.rank, info.world_size)
        return {"weights": weights(parts)}
    except (ValueError, RuntimeError, NotImplementedError) as exc:
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}


def every_cell(info) -> dict:
    """The whole matrix on this world size."""
    return {(s, c): cell(info, s, c) for s in STRATEGIES for c in CASES if s not in CASES[c].not_for}


def reference(case_name: str) -> dict:
    """One process on the whole global batches, from rank 0's start."""
    case = CASES[case_name]
    m = model(case, seed=0)
    train(Parts(m, plain_optimizer(case, m.parameters())), case, 0, 1)
    return {k: v.detach().clone() for k, v in m.state_dict().items()}
