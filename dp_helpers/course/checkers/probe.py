"""Run a learner's DDP script on this rank with probes, for the checker of notebook 00's exercise (script_check.py).

    python -m torch.distributed.run --nproc-per-node 2 -m dp_helpers.course.checkers.probe my_ddp.py --batch-size 24 ...

The script runs unchanged, as `__main__`; the probes only write down, one JSON line each in
<run>/probe/rank<r>.jsonl, what it did: every collective it entered and left, the process group (given a
short timeout, so a mismatched collective fails in seconds), the DistributedSampler's settings and the
epoch of each pass over it, whether the model was wrapped in DistributedDataParallel, and what torch.save
wrote where, the DataLoader's batch size, files renamed, optimizer steps and loaded optimizer states; with
DP_PROBE_BUCKETS=1 each bucket DDP all-reduces, with DP_PROBE_FSDP=1 each fully_shard, dcp.save and dcp.load.
Every line is flushed at once, so a rank that dies still leaves its record.
"""

from __future__ import annotations

import functools
import json
import os
import runpy
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader, DistributedSampler

from dp_helpers.tool.dist import exit_without_finalizing, init_then_narrow
from dp_helpers.tool.request import env_seconds

COLLECTIVES = ("all_reduce", "broadcast", "barrier", "all_gather", "all_gather_into_tensor", "all_gather_object",
               "reduce", "reduce_scatter", "reduce_scatter_tensor", "gather", "gather_object", "scatter",
               "scatter_object_list", "broadcast_object_list", "all_to_all", "all_to_all_single", "send", "recv")
GROUP_TIMEOUT_S = 10  # a rank waiting for a collective its peers never make fails after this, whatever the script asks


def group_timeout_s() -> float:
    """The probe's process-group timeout: DP_PROBE_TIMEOUT seconds when set (the tests' hangs), else GROUP_TIMEOUT_S."""
    return env_seconds("DP_PROBE_TIMEOUT", GROUP_TIMEOUT_S)


class Probe:
    """This rank's record file."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = path.open("a", encoding="utf-8")

    def __call__(self, **fields) -> None:
        """Append one record and flush it."""
        self.file.write(json.dumps(fields) + "\n")
        self.file.flush()


def around(owner, name: str, probe: Probe, note=None, event: str | None = None) -> None:
    """Replace owner.name by a version that records entering and leaving it (and note(*args, **kwargs), if given)."""
    original, event = getattr(owner, name), event or name

    @functools.wraps(original)
    def probed(*args, **kwargs):
        """The original, between two records."""
        probe(event=event, phase="start", **(note(*args, **kwargs) if note else {}))
        result = original(*args, **kwargs)
        probe(event=event, phase="done")
        return result

    setattr(owner, name, probed)


def short_timeout(original):
    """init_process_group, with the probe's short timeout instead of the script's."""

    @functools.wraps(original)
    def init(*args, **kwargs):
        """The original, with the probe's timeout for collectives (the start-up waits longer: init_then_narrow)."""
        return init_then_narrow(original, group_timeout_s(), *args, **kwargs)

    return init


def sampler_settings(sampler, *args, **kwargs) -> dict:
    """What a DistributedSampler was built with (read after __init__ has set them)."""
    return {"num_replicas": sampler.num_replicas, "rank": sampler.rank, "shuffle": sampler.shuffle,
            "seed": sampler.seed, "samples": len(sampler.dataset)}


def install(probe: Probe) -> None:
    """Put every probe in place before the script imports anything."""
    dist.init_process_group = short_timeout(dist.init_process_group)
    around(dist, "init_process_group", probe)
    for name in filter(lambda n: hasattr(dist, n), COLLECTIVES):
        around(dist, name, probe)
    around(DistributedDataParallel, "__init__", probe, note=lambda *a, **k: {"what": "ddp"})
    around(torch, "save", probe, note=saved)
    built = DistributedSampler.__init__

    def sampler_init(self, *args, **kwargs):
        """The original __init__, then a record of the settings."""
        built(self, *args, **kwargs)
        probe(event="sampler", **sampler_settings(self))

    DistributedSampler.__init__ = sampler_init
    around(DistributedSampler, "__iter__", probe, note=lambda self: {"epoch": self.epoch})
    around(DataLoader, "__init__", probe, note=loader_settings)
    for name in ("replace", "rename"):  # a checkpoint renamed into place (pathlib's Path.replace calls os.replace)
        around(os, name, probe, note=lambda src, dst, *a, **k: {"src": str(src), "dst": str(dst)})
    around(torch.optim.Optimizer, "load_state_dict", probe)
    register_optimizer_step_post_hook(lambda *args: probe(event="optimizer_step"))
    if os.environ.get("DP_PROBE_BUCKETS"):  # notebook 07's capstone: count DDP's gradient all-reduces
        count_buckets(probe, dist.all_reduce.__wrapped__)
    if os.environ.get("DP_PROBE_FSDP"):  # notebook 08's exercise 5 (imported only there: FSDP and DCP take a second)
        watch_fsdp(probe)


def watch_fsdp(probe: Probe) -> None:
    """Record each fully_shard (the module's class, whether its weights are still on the meta device) and DCP call."""
    import torch.distributed.checkpoint as dcp
    import torch.distributed.fsdp as fsdp

    around(fsdp, "fully_shard", probe, note=sharded)
    for name in ("save", "load"):
        around(dcp, name, probe, note=dcp_call, event=f"dcp.{name}")


def sharded(*args, **kwargs) -> dict:
    """What fully_shard(module, ...) was given: the module's class, and whether its weights are on the meta device."""
    module = args[0] if args else kwargs["module"]
    return {"what": type(module).__name__, "meta": any(p.is_meta for p in module.parameters())}


def dcp_call(*args, **kwargs) -> dict:
    """Where dcp.save or dcp.load(state_dict, checkpoint_id=...) goes, and the state dict's top-level keys."""
    state = args[0] if args else kwargs.get("state_dict", {})
    return {"id": str(kwargs.get("checkpoint_id")), "keys": sorted(map(str, state))}


def count_buckets(probe: Probe, all_reduce) -> None:
    """Give every DDP model a comm hook that records each bucket, then all-reduces it as DDP's default does."""
    built = DistributedDataParallel.__init__

    def hook(state, bucket):
        """torch's allreduce_hook (divide by the world size, sum), one record per bucket."""
        probe(event="bucket", bytes=bucket.buffer().numel() * bucket.buffer().element_size())
        tensor = bucket.buffer().div_(dist.get_world_size())
        return all_reduce(tensor, async_op=True).get_future().then(lambda fut: fut.value()[0])

    def init(self, *args, **kwargs):
        """The original __init__, then the counting hook."""
        built(self, *args, **kwargs)
        self.register_comm_hook(None, hook)

    DistributedDataParallel.__init__ = init


def loader_settings(loader, dataset=None, batch_size=1, *args, **kwargs) -> dict:
    """The batch size a DataLoader was built with."""
    return {"what": "loader", "batch_size": batch_size}


def saved(obj=None, f=None, *args, **kwargs) -> dict:
    """Where torch.save(obj, f) writes, and the keys of a saved dict (a DDP wrapper's start with 'module.')."""
    return {"path": str(f), "keys": [str(k) for k in obj] if isinstance(obj, dict) else None}


@record  # an exception in the script reaches torchrun's error file: the checker names it
def run() -> None:
    """Run sys.argv[1] as __main__ with the rest as its arguments, the probes installed."""
    script, *args = sys.argv[1:]
    probe = Probe(Path(os.environ["DP_RUN_DIR"]) / "probe" / f"rank{os.environ['RANK']}.jsonl")
    install(probe)
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))  # as `python script.py` would
    runpy.run_path(script, run_name="__main__")
    probe(event="end")


if __name__ == "__main__":
    exit_without_finalizing(run)  # the learner's DDP model may outlive its group: see dp_helpers.tool.dist
