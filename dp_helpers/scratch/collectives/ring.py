"""A ring all-reduce built from point-to-point sends, and the naive ring it improves on (taught in notebook 03).

The bandwidth-optimal ring cuts the tensor into world_size chunks. In W-1 reduce-scatter steps each
rank sends one chunk to its right neighbour and adds the chunk arriving from its left, until rank r
owns the full sum of chunk (r+1) % W; in W-1 all-gather steps the finished chunks travel once more
around the ring. Each rank sends 2(W-1)/W of the tensor, whatever W is, where the naive ring, which
forwards whole tensors, sends W-1 times the tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


def tensor_split_sizes(rows: int, n_devices: int) -> list[int]:
    """Rows per device under torch.tensor_split: always n pieces, sizes differing by at most one."""
    return [len(c) for c in torch.arange(rows).tensor_split(n_devices)]


@dataclass(frozen=True)
class RingStep:
    """One step of the schedule: in `phase`, at `step`, `rank` sends chunk `send` and receives chunk `recv`."""

    phase: str
    step: int
    rank: int
    send: int
    recv: int


def ring_schedule(world_size: int) -> list[RingStep]:
    """Every send of the bandwidth-optimal ring, in order: W-1 reduce-scatter steps, then W-1 all-gather steps."""
    steps = []
    for s in range(world_size - 1):
        steps += [RingStep("reduce-scatter", s, r, (r - s) % world_size, (r - s - 1) % world_size)
                  for r in range(world_size)]
    for s in range(world_size - 1):
        steps += [RingStep("all-gather", s, r, (r + 1 - s) % world_size, (r - s) % world_size)
                  for r in range(world_size)]
    return steps


def ring_buffers(world_size: int) -> list[list[list[frozenset]]]:
    """Each rank's buffer after every step of the ring (ring_schedule's sends): whose values each chunk sums."""
    state = [[frozenset([r]) for _ in range(world_size)] for r in range(world_size)]
    states, schedule = [state], ring_schedule(world_size)
    for phase in ("reduce-scatter", "all-gather"):
        for step in range(world_size - 1):
            new = [row[:] for row in state]
            for st in (s for s in schedule if (s.phase, s.step) == (phase, step)):  # every rank sends at once
                right = (st.rank + 1) % world_size
                new[right][st.send] = state[right][st.send] | state[st.rank][st.send] if phase == "reduce-scatter" \
                    else state[st.rank][st.send]
            state = new
            states.append(state)
    return states


def ring_bytes(numel: int, element_size: int, world_size: int, rank: int) -> int:
    """Bytes `rank` sends in the ring: 2(W-1)/W of the tensor when the chunks are equal."""
    sizes = tensor_split_sizes(numel, world_size)  # the ring's chunks: sizes differ by at most one
    return sum(sizes[st.send] for st in ring_schedule(world_size) if st.rank == rank) * element_size


def naive_ring_bytes(numel: int, element_size: int, world_size: int) -> int:
    """Bytes each rank sends when whole tensors go around the ring: (W-1) times the tensor."""
    return (world_size - 1) * numel * element_size


def _neighbours(group) -> tuple[int, int, int, int]:
    """(rank, world size, global rank of the right neighbour, of the left neighbour) in `group`."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    right, left = (rank + 1) % world, (rank - 1) % world
    if group is not None:
        right, left = dist.get_global_rank(group, right), dist.get_global_rank(group, left)
    return rank, world, right, left


def _exchange(send: torch.Tensor, recv: torch.Tensor, right: int, left: int, group) -> int:
    """Receive from the left while sending to the right (no deadlock); returns the bytes sent."""
    # both ends of a link compute the same chunk sizes, so an empty chunk is skipped on both sides;
    # posting the receive first lets the incoming data land straight in `recv`
    incoming = dist.irecv(recv, left, group=group) if recv.numel() else None
    outgoing = dist.isend(send, right, group=group) if send.numel() else None
    for request in (incoming, outgoing):
        if request is not None:
            request.wait()
    return send.numel() * send.element_size()


def ring_all_reduce(tensor: torch.Tensor, group=None) -> int:
    """Sum `tensor` over all ranks in place, like dist.all_reduce, with the bandwidth-optimal ring; returns bytes sent."""
    rank, world, right, left = _neighbours(group)
    if world == 1:
        return 0
    # work in the tensor's own memory when it is contiguous, else on a copy written back at the end
    flat = tensor.detach().view(-1) if tensor.is_contiguous() else tensor.detach().reshape(-1).clone()
    chunks, sent = list(flat.tensor_split(world)), 0
    scratch = torch.empty(max(len(c) for c in chunks), dtype=flat.dtype, device=flat.device)
    for st in (s for s in ring_schedule(world) if s.rank == rank):
        if st.phase == "reduce-scatter":  # receive into scratch, then add
            incoming = scratch[:len(chunks[st.recv])]
            sent += _exchange(chunks[st.send], incoming, right, left, group)
            chunks[st.recv].add_(incoming)
        else:  # the finished chunk arrives straight where it belongs
            sent += _exchange(chunks[st.send], chunks[st.recv], right, left, group)
    if not tensor.is_contiguous():
        with torch.no_grad():
            tensor.copy_(flat.view_as(tensor))
    return sent


def naive_ring_all_reduce(tensor: torch.Tensor, group=None) -> int:
    """Sum over all ranks in place by forwarding whole tensors W-1 times around the ring; returns bytes sent."""
    _, world, right, left = _neighbours(group)
    passing, total, sent = tensor.detach().clone(), tensor.detach().clone(), 0
    for _ in range(world - 1):
        incoming = torch.empty_like(passing)
        sent += _exchange(passing, incoming, right, left, group)
        total += incoming
        passing = incoming
    with torch.no_grad():
        tensor.copy_(total)
    return sent


def average_gradients(model: torch.nn.Module, group=None) -> None:
    """Data parallelism by hand: after backward, sum each gradient over the ranks and divide by the world size."""
    world = dist.get_world_size(group)
    for p in model.parameters():
        if p.requires_grad:  # every rank all-reduces every trained parameter, in the same order
            if p.grad is None:  # unused on this rank: zeros, or the ranks' all-reduces would pair other tensors
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, group=group)
            p.grad /= world


def assert_identical_across_ranks(tensors, what: str = "gradients", group=None) -> None:
    """Raise on every rank unless all ranks hold bitwise-identical tensors (an all-reduce of max and one of min)."""
    flat = torch.cat([t.detach().reshape(-1).double() for t in tensors])  # float32 -> float64 is exact
    high, low = flat.clone(), flat.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX, group=group)
    dist.all_reduce(low, op=dist.ReduceOp.MIN, group=group)
    if not torch.equal(high, low):
        gap = (high - low).abs().max().item()
        raise AssertionError(f"{what} differ across ranks (largest gap {gap:.3g}).")


class GlobalBatchNorm1d(torch.nn.BatchNorm1d):
    """BatchNorm1d whose training statistics come from the whole global batch, by differentiable all-reduces."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise (N, C) or (N, C, L) with the global batch's per-channel mean and biased variance, as SyncBatchNorm."""
        if not (self.training and dist.is_available() and dist.is_initialized()):
            return super().forward(x)  # evaluation uses the running statistics, as every BatchNorm
        self._check_input_dim(x)
        from torch.distributed.nn.functional import all_reduce  # noqa: I001 (its backward all-reduces the gradients too)

        dims, shape, xf = [0, *range(2, x.dim())], [1, -1] + [1] * (x.dim() - 2), x.float()  # statistics in fp32
        count = all_reduce(torch.tensor([float(x.numel() // x.shape[1])], device=x.device))
        mean = all_reduce(xf.sum(dims)) / count  # N * L values per channel on every rank together
        var = all_reduce(((xf - mean.view(shape)) ** 2).sum(dims)) / count  # two passes, as BatchNorm, for accuracy
        if self.track_running_stats:
            self.update_running_stats(mean, var, count)
        y = ((xf - mean.view(shape)) / torch.sqrt(var.view(shape) + self.eps)).to(x.dtype)
        return y * self.weight.view(shape) + self.bias.view(shape) if self.affine else y

    @torch.no_grad()
    def update_running_stats(self, mean: torch.Tensor, var: torch.Tensor, count: torch.Tensor) -> None:
        """As BatchNorm: a moving average (cumulative with momentum=None) of the mean and the unbiased variance."""
        self.num_batches_tracked += 1
        m = 1 / self.num_batches_tracked.item() if self.momentum is None else self.momentum
        self.running_mean.mul_(1 - m).add_(m * mean)
        self.running_var.mul_(1 - m).add_(m * var * count / (count - 1))

    @classmethod
    def convert(cls, module: torch.nn.Module) -> torch.nn.Module:
        """Every BatchNorm1d in `module` (itself included) as a GlobalBatchNorm1d sharing its parameters and buffers."""
        if isinstance(module, torch.nn.BatchNorm1d) and not isinstance(module, cls):
            new = cls(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats)
            if module.affine:  # the same Parameter objects: an optimizer built already still trains them
                new.weight, new.bias = module.weight, module.bias
            for name, buffer in module.named_buffers(recurse=False):
                setattr(new, name, buffer)
            return new.train(module.training)
        for name, child in module.named_children():
            setattr(module, name, cls.convert(child))
        return module


def ring_time(nbytes: float, world_size: int, alpha: float, beta: float) -> float:
    """The alpha-beta model of a ring all-reduce: 2(N-1) steps of latency alpha, 2(N-1)/N of the bytes at beta bytes/s."""
    return 2 * (world_size - 1) * alpha + 2 * (world_size - 1) / world_size * nbytes / beta


# (latency steps, share of the bytes each rank sends) of a ring over W ranks, n being the collective's whole size
RING_STEPS = {
    "all_reduce": lambda w: (2 * (w - 1), 2 * (w - 1) / w),  # a reduce-scatter, then an all-gather
    "all_gather": lambda w: (w - 1, (w - 1) / w),  # n: the gathered output
    "reduce_scatter": lambda w: (w - 1, (w - 1) / w),  # n: the input before scattering
    "all_to_all": lambda w: (w - 1, (w - 1) / w),
    "broadcast": lambda w: (w - 1, 1.0),  # pipelined along the ring: every byte leaves the root once
    "barrier": lambda w: (2 * (w - 1), 0.0),
    "point_to_point": lambda w: (1, 1.0),
}


def collective_time(kind: str, nbytes: float, world_size: int, alpha: float, beta: float) -> float:
    """Seconds a ring `kind` of `nbytes` over `world_size` ranks takes: latency alpha per step, beta bytes/s."""
    if world_size == 1:
        return 0.0
    steps, share = RING_STEPS[kind](world_size)
    return steps * alpha + share * nbytes / beta
