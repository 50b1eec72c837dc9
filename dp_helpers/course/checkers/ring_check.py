"""ring_all_reduce and the naive ring against dist.all_reduce, over awkward shapes; rank 0 writes ring.json (notebook 03)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from dp_helpers.scratch.collectives.ring import naive_ring_all_reduce, ring_all_reduce
from dp_helpers.tool import dist as dph


def shapes(world_size: int) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """Lengths shorter than, equal to and not divisible by W, several dimensions, float64, and 1 MiB."""
    lengths = sorted({0, 1, max(world_size - 1, 1), world_size, world_size + 1, 1000})
    return [((n,), torch.float32) for n in lengths] + [((7, 13), torch.float32), ((3, 4, 5), torch.float64),
                                                       ((262_144,), torch.float32)]


def check(shape, dtype, info: dph.DistInfo) -> dict:
    """One case: errors of both rings against dist.all_reduce, and the bytes this rank sent."""
    gen = torch.Generator().manual_seed(1000 * info.rank + sum(shape))
    x = torch.randn(shape, generator=gen, dtype=dtype).to(info.device)
    expected, ring, naive = x.clone(), x.clone(), x.clone()
    dist.all_reduce(expected)
    ring_sent, naive_sent = ring_all_reduce(ring), naive_ring_all_reduce(naive)
    err = lambda y: (y - expected).abs().max().item() if y.numel() else 0.0  # noqa: E731
    return {"shape": list(shape), "dtype": str(dtype), "numel": x.numel(), "element_size": x.element_size(),
            "ring_error": err(ring), "naive_error": err(naive), "ring_bytes": ring_sent, "naive_bytes": naive_sent}


def main(info: dph.DistInfo) -> None:
    """Check every case on every rank; rank 0 writes all ranks' results."""
    mine = [check(shape, dtype, info) for shape, dtype in shapes(info.world_size)]
    dph.gather_to_file(info, mine, "ring.json")
    dph.print0(info, f"{len(mine)} cases checked on {info.world_size} ranks")


if __name__ == "__main__":
    dph.worker(main)
