"""What this machine has and can do, as facts: cores, GPUs, NCCL, the launch `train` picks by default (notebook 01).

Whether a request fits them is checked in request.py; this module only reads the machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from dp_helpers.tool.i18n import tr, tr_later

BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class EnvReport:
    """A snapshot of the runtime: cores, GPUs, notebook host and the launch choice with its reason."""

    python: str
    torch: str
    cpu_cores: int
    gpu_count: int
    gpu_names: tuple[str, ...]
    platform: str
    cuda_initialized: bool
    nccl_available: bool
    backend: str
    world_size: int
    reason: str

    def as_dict(self) -> dict:
        """The report as a plain dict (for JSON)."""
        return asdict(self)


def cpu_cores() -> int:
    """CPU cores this process may run on (the affinity mask, not the machine's total)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def worker_threads() -> int:
    """Intra-op threads of every launched CPU worker: OMP_NUM_THREADS when set, else one (taught in notebook 03)."""
    value = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()  # OpenMP allows "4,2": the outer level
    return int(value) if value.isdigit() and int(value) > 0 else 1


@contextmanager
def worker_numerics():
    """Compute this block with the workers' thread count, so a reference in this process sums as a rank does."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(worker_threads())
    try:
        yield
    finally:
        torch.set_num_threads(before)


def gpu_count() -> int:
    """Number of visible CUDA GPUs; 0 on CPU builds (does not initialise CUDA)."""
    if "torch" not in sys.modules and not (shutil.which("nvidia-smi") or os.path.exists("/dev/nvidiactl")):
        return 0  # no NVIDIA driver: answer without importing torch, so the CLI starts fast
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpu_names(count: int) -> tuple[str, ...]:
    """GPU names from nvidia-smi, so asking never initialises CUDA in this process."""
    if count == 0:
        return ()
    smi = shutil.which("nvidia-smi")
    if smi:
        out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        names = tuple(line.strip() for line in out.stdout.splitlines() if line.strip())
        if names:
            return names[:count]
    return tuple("unknown GPU" for _ in range(count))


def detect_platform() -> str:
    """'colab', 'kaggle' or 'local', from the environment the notebook host sets."""
    if "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ:
        return "colab"
    if any(key.startswith("KAGGLE_KERNEL") for key in os.environ):
        return "kaggle"
    return "local"


def nccl_available() -> bool:
    """Whether this torch build ships the NCCL backend (False without GPUs, where it cannot run anyway)."""
    if gpu_count() == 0:
        return False
    import torch.distributed as dist

    return dist.is_available() and dist.is_nccl_available()


# why `train` launches what it launches, as English templates that a notebook shows in its own language
REASONS = {"nccl": tr_later("{n} GPUs and NCCL: one process per GPU on nccl"),
           "one gpu": tr_later("1 GPU: real DDP needs >= 2 GPUs, so 2 CPU processes on gloo"),
           "no nccl": tr_later("GPUs found but this torch has no NCCL, so 2 CPU processes on gloo"),
           "no gpu": tr_later("no GPU: 2 CPU processes on gloo")}


def launch_reason(n_gpus: int, has_nccl: bool) -> str:
    """Which of REASONS explains the launch `train` picks by default."""
    if n_gpus >= 2 and has_nccl:
        return "nccl"
    return "one gpu" if n_gpus == 1 else "no nccl" if n_gpus >= 2 else "no gpu"


def choose_launch(n_gpus: int, has_nccl: bool) -> tuple[str, int, str]:
    """The backend and world size `train` uses by default, and why."""
    reason = REASONS[launch_reason(n_gpus, has_nccl)].format(n=n_gpus)
    return ("nccl", n_gpus, reason) if n_gpus >= 2 and has_nccl else ("gloo", 2, reason)


def gpu_device(index: int):
    """The GPU with this index (the one place the device type is named; everything else asks here)."""
    import torch

    return torch.device("cuda", index)


def gpu_devices() -> list:
    """Every visible CUDA GPU, as nn.DataParallel would use them (empty on a CPU machine)."""
    return [gpu_device(i) for i in range(gpu_count())]


def device_for(backend: str, local_rank: int):
    """The device a rank computes on: its own GPU under nccl, the CPU under gloo."""
    import torch

    return gpu_device(local_rank) if backend == "nccl" else torch.device("cpu")


@dataclass(frozen=True)
class Machine:
    """What the checks of a request need to know of this machine, read once."""

    cores: int
    gpus: int
    nccl: bool
    backend: str  # what `train` picks by default, and with how many processes
    world_size: int


def machine() -> Machine:
    """This machine's cores, GPUs and NCCL, and the launch `train` picks on it by default."""
    gpus, nccl = gpu_count(), nccl_available()
    backend, world_size, _ = choose_launch(gpus, nccl)
    return Machine(cpu_cores(), gpus, nccl, backend, world_size)


def report() -> EnvReport:
    """Collect the environment report that `python -m dp_helpers doctor` prints."""
    import torch

    n_gpus = gpu_count()
    has_nccl = nccl_available()
    backend, world_size, reason = choose_launch(n_gpus, has_nccl)
    return EnvReport(python=sys.version.split()[0], torch=torch.__version__, cpu_cores=cpu_cores(),
                     gpu_count=n_gpus, gpu_names=gpu_names(n_gpus), platform=detect_platform(),
                     cuda_initialized=bool(torch.cuda.is_initialized()), nccl_available=has_nccl,
                     backend=backend, world_size=world_size, reason=reason)


def format_report(rep: EnvReport) -> str:
    """The report as aligned text lines, in the language set (a notebook's)."""
    gpus = ", ".join(rep.gpu_names) if rep.gpu_names else tr("none")
    rows = [("python", rep.python), ("torch", rep.torch), (tr("cpu cores"), rep.cpu_cores),
            (tr("gpus"), f"{rep.gpu_count} ({gpus})"), (tr("platform"), rep.platform),
            (tr("cuda initialised here"), yes_no(rep.cuda_initialized)),
            (tr("nccl available"), yes_no(rep.nccl_available)),
            (tr("train would use"), f"backend={rep.backend} world_size={rep.world_size}"),
            (tr("why"), tr(REASONS[launch_reason(rep.gpu_count, rep.nccl_available)], n=rep.gpu_count))]
    width = max(columns(name) for name, _ in rows) + 2
    return "\n".join(f"{name}{' ' * (width - columns(name))}{value}" for name, value in rows)


def yes_no(value: bool) -> str:
    """True or False, as the language set says it."""
    return tr("True") if value else tr("False")


def columns(text: str) -> int:
    """The columns a string takes in a terminal: a Chinese character takes two."""
    import unicodedata

    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)
