"""`python -m dp_helpers bench`: throughput, speed-up, efficiency and all-reduce bandwidth, side by side in one run (notebook 09).

Every number is measured on this machine in this run. On CPUs each process gets one thread
(OMP_NUM_THREADS=1), so world size N means N cores; on GPUs one process per GPU.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from dp_helpers.tool import env
from dp_helpers.tool.files import write_text_atomic
from dp_helpers.tool.i18n import tr
from dp_helpers.tool.launch import run_ddp
from dp_helpers.tool.launch.process import run_tree
from dp_helpers.tool.request import UsageError, check_int, check_link, resolve_backend
from dp_helpers.tool.runs import prepare_run_dir
from dp_helpers.tool.training import PRECISIONS, precision_problem


@dataclass
class BenchConfig:
    """What to measure; --quick shrinks steps, batch sizes and message sizes to finish in about a minute."""

    world_sizes: list[int]
    batches: list[int] = field(default_factory=lambda: [64, 256, 1024])
    default_batch: int = 1024
    steps: int = 10
    rounds: int = 3
    warmup: int = 2
    dim: int = 512
    hidden: int = 1024
    depth: int = 4
    sizes_mib: list[float] = field(default_factory=lambda: [0.0625, 0.25, 1.0, 4.0, 16.0])
    repeats: int = 50
    precisions: list[str] = field(default_factory=lambda: ["fp32", "fp16", "bf16"])
    overhead_check: bool = True
    overhead_repeats: int = 5
    comm_check: bool = True  # train's --comm methods against DDP's all-reduce, on the largest world size
    powersgd_rank: int = 4
    period: int = 4
    link: str | None = None  # an emulated network between the ranks of each N-process launch ('1gbit,1ms'; gloo)


def quick(cfg: BenchConfig) -> BenchConfig:
    """The --quick variant of a config."""
    return replace(cfg, batches=[64, 1024], default_batch=1024, steps=4, warmup=1,
                   sizes_mib=[0.0625, 1.0, 16.0], repeats=10, overhead_repeats=1)


def check_int_list(name: str, values) -> None:
    """Refuse anything but a non-empty list of distinct ints >= 1, in one sentence."""
    if not isinstance(values, (list, tuple)) or not values:
        raise UsageError(f"{name} must be a non-empty list, got {values!r}.")
    for value in values:
        check_int(name, value, 1)
    twice = sorted({v for v in values if values.count(v) > 1})
    if twice:
        raise UsageError(f"{name} lists {', '.join(map(str, twice))} more than once; give each value once.")


def validate_bench(cfg: BenchConfig, capacity: int) -> None:
    """Refuse a benchmark that cannot run or cannot mean anything, in one sentence, before anything starts."""
    for name in ("world_sizes", "batches"):
        check_int_list(name, getattr(cfg, name))
    for name in ("default_batch", "steps", "rounds", "dim", "hidden", "depth", "repeats", "overhead_repeats",
                 "powersgd_rank", "period"):
        check_int(name, getattr(cfg, name), 1)
    check_int("warmup", cfg.warmup, 0)
    if max(cfg.world_sizes) < 2:
        raise UsageError(f"world sizes {cfg.world_sizes} compare nothing: give at least one world size >= 2.")
    if max(cfg.world_sizes) > capacity:
        raise UsageError(f"world size {max(cfg.world_sizes)} needs {max(cfg.world_sizes)} cores or GPUs, but this "
                         f"machine has {capacity}: oversubscribed timings would mean nothing; lower --world-sizes.")
    if cfg.default_batch not in cfg.batches:
        raise UsageError(f"default_batch {cfg.default_batch} must be one of the batches {cfg.batches}.")
    if not cfg.sizes_mib or any(not isinstance(m, (int, float)) or m <= 0 for m in cfg.sizes_mib):
        raise UsageError(f"sizes_mib must be positive message sizes in MiB, got {cfg.sizes_mib!r}.")
    if any(p not in PRECISIONS for p in cfg.precisions):
        raise UsageError(f"precisions must be among {', '.join(PRECISIONS)}, got {cfg.precisions!r}.")


def capacity(backend: str) -> int:
    """Processes this machine can time without oversubscription: GPUs on nccl, else cores (at least 2)."""
    chosen, gpus, _ = env.choose_launch(env.gpu_count(), env.nccl_available())
    on_gpus = backend == "nccl" or (backend == "auto" and chosen == "nccl")
    return gpus if on_gpus else max(env.cpu_cores(), 2)


def launch_worker(world_size: int, *args, out: Path, backend: str, link: str | None = None) -> list:
    """Run the bench worker and return every rank's results, {mode: result} each."""
    run = run_ddp("dp_helpers.scripts.bench_worker", *map(str, args), world_size=world_size, backend=backend,
                  out_dir=out, echo=False, timeout=1800, env={"OMP_NUM_THREADS": "1"}, link=link)
    return json.loads((run.run_dir / "bench.json").read_text())


def train_args(cfg: BenchConfig, *modes: str, extra=(), batches=None) -> list:
    """Worker flags for throughput measurements ("train" with --ddp/--no-ddp, "dataparallel" with --devices N ...)."""
    return ["--mode", *modes, *extra, "--batches", *(batches or cfg.batches), "--steps", cfg.steps,
            "--rounds", cfg.rounds, "--warmup", cfg.warmup, "--dim", cfg.dim, "--hidden", cfg.hidden,
            "--depth", cfg.depth]


def total(rows: list[dict], name: str) -> dict[int, float]:
    """Samples per second of one measured model, summed over ranks, per batch size."""
    return {int(b): sum(r[name][b] for r in rows) for b in rows[0][name]}


def of_mode(rows: list[dict], mode: str, key: str | None = None) -> list[dict]:
    """Every rank's result of one mode of a launch (and of one device count, for "dataparallel")."""
    return [r[mode] if key is None else r[mode][key] for r in rows]


def one_process(cfg: BenchConfig, many: list[int], tmp: Path, backend: str) -> tuple[dict, dict]:
    """T(1), and DataParallel driving N devices for each N in `many`, in one 1-process launch."""
    rows = launch_worker(1, *train_args(cfg, "train", "dataparallel", extra=["--no-ddp", "--devices", *many]),
                         out=tmp / "one", backend=backend)
    return total(of_mode(rows, "train"), "independent"), {w: total(of_mode(rows, "dataparallel", str(w)), "dataparallel")
                                                          for w in many}


def n_processes(cfg: BenchConfig, w: int, tmp: Path, backend: str, largest: bool) -> list[dict]:
    """The ceiling and DDP, alternating in the same w processes; on the largest w the all-reduce and --comm too."""
    modes = ["train", "allreduce", *(["comm"] if cfg.comm_check else [])] if largest else ["train"]
    extra = ["--ddp", *(allreduce_args(cfg) if largest else [])]
    return launch_worker(w, *train_args(cfg, *modes, extra=extra), out=tmp / f"n{w}", backend=backend, link=cfg.link)


def measure_all(cfg: BenchConfig, tmp: Path, backend: str, tick) -> tuple[dict, list, dict | None]:
    """Every CPU measurement, one launch per world size: (throughputs, all-reduce rows, --comm methods or None)."""
    # one launch each, since each pays seconds of start-up (torchrun and every rank import torch)
    many = sorted(w for w in cfg.world_sizes if w > 1)  # at least one: validate_bench
    single, dataparallel = one_process(cfg, many, tmp, backend)
    tick()
    tp = {"single": single, "independent": {}, "ddp": {}, "dataparallel": dataparallel}
    for w in many:
        rows = n_processes(cfg, w, tmp, backend, largest=w == many[-1])
        tick()
        train = of_mode(rows, "train")
        tp["independent"][w], tp["ddp"][w] = total(train, "independent"), total(train, "ddp")
    last, w = rows[0], many[-1]  # rank 0 of the largest world size
    return tp, allreduce_table(last["allreduce"], w), comm_table(cfg, last["comm"], w) if cfg.comm_check else None


def dataparallel_kind(backend: str) -> str:
    """What the DataParallel numbers are: the real module on GPUs, or the CPU emulation (label every figure)."""
    if backend == "nccl":
        return tr("real nn.DataParallel: one process driving N GPUs")
    return tr("CPU emulation (dp_helpers.scratch.dataparallel.scatter_gather): one process, N threads running the "
              "replicas' forward; autograd runs the whole backward on one CPU thread, so this is not a prediction "
              "for GPUs")


def precision_runs(cfg: BenchConfig, precision: str, n: int, tmp: Path) -> tuple:
    """(one GPU, DDP on n GPUs) samples/s in one precision; {"skipped": reason} for what cannot run."""
    problem = precision_problem(env.gpu_device(0), precision)
    if problem:
        return {"skipped": problem}, {"skipped": problem}
    b = cfg.default_batch

    def rate(w: int, ddp: bool) -> float:
        """Samples/s of one w-GPU launch at the default batch: DDP's, or one process's alone."""
        args = train_args(cfg, "train", extra=["--precision", precision, "--ddp" if ddp else "--no-ddp"], batches=[b])
        rows = launch_worker(w, *args, out=tmp / f"gpu{w}-{precision}", backend="nccl")
        return total(of_mode(rows, "train"), "ddp" if ddp else "independent")[b]

    single = rate(1, ddp=False)
    if n < 2:
        return single, {"skipped": f"DDP across GPUs needs at least two; found {n}"}
    return single, rate(n, ddp=True)


def gpu_section(cfg: BenchConfig, tmp: Path, tick) -> dict:
    """Single-GPU throughput in fp32, fp16 (autocast + GradScaler) and bf16 on nccl, and DDP in each with >= 2 GPUs."""
    n = env.gpu_count()
    if n < 1 or not env.nccl_available():
        return {"skipped": tr("needs a CUDA GPU and NCCL; found {n} GPU(s), nccl={nccl}", n=n, nccl=env.nccl_available())}
    out = {"gpus": list(env.gpu_names(n)), "batch": cfg.default_batch, "single": {}, "ddp": {}}
    for p in cfg.precisions:
        out["single"][p], out["ddp"][p] = precision_runs(cfg, p, n, tmp)
        tick(1 + (n > 1))
    fp32 = out["single"].get("fp32")
    out["speedup_over_fp32"] = {p: t / fp32 for p, t in out["single"].items()
                                if isinstance(t, float) and isinstance(fp32, float)}
    return out


def allreduce_args(cfg: BenchConfig) -> list:
    """Worker flags of the all-reduce sweep and of the --comm methods."""
    return ["--sizes", *cfg.sizes_mib, "--repeats", cfg.repeats, "--powersgd-rank", cfg.powersgd_rank,
            "--period", cfg.period, "--comm-batch", cfg.default_batch]


def allreduce_table(rows: list[dict], w: int) -> list[dict]:
    """Rank 0's all-reduce times on w processes, with algorithm and bus bandwidth, ring against dist.all_reduce."""
    for r in rows:
        for key in ("all_reduce", "ring"):
            r[f"algbw_{key}_GBps"] = r["bytes"] / r[f"{key}_s"] / 1e9
            r[f"busbw_{key}_GBps"] = r[f"algbw_{key}_GBps"] * 2 * (w - 1) / w  # what each link carries
        r["ring_over_all_reduce"], r["world_size"] = r["ring_s"] / r["all_reduce_s"], w
        r["ring_over_all_reduce_best"] = r["ring_best_s"] / r["all_reduce_best_s"]  # without scheduling noise
    return rows


def comm_table(cfg: BenchConfig, rows: dict, w: int) -> dict:
    """Rank 0's seconds and bytes per step of each --comm method on w processes, both as ratios to allreduce's."""
    base = rows["allreduce"]
    return {"world_size": w, "batch": cfg.default_batch, "powersgd_rank": cfg.powersgd_rank, "period": cfg.period,
            "methods": {m: {**r, "time_vs_allreduce": r["step_s"] / base["step_s"],
                            "bytes_vs_allreduce": r["bytes_per_step"] / base["bytes_per_step"]} for m, r in rows.items()}}


def wall(cmd: list[str], env: dict[str, str] | None = None) -> float:
    """Seconds a command takes, failing loudly if it fails."""
    start = time.perf_counter()
    done = run_tree(cmd, timeout=600, env=env)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed with exit code {done.returncode}:\n{done.stderr[-2000:]}")
    return time.perf_counter() - start


def overhead(tmp: Path, repeats: int = 1) -> dict:
    """`python -m dp_helpers train` against bare torchrun running the same training (the source article's loop, fixed); medians."""
    ours, bare = [], []
    for i in range(repeats):  # alternate the two, so a noisy moment hits both
        ours.append(wall([sys.executable, "-m", "dp_helpers", "train", "--world-size", "2", "--backend", "gloo",
                          "--out", str(tmp / f"overhead{i}")]))
        bare.append(wall([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "dp_helpers.scripts.article_torchrun"],
                         {**os.environ, "DP_RUN_DIR": str(tmp / f"bare{i}"),  # its folder in tmp, not in runs/
                          "TMPDIR": str(tmp)}))  # and the torchelastic_* folder a bare torchrun leaves in TMPDIR
    ours_s, bare_s = statistics.median(ours), statistics.median(bare)
    return {"dp_helpers_train_s": ours_s, "bare_torchrun_s": bare_s, "ratio": ours_s / bare_s, "repeats": repeats}


def derived(tp: dict, default_batch: int) -> dict:
    """Speed-up S(N) = T(N)/T(1) and efficiency against the ideal N and against the measured ceiling."""
    t1 = tp["single"][default_batch]
    speedup = {w: t[default_batch] / t1 for w, t in tp["ddp"].items()}
    ceiling = {w: t[default_batch] / t1 for w, t in tp["independent"].items()}
    return {"speedup": speedup, "ceiling_speedup": ceiling,
            "dataparallel_speedup": {w: t[default_batch] / t1 for w, t in tp["dataparallel"].items()},
            "efficiency": {w: s / w for w, s in speedup.items()},
            "efficiency_vs_ceiling": {w: speedup[w] / ceiling[w] for w in speedup},
            "batch_sweep": [{"batch": b, "single": tp["single"][b],
                             **{f"ddp_{w}": tp["ddp"][w][b] for w in tp["ddp"]},
                             **{f"independent_{w}": tp["independent"][w][b] for w in tp["independent"]},
                             **{f"dataparallel_{w}": t[b] for w, t in tp["dataparallel"].items()},
                             **{f"efficiency_vs_ceiling_{w}": tp["ddp"][w][b] / tp["independent"][w][b]
                                for w in tp["ddp"]}} for b in sorted(tp["single"])]}


def machine() -> dict:
    """The machine and versions the numbers were measured on."""
    return {**env.report().as_dict(), "machine": platform.machine(), "system": platform.platform(),
            "processor": platform.processor() or "unknown"}


def run_bench(cfg: BenchConfig, out_dir=None, backend: str = "auto") -> dict:
    """Measure everything in one run, write bench.json and the figures (a new folder under runs/ by default)."""
    from tqdm.auto import tqdm

    validate_bench(cfg, capacity(backend))
    backend = resolve_backend(backend, max(cfg.world_sizes))  # one backend for every world size, DataParallel's too
    check_link(cfg.link, backend)  # BANDWIDTH[,LATENCY], gloo only: refused here, before any folder or launch
    if out_dir is not None and (Path(out_dir) / "bench.json").exists():
        raise UsageError(f"output folder {out_dir} already holds a benchmark; choose a new folder or delete it.")
    out_dir = prepare_run_dir(out_dir, "bench")  # only now, so a refused benchmark leaves no folder behind
    gpus = env.gpu_count() if env.nccl_available() else 0  # gpu_section skips without NCCL
    runs = (1 + sum(w > 1 for w in cfg.world_sizes) + cfg.overhead_check + len(cfg.precisions) * ((gpus > 0) + (gpus > 1)))
    bar = tqdm(total=runs, desc="bench", unit="run")
    with tempfile.TemporaryDirectory() as tmp:
        tp, ar, comm = measure_all(cfg, Path(tmp), backend, lambda: bar.update(1))
        gpu = gpu_section(cfg, Path(tmp), bar.update)
        over = overhead(Path(tmp), cfg.overhead_repeats) if cfg.overhead_check else None
        bar.update(1 if cfg.overhead_check else 0)
    bar.close()
    result = {"config": asdict(cfg), "machine": machine(), "backend": backend, "throughput": tp,
              "dataparallel_kind": dataparallel_kind(backend), **derived(tp, cfg.default_batch),
              "allreduce": ar, "communication": comm, "gpu": gpu, "train_overhead": over}
    text = json.dumps(result, indent=2)
    write_text_atomic(out_dir / "bench.json", text)
    result = json.loads(text)  # the same object as the file: integer keys become strings in both
    save_figures(result, out_dir)
    return {**result, "out_dir": str(out_dir)}


def save_figures(result: dict, out_dir: Path) -> None:
    """speedup.png, bandwidth.png and efficiency_batch.png, drawn without pyplot."""
    from matplotlib.figure import Figure

    from dp_helpers.tool.plotting import plot_bandwidth, plot_efficiency_vs_batch, plot_speedup

    for name, draw in (("speedup", plot_speedup), ("bandwidth", plot_bandwidth),
                       ("efficiency_batch", plot_efficiency_vs_batch)):
        fig = Figure(figsize=(6, 4))
        draw(result, ax=fig.subplots())
        if result["config"].get("link"):  # an emulated measurement says so where it is shown
            fig.suptitle(f"multi-process timings behind an emulated link ({result['config']['link']})",
                         fontsize="small")
        fig.tight_layout()
        fig.savefig(out_dir / f"{name}.png", dpi=100)
