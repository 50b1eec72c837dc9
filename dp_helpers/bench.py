"""`python -m dp_helpers bench`: throughput, speed-up, efficiency and all-reduce bandwidth, side by side in one run (notebook 05).

Every number is measured on this machine in this run. On CPUs each process gets one thread
(OMP_NUM_THREADS=1), so world size N means N cores; on GPUs one process per GPU.
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .env import report
from .launch import prepare_run_dir, run_ddp


@dataclass
class BenchConfig:
    """What to measure; --quick shrinks steps, batch sizes and message sizes to finish in about a minute."""

    world_sizes: list[int]
    batches: list[int] = field(default_factory=lambda: [64, 256, 1024])
    default_batch: int = 1024
    steps: int = 10
    warmup: int = 2
    dim: int = 512
    hidden: int = 1024
    depth: int = 4
    sizes_mib: list[float] = field(default_factory=lambda: [0.0625, 0.25, 1.0, 4.0, 16.0])
    repeats: int = 20
    overhead_check: bool = True
    overhead_repeats: int = 3


def quick(cfg: BenchConfig) -> BenchConfig:
    """The --quick variant of a config."""
    return BenchConfig(cfg.world_sizes, batches=[64, 1024], default_batch=1024, steps=4, warmup=1, dim=cfg.dim,
                       hidden=cfg.hidden, depth=cfg.depth, sizes_mib=[0.0625, 1.0, 16.0], repeats=10,
                       overhead_check=cfg.overhead_check, overhead_repeats=1)


def worker(world_size: int, *args, out: Path, backend: str) -> list:
    """Run the bench worker and return every rank's result."""
    run = run_ddp("dp_helpers.scripts.bench_worker", *map(str, args), world_size=world_size, backend=backend,
                  out_dir=out, echo=False, timeout=1800, env={"OMP_NUM_THREADS": "1"})
    return json.loads((run.run_dir / "bench.json").read_text())


def train_args(cfg: BenchConfig, ddp: bool) -> list:
    """Worker flags for a throughput measurement."""
    return ["--mode", "train", "--ddp" if ddp else "--no-ddp", "--batches", *cfg.batches, "--steps", cfg.steps,
            "--warmup", cfg.warmup, "--dim", cfg.dim, "--hidden", cfg.hidden, "--depth", cfg.depth]


def total(rows: list[dict]) -> dict[int, float]:
    """Samples per second summed over ranks, per batch size."""
    return {int(b): sum(r[b] for r in rows) for b in rows[0]}


def throughputs(cfg: BenchConfig, tmp: Path, backend: str, tick) -> dict:
    """Samples/s of one process, of N independent processes (the ceiling) and of DDP, per batch size."""
    out = {"single": total(worker(1, *train_args(cfg, False), out=tmp / "single", backend=backend))}
    tick()
    out["independent"], out["ddp"] = {}, {}
    for w in (w for w in cfg.world_sizes if w > 1):
        out["independent"][w] = total(worker(w, *train_args(cfg, False), out=tmp / f"indep{w}", backend=backend))
        tick()
        out["ddp"][w] = total(worker(w, *train_args(cfg, True), out=tmp / f"ddp{w}", backend=backend))
        tick()
    return out


def allreduce_rows(cfg: BenchConfig, tmp: Path, backend: str) -> list[dict]:
    """Time and bus bandwidth of dist.all_reduce and ring_all_reduce per message size, on the largest world size."""
    w = max(cfg.world_sizes)
    if w < 2:
        return []
    rows = worker(w, "--mode", "allreduce", "--sizes", *cfg.sizes_mib, "--repeats", cfg.repeats, out=tmp / "ar",
                  backend=backend)[0]
    for r in rows:
        for key in ("all_reduce", "ring"):
            r[f"algbw_{key}_GBps"] = r["bytes"] / r[f"{key}_s"] / 1e9
            r[f"busbw_{key}_GBps"] = r[f"algbw_{key}_GBps"] * 2 * (w - 1) / w  # what each link carries
        r["ring_over_all_reduce"], r["world_size"] = r["ring_s"] / r["all_reduce_s"], w
    return rows


def wall(cmd: list[str]) -> float:
    """Seconds a command takes, failing loudly if it fails."""
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    return time.perf_counter() - start


def overhead(tmp: Path, repeats: int = 1) -> dict:
    """`python -m dp_helpers train` against bare torchrun running the same training (the seed's loop, fixed); medians."""
    ours, bare = [], []
    for i in range(repeats):  # alternate the two, so a noisy moment hits both
        ours.append(wall([sys.executable, "-m", "dp_helpers", "train", "--world-size", "2", "--backend", "gloo",
                          "--out", str(tmp / f"overhead{i}")]))
        bare.append(wall([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "dp_helpers.scripts.seed_torchrun"]))
    ours_s, bare_s = statistics.median(ours), statistics.median(bare)
    return {"dp_helpers_train_s": ours_s, "bare_torchrun_s": bare_s, "ratio": ours_s / bare_s, "repeats": repeats}


def derived(tp: dict, default_batch: int) -> dict:
    """Speed-up S(N) = T(N)/T(1) and efficiency against the ideal N and against the measured ceiling."""
    t1 = tp["single"][default_batch]
    speedup = {w: t[default_batch] / t1 for w, t in tp["ddp"].items()}
    ceiling = {w: t[default_batch] / t1 for w, t in tp["independent"].items()}
    return {"speedup": speedup, "ceiling_speedup": ceiling,
            "efficiency": {w: s / w for w, s in speedup.items()},
            "efficiency_vs_ceiling": {w: speedup[w] / ceiling[w] for w in speedup},
            "batch_sweep": [{"batch": b, "single": tp["single"][b],
                             **{f"ddp_{w}": tp["ddp"][w][b] for w in tp["ddp"]},
                             **{f"independent_{w}": tp["independent"][w][b] for w in tp["independent"]},
                             **{f"efficiency_vs_ceiling_{w}": tp["ddp"][w][b] / tp["independent"][w][b]
                                for w in tp["ddp"]}} for b in sorted(tp["single"])]}


def machine() -> dict:
    """The machine and versions the numbers were measured on."""
    return {**report().as_dict(), "machine": platform.machine(), "system": platform.platform(),
            "processor": platform.processor() or "unknown"}


def run_bench(cfg: BenchConfig, out_dir=None, backend: str = "auto") -> dict:
    """Measure everything in one run, write bench.json and the figures (a new folder under runs/ by default)."""
    from tqdm.auto import tqdm

    out_dir = prepare_run_dir(out_dir, "bench")
    if (out_dir / "bench.json").exists():
        raise ValueError(f"output folder {out_dir} already holds a benchmark; choose a new folder or delete it.")
    bar = tqdm(total=1 + 2 * sum(w > 1 for w in cfg.world_sizes) + 1 + cfg.overhead_check, desc="bench", unit="run")
    with tempfile.TemporaryDirectory() as tmp:
        tp = throughputs(cfg, Path(tmp), backend, lambda: bar.update(1))
        ar = allreduce_rows(cfg, Path(tmp), backend)
        bar.update(1)
        over = overhead(Path(tmp), cfg.overhead_repeats) if cfg.overhead_check else None
        bar.update(1 if cfg.overhead_check else 0)
    bar.close()
    result = {"config": asdict(cfg), "machine": machine(), "throughput": tp, **derived(tp, cfg.default_batch),
              "allreduce": ar, "train_overhead": over}
    text = json.dumps(result, indent=2)
    (out_dir / "bench.json").write_text(text, encoding="utf-8")
    result = json.loads(text)  # the same object as the file: integer keys become strings in both
    save_figures(result, out_dir)
    return {**result, "out_dir": str(out_dir)}


def save_figures(result: dict, out_dir: Path) -> None:
    """speedup.png, bandwidth.png and efficiency_batch.png, drawn without pyplot."""
    from matplotlib.figure import Figure

    from .plotting import plot_bandwidth, plot_efficiency_vs_batch, plot_speedup

    for name, draw in (("speedup", plot_speedup), ("bandwidth", plot_bandwidth),
                       ("efficiency_batch", plot_efficiency_vs_batch)):
        fig = Figure(figsize=(6, 4))
        draw(result, ax=fig.subplots())
        fig.tight_layout()
        fig.savefig(out_dir / f"{name}.png", dpi=100)
