"""An emulated network between the ranks: every collective completes when a link of a stated speed would have carried it.

Taught in notebook 04. `torchrun ... -m dp_helpers.tool.link 1gbit,20us train.py ...` runs any script (and
`run_ddp(..., link=...)` and `train --link` run theirs) with each gloo process group replaced by a
`LinkedGroup`: the real gloo collective runs as before, and its Work completes only after the α-β time of its ring
steps on the stated link, counted from the moment every rank had arrived. The group is Python, so every call that
reaches it is delayed: torch.distributed's functions, DDP's bucket all-reduces (its C++ reducer calls the group's
allreduce), FSDP2's all-gathers and reduce-scatters, and the course's from-scratch classes. Under a running
torch.profiler each collective is a range `link: <kind>` from its issue to its end on the link (tool/trace.py).

What it models: one serial link per process group (collectives cross it one after another, in issue order, while
the CPU computes); the ring's latency steps and bytes. What it does not: contention between groups or with other
jobs, topology (every pair of ranks is one hop), congestion, a GPU's copy engines; the real loopback time of gloo's
own collective comes on top (small next to the emulated time on a 1-10 Gbit/s link; measured in notebook 09).
Needs torch >= 2.7: before it (pytorch#146376) C++ dropped the Python side of a Work a Python group returned, and
DDP's constructor hung waiting on it. Refused: any backend but gloo (a real network is measured, never emulated on top), calls made from C++ that a
Python process group cannot intercept (functional collectives under torch.compile and DTensor redistributes),
which then raise rather than run undelayed.
"""

from __future__ import annotations

import os
import queue
import re
import runpy
import sys
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from dp_helpers.scratch.collectives import ring

MIN_TORCH = (2, 7)  # a Python group's Work survives in C++ (PyWorkHolder) from torch 2.7 on
BACKEND = "gloo_link"  # the name under which the wrapped gloo is registered
PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
BANDWIDTH = re.compile(r"([\d.]+(?:e-?\d+)?)\s*([kKmMgGtT]?)(bit|Bit|bps|b|B)(?:/s)?")  # b, bit, bps: bits; B: bytes
SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


@dataclass(frozen=True)
class Link:
    """A link's speed: bandwidth in bytes per second, latency (α) in seconds per step."""

    bandwidth: float
    latency: float

    def __str__(self) -> str:
        """'1 Gbit/s, 20 µs'."""
        return f"{self.bandwidth * 8 / 1e9:g} Gbit/s, {self.latency * 1e6:g} µs"


def parse_link(text: str) -> Link:
    """'1gbit,20us' (or '100Gbit/s, 10 µs', '12.5GB/s,5us') as a Link; ValueError naming the form otherwise."""
    form = "a link is BANDWIDTH[,LATENCY], for example 1gbit,20us or 100Gbit/s,10us or 12.5GB/s,5us"
    parts = [p.strip() for p in text.split(",")]
    found = BANDWIDTH.fullmatch(parts[0]) if len(parts) <= 2 else None
    if not found:
        raise ValueError(f"{form}; got {text!r}")
    number, prefix, unit = found.groups()
    bandwidth = float(number) * PREFIX[prefix.lower()] / (1 if unit == "B" else 8)
    if bandwidth <= 0:
        raise ValueError(f"a link's bandwidth must be positive; got {text!r}")
    return Link(bandwidth, parse_seconds(parts[1], form, text) if len(parts) == 2 else 0.0)


def parse_seconds(text: str, form: str, whole: str) -> float:
    """'20us', '0.5ms', '20 µs' as seconds."""
    found = re.fullmatch(r"([\d.]+(?:e-?\d+)?)\s*(s|ms|us|µs|ns)", text)
    if not found:
        raise ValueError(f"{form}; got {whole!r} (the latency needs a unit: s, ms, us or ns)")
    return float(found.group(1)) * SECONDS[found.group(2)]


def collective_time(kind: str, nbytes: float, world_size: int, link: Link) -> float:
    """Seconds a ring collective of `nbytes` over `world_size` ranks takes on `link` (α-β model, notebook 09)."""
    return ring.collective_time(kind, nbytes, world_size, link.latency, link.bandwidth)


class Wire:
    """One serial link: collectives cross it in the order they were issued, each for its modelled time."""

    def __init__(self):
        self.queue: queue.Queue = queue.Queue()
        self.carried: list[Transfer] = []
        threading.Thread(target=self.carry, daemon=True, name="emulated-link").start()

    def send(self, kind: str, nbytes: int, seconds: float, work, value) -> torch.futures.Future:
        """A future that completes `seconds` after `work` did and every earlier transfer was carried."""
        done: torch.futures.Future = torch.futures.Future()
        self.queue.put((Transfer(kind, nbytes, seconds, issued=time.perf_counter()), work, value, done))
        return traced(f"link: {kind}", done)

    def carry(self) -> None:
        """Thread: wait for gloo's real collective (every rank arrived), then hold the link for the modelled time."""
        while True:
            transfer, work, value, done = self.queue.get()
            try:
                work.wait()
            except Exception as exc:  # a peer died: the error reaches whoever waits
                complete(done.set_exception, exc)
                continue
            transfer.started = time.perf_counter()
            time.sleep(transfer.seconds)
            transfer.finished = time.perf_counter()
            self.carried.append(transfer)
            complete(done.set_result, value)


def complete(finish, value) -> None:
    """Complete a future in a thread of its own: its callbacks run there, and one may wait for a later collective."""
    # PowerSGD's hook chains callbacks that wait on the next all-reduce; run inline here, they would wait for the very
    # thread that must carry it
    threading.Thread(target=finish, args=(value,), daemon=True, name="emulated-link-done").start()


@dataclass
class Transfer:
    """One collective on the link: what, how many bytes, its modelled seconds, and when (perf_counter) it happened."""

    kind: str
    nbytes: int
    seconds: float
    issued: float
    started: float = 0.0  # every rank had arrived and the link was free
    finished: float = 0.0


def traced(name: str, done: torch.futures.Future) -> torch.futures.Future:
    """`done`, drawn in a running torch.profiler trace as a range `name` from now (on this thread) until it completes."""
    if not torch.autograd._profiler_enabled():
        return done
    with torch.profiler.record_function(name) as record:
        return record._call_end_callbacks_on_future(done)  # torch's way to time an async call to its end


class LinkWork(dist.Work):
    """A collective's handle that completes when the link has carried it."""

    def __init__(self, done: torch.futures.Future):
        super().__init__()
        self.done = done

    def wait(self, timeout=None) -> bool:
        """Block until the link has carried the collective (or raise what gloo raised)."""
        self.done.wait()
        return True

    def is_completed(self) -> bool:
        """Whether the link has carried it."""
        return self.done.done()

    def get_future(self) -> torch.futures.Future:
        """The future DDP's reducer waits on: the result tensors, once carried."""
        return self.done


def nbytes(tensors) -> int:
    """Bytes in a tensor or a (nested) list of tensors."""
    if isinstance(tensors, torch.Tensor):
        return tensors.numel() * tensors.element_size()
    return sum(nbytes(t) for t in tensors)


# the group's methods (names across torch 2.6-2.13): (kind, index of the argument whose bytes cross the link,
# index of the argument whose tensors hold the result)
COLLECTIVES = {
    "allreduce": ("all_reduce", 0, 0), "allreduce_coalesced": ("all_reduce", 0, 0),
    "allgather": ("all_gather", 0, 0), "_allgather_base": ("all_gather", 0, 0),
    "all_gather_single": ("all_gather", 0, 0), "allgather_into_tensor_coalesced": ("all_gather", 0, 0),
    "all_gather_single_coalesced": ("all_gather", 0, 0),
    "reduce_scatter": ("reduce_scatter", 1, 0), "_reduce_scatter_base": ("reduce_scatter", 1, 0),
    "reduce_scatter_single": ("reduce_scatter", 1, 0), "reduce_scatter_tensor_coalesced": ("reduce_scatter", 1, 0),
    "reduce_scatter_single_coalesced": ("reduce_scatter", 1, 0),
    "alltoall_base": ("all_to_all", 1, 0), "all_to_all_single": ("all_to_all", 1, 0), "alltoall": ("all_to_all", 1, 0),
    "broadcast": ("broadcast", 0, 0), "reduce": ("all_reduce", 0, 0),
    "gather": ("all_gather", 1, 0), "scatter": ("all_gather", 0, 0),
    "send": ("point_to_point", 0, 0), "recv": ("point_to_point", 0, 0),
}


class LinkedGroup(dist.ProcessGroup):
    """A gloo group whose every collective also takes the time `link` needs to carry it."""

    def __init__(self, inner: dist.ProcessGroup, link: Link):
        super().__init__(inner.rank(), inner.size())
        self.inner, self.link, self.wire = inner, link, Wire()
        # the same gloo as this group's backend: c10d names groups through their backend, and C++ code that calls a
        # collective a Python group cannot override (a functional all-gather) reaches gloo, undelayed
        cpu, gloo = torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO
        self._register_backend(cpu, gloo, inner._get_backend(cpu))

    def getBackendName(self) -> str:
        """The name this wrapped gloo is registered under."""
        return BACKEND

    def through_link(self, kind: str, size: int, work, value) -> LinkWork:
        """gloo's `work`, completed once the link has carried `size` bytes of a `kind` collective."""
        return LinkWork(self.wire.send(kind, size, collective_time(kind, size, self.size(), self.link), work, value))

    def barrier(self, opts=None):
        """gloo's barrier, then 2(W-1) latency steps."""
        return self.through_link("barrier", 0, self.inner.barrier(opts) if opts is not None else self.inner.barrier(), [])


def _delayed(name: str, kind: str, sent: int, result: int):
    """LinkedGroup.<name>: gloo's own call, completed later by the link's time for its bytes."""

    def method(self, *args):
        """gloo's own call; its Work completes once the link has carried its bytes."""
        work, size = getattr(self.inner, name)(*args), nbytes(args[sent])
        value = args[result] if isinstance(args[result], list) else [args[result]]
        return self.through_link(kind, size, work, value)

    method.__name__ = method.__qualname__ = name
    return method


for _name, (_kind, _sent, _result) in COLLECTIVES.items():
    setattr(LinkedGroup, _name, _delayed(_name, _kind, _sent, _result))


def gloo_group(store, rank: int, world_size: int, timeout) -> dist.ProcessGroup:
    """A plain ProcessGroup with gloo as its CPU backend (what init_process_group('gloo') builds)."""
    backend = dist.ProcessGroupGloo(store, rank, world_size, timeout)
    group = dist.ProcessGroup(store, rank, world_size)
    group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
    return group


def torch_too_old(version: str = torch.__version__) -> str | None:
    """Why this torch cannot run an emulated link, or None."""
    if tuple(int(part) for part in re.findall(r"\d+", version)[:2]) < MIN_TORCH:
        return (f"an emulated link needs torch >= {'.'.join(map(str, MIN_TORCH))} (this is {version}): older releases "
                "lose a Python process group's work objects in C++, and DDP hangs")
    return None


def install(link: Link) -> None:
    """From now on, init_process_group and new_group in this process build gloo groups behind `link`."""
    if reason := torch_too_old():
        raise RuntimeError(reason)

    def create(store, rank, world_size, timeout):
        """c10d's constructor for the backend: gloo behind the link."""
        return LinkedGroup(gloo_group(store, rank, world_size, timeout), link)

    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, create, devices=["cpu"])
    init, new = dist.init_process_group, dist.new_group

    def init_process_group(backend=None, *args, **kwargs):
        """torch's, with gloo replaced by gloo behind the link."""
        return init(linked(backend), *args, **kwargs)

    def new_group(ranks=None, timeout=None, backend=None, *args, **kwargs):
        """torch's, with gloo replaced by gloo behind the link (the default group's backend when none is named)."""
        return new(ranks, timeout, linked(backend) if backend is not None else None, *args, **kwargs)

    for module in (dist, c10d):  # `from torch.distributed import init_process_group` in the script sees ours too
        module.init_process_group, module.new_group = init_process_group, new_group


def linked(backend):
    """The backend name to ask for: ours in place of gloo; anything else refused."""
    if backend in (None, "gloo", "cpu:gloo", BACKEND):
        return BACKEND
    raise ValueError(f"an emulated link wraps gloo on CPU; this script asks for backend {backend!r} (on GPUs, "
                     "measure the real link instead)")


def transfers(group=None) -> list[Transfer]:
    """What the link of `group` (default: the whole world) has carried so far, in order."""
    group = group or c10d._get_default_group()
    if not isinstance(group, LinkedGroup):
        raise ValueError("this process group has no emulated link: start the script with "
                         "`torchrun ... -m dp_helpers.tool.link LINK script.py` or run_ddp(..., link=LINK)")
    return list(group.wire.carried)


USAGE = ("usage: torchrun [torchrun flags] -m dp_helpers.tool.link LINK (script.py | -m module) [args]\n"
         "  LINK: BANDWIDTH[,LATENCY], for example 1gbit,20us or 100Gbit/s,10us")


def main(argv: list[str] | None = None) -> None:
    """`python -m dp_helpers.tool.link LINK script.py [args]` (under torchrun): run the script behind the link."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or argv[0] in ("-h", "--help") or argv[1] == "-m" and len(argv) < 3:
        raise SystemExit(USAGE)
    try:
        install(parse_link(argv[0]))
    except (ValueError, RuntimeError) as exc:
        raise SystemExit(str(exc)) from None
    os.environ["DP_LINK"] = argv[0]  # the script (and its records) can say which link it ran behind
    if argv[1] == "-m":
        sys.argv = [argv[2], *argv[3:]]
        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv[1:]
        sys.path[0] = os.path.dirname(os.path.abspath(argv[1]))  # as `python script.py` would have it
        runpy.run_path(argv[1], run_name="__main__")


if __name__ == "__main__":
    # run as `-m`, this file is `__main__`, a second copy of the module: the script's `transfers` must see the groups
    # the importable copy builds
    from dp_helpers.tool import link as importable

    importable.main()
