"""PowerSGD from scratch as a DDP communication hook: `ddp.register_comm_hook(PowerSGD(rank=2), PowerSGD.hook)`.

Each gradient matrix M (n x m, a tensor viewed as shape[0] rows) is sent as two thin factors: P = M Q (n x r) is
all-reduced and orthogonalised, Q = M^T P (m x r) is all-reduced, and M is replaced by P Q^T / world_size: (n + m) r
values on the wire instead of n m. What the rank-r picture misses is kept on the rank (error feedback) and added to
the next step's gradient; Q is carried over from the last step (warm start). Vectors and matrices that would not
shrink by `min_compression_rate` are all-reduced as they are. The same algorithm, choices, random draws and matrix
kernel as torch's `powerSGD_hook` with a `PowerSGDState` of the same arguments, in plain steps: bit for bit torch's
result at ranks 1 and 2 (above them torch orthogonalises by QR), at any world size (tests/test_compression.py).
Asynchronous where it can be: the first steps' all-reduce and each bucket's last (of Q) run while the backward goes
on, their Future completed by a callback that only computes. The all-reduces of the whole tensors and of P wait in
the hook: torch's hook chains all three in callbacks that start the next all-reduce, which on gloo run on the
group's threads in the order the exchanges finish, so with several buckets the ranks can start them in different
orders (a collective mismatch, seen in the tests) or stall; ours starts every all-reduce in the hook, in bucket
order, the same on every rank. Supports: any DDP model, buckets of any size, fp32 gradients. Refuses:
start_iter < 2 with error feedback or warm start. Notebook 10 teaches it.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist


def orthogonalize(columns: torch.Tensor, epsilon: float = 0) -> None:
    """Gram-Schmidt in place on an (n x r) matrix: its columns made orthonormal, one after the other."""
    for i in range(columns.shape[1]):
        col = columns[:, i:i + 1]
        col /= torch.norm(col) + epsilon  # an all-zero column (an unused parameter) needs epsilon > 0, or it is NaN
        rest = columns[:, i + 1:]
        rest -= (col * rest).sum(0, keepdim=True) * col


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b through torch.bmm, the kernel torch's hook uses: the same rounding, so the same result bit for bit."""
    return torch.bmm(a[None], b[None])[0]


def worth_compressing(n: int, m: int, rank: int, min_compression_rate: float) -> bool:
    """Whether (n + m) r values undercut the n m of the matrix by at least min_compression_rate."""
    return (n + m) * rank * min_compression_rate < n * m


class PowerSGD:
    """The hook's state (as torch's PowerSGDState) and the hook: rank-r compression of each bucket after start_iter steps."""

    def __init__(self, rank: int = 1, start_iter: int = 2, min_compression_rate: float = 2, error_feedback: bool = True,
                 warm_start: bool = True, seed: int = 0, epsilon: float = 0):
        if start_iter < 2 and (error_feedback or warm_start):  # DDP rebuilds its buckets after the first step
            raise ValueError("PowerSGD with error feedback or warm start needs start_iter >= 2.")
        self.rank, self.start_iter, self.min_rate = rank, start_iter, min_compression_rate
        self.error_feedback, self.warm_start, self.iter, self.epsilon = error_feedback, warm_start, 0, epsilon
        self.rng = np.random.RandomState(seed)  # a seed for each random start of Q, the same on every rank (as torch's)
        self.errors, self.qs = {}, {}  # per bucket: the error kept back, the last step's Q factors
        self.sent, self.calls = 0, 0  # values handed to all-reduce so far on this rank, and the all-reduces
        self.compressed = 0  # matrices sent as two factors so far (0: every gradient went whole)

    def hook(self, bucket):  # no annotations: DDP compares them with the classes themselves
        """The communication hook: DDP hands it each GradBucket; it returns a Future of their average."""
        buffer, k = bucket.buffer(), bucket.index()
        if self.iter < self.start_iter:  # the first steps as DDP's default hook: divided, then summed
            buffer.div_(dist.get_world_size())
            done = self.all_reduce(buffer).then(lambda fut: buffer)
        else:
            done = self.compress(buffer, k, [g.view(g.shape[0], -1) for g in bucket.gradients()])
        self.iter += bucket.is_last()  # one step: DDP hands over its last bucket once the others are done
        return done  # DDP waits for every bucket's Future at the end of the backward: meanwhile the backward goes on

    def all_reduce(self, flat: torch.Tensor) -> torch.futures.Future:
        """Start summing a flat tensor over ranks, in place; count it; a Future of the tensor (at once if empty)."""
        if flat.numel() == 0:
            done = torch.futures.Future()
            done.set_result([flat])
            return done
        self.sent, self.calls = self.sent + flat.numel(), self.calls + 1
        return dist.all_reduce(flat, async_op=True).get_future()

    def compress(self, buffer: torch.Tensor, k: int, matrices: list[torch.Tensor]) -> torch.futures.Future:
        """Replace this bucket's gradients by the rank-r picture of their average; the last exchange ends in the Future."""
        if self.error_feedback:
            buffer += self.errors.get(k, 0)
        before = buffer.clone() if self.error_feedback else None
        big = [m for m in matrices if worth_compressing(*m.shape, min(*m.shape, self.rank), self.min_rate)]
        small = [m for m in matrices if all(m is not b for b in big)]
        shapes = [m.shape for m in big]
        big.sort(key=lambda m: shapes.index(m.shape))  # torch draws the random Qs shape by shape
        qs = self.factors_q(k, big)
        self.compressed += len(big)
        small_flat = packed(small, buffer)
        self.all_reduce(small_flat).wait()  # the tensors sent whole: summed, then divided, in torch's order
        for m, mean in zip(small, unpacked(small_flat.div_(dist.get_world_size()), [m.shape for m in small]), strict=True):
            m.copy_(mean)
        p_flat = packed([mm(m, q) for m, q in zip(big, qs, strict=True)], buffer)
        ps = unpacked(p_flat, [(m.shape[0], q.shape[1]) for m, q in zip(big, qs, strict=True)])
        self.all_reduce(p_flat).wait()  # P = the sum over ranks of M Q; its scale does not matter once orthogonalised
        for p in ps:
            orthogonalize(p, self.epsilon)
        q_flat = packed([mm(m.T, p) for m, p in zip(big, ps, strict=True)], buffer)
        qs = unpacked(q_flat, [q.shape for q in qs])
        return self.all_reduce(q_flat).then(lambda fut: self.decompress(buffer, k, big, ps, qs, before))

    def decompress(self, buffer: torch.Tensor, k: int, big: list, ps: list, qs: list, before) -> torch.Tensor:
        """Once Q's sum is in: M = P Q^T, Q the mean of M^T P (kept for the warm start, as torch keeps it)."""
        for m, p, q in zip(big, ps, qs, strict=True):
            q /= dist.get_world_size()
            m.copy_(mm(p, q.T))
        self.qs[k] = qs if self.warm_start else None
        if self.error_feedback:
            self.errors[k] = before - buffer
        return buffer

    def factors_q(self, k: int, big: list[torch.Tensor]) -> list[torch.Tensor]:
        """This step's Q for each matrix: last step's, orthogonalised again (warm start), or random orthonormal ones."""
        if self.qs.get(k) is not None:
            for q in self.qs[k]:
                orthogonalize(q, self.epsilon)
            return self.qs[k]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.rng.randint(1_000_000_000))
            qs = [torch.randn(m.shape[1], min(*m.shape, self.rank), dtype=m.dtype).to(m.device) for m in big]
        for q in qs:
            orthogonalize(q, self.epsilon)
        return qs


def packed(tensors: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """The tensors' values in one new flat tensor (empty, of like's dtype and device, for no tensors)."""
    return torch.cat([t.reshape(-1) for t in tensors]) if tensors else like.new_empty(0)


def unpacked(flat: torch.Tensor, shapes: list) -> list[torch.Tensor]:
    """Views of a flat tensor, one per shape, in order."""
    sizes = [torch.Size(shape).numel() for shape in shapes]
    return [part.view(shape) for part, shape in zip(flat.split(sizes), shapes, strict=True)]


def powersgd_values(shapes: list[torch.Size], rank: int, min_compression_rate: float = 2) -> int:
    """Values a step all-reduces under PowerSGD for gradients of these shapes: (n + m) r per matrix, the rest whole."""
    total = 0
    for shape in shapes:
        n, m = shape[0], torch.Size(shape).numel() // shape[0]
        r = min(n, m, rank)
        total += (n + m) * r if worth_compressing(n, m, r, min_compression_rate) else n * m
    return total
