"""Each collective on gloo, every rank's tensor before and after; rank 0 writes collectives.json (taught in notebook 03)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from dp_helpers.tool import dist as dph


def start(info: dph.DistInfo) -> torch.Tensor:
    """Rank r starts from [10r, 10r+1, ..., 10r+W-1]: every rank's tensor is easy to tell apart."""
    return torch.arange(info.world_size, dtype=torch.float32, device=info.device) + 10 * info.rank


def demos(info: dph.DistInfo) -> dict[str, tuple[list, list]]:
    """Run broadcast, all_reduce (sum and average), all_gather and reduce_scatter; (before, after) per name."""
    out, w = {}, info.world_size
    t = start(info)
    dist.broadcast(t, src=0)
    out["broadcast from rank 0"] = t
    t = start(info)
    dist.all_reduce(t)
    out["all_reduce (sum)"] = t
    out["all_reduce, then / world_size (average)"] = t / w
    gathered = [torch.empty_like(t) for _ in range(w)]
    dist.all_gather(gathered, start(info))
    out["all_gather"] = torch.cat(gathered)
    t = torch.empty(1, device=info.device)
    dist.reduce_scatter(t, list(start(info).split(1)))
    out["reduce_scatter (sum)"] = t
    before = start(info).tolist()
    return {name: (before, after.tolist()) for name, after in out.items()}


def main(info: dph.DistInfo) -> None:
    """Every rank runs every collective and prints its lines; rank 0 writes the gathered table."""
    mine = demos(info)
    for name, (before, after) in mine.items():
        print(f"{name:<42} before {before}  after {after}", flush=True)
    dph.gather_to_file(info, mine, "collectives.json")


if __name__ == "__main__":
    dph.worker(main)
