"""`python -m dp_helpers train | doctor`: the main job and the machine report (see README)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from .checks import UsageError
from .config import add_train_flags, config_from_args, shard_plan, validate
from .env import BACKENDS


def build_parser() -> argparse.ArgumentParser:
    """The CLI's parser with its two commands."""
    parser = argparse.ArgumentParser(prog="python -m dp_helpers", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train the source article's problem with DDP and write a run folder")
    train.add_argument("--world-size", type=int, default=None,
                       help="processes (default: one per GPU with >= 2 GPUs, else 2 CPU processes)")
    train.add_argument("--backend", choices=BACKENDS, default="auto", help="process-group backend")
    add_train_flags(train)
    train.add_argument("--out", default=None, help="run folder (default: a new one under runs/)")
    train.add_argument("--timeout", type=float, default=600.0, help="seconds before the run is stopped")
    sub.add_parser("doctor", help="what this machine can do and what train would pick")
    bench = sub.add_parser("bench", help="throughput, speed-up and all-reduce bandwidth, measured side by side")
    bench.add_argument("--quick", action="store_true", help="fewer steps and sizes: about a minute on 2 CPU cores")
    bench.add_argument("--world-sizes", type=int, nargs="+", default=None,
                       help="default: 1 up to one process per core (CPU) or per GPU")
    bench.add_argument("--backend", choices=BACKENDS, default="auto", help="process-group backend")
    bench.add_argument("--out", default=None, help="folder for bench.json and the figures (default: new, under runs/)")
    bench.add_argument("--no-overhead", action="store_true", help="skip timing train against bare torchrun")
    bench.add_argument("--batches", type=int, nargs="+", default=None,
                       help="per-process batch sizes to sweep; speed-up is reported at the largest (default: 64 256 1024)")
    bench.add_argument("--hidden", type=int, default=1024, help="width of the benchmark MLP's hidden layers")
    bench.add_argument("--depth", type=int, default=4, help="hidden layers of the benchmark MLP")
    return parser


def cmd_doctor(_args: argparse.Namespace) -> int:
    """Print the environment report."""
    from .env import format_report, report

    print(format_report(report()))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the benchmark and print its headline ratios."""
    from .bench import BenchConfig, capacity, quick, run_bench

    cfg = BenchConfig(world_sizes=args.world_sizes or list(range(1, capacity(args.backend) + 1)),
                      hidden=args.hidden, depth=args.depth, overhead_check=not args.no_overhead)
    cfg = quick(cfg) if args.quick else cfg
    if args.batches:  # after quick(), which would replace them
        cfg = replace(cfg, batches=sorted(set(args.batches)), default_batch=max(args.batches))
    result = run_bench(cfg, args.out, args.backend)
    for w, s in result["speedup"].items():
        print(f"N={w}: speed-up {s:.2f} (ceiling {result['ceiling_speedup'][w]:.2f}), "
              f"{100 * result['efficiency_vs_ceiling'][w]:.0f}% of the ceiling")
    print(f"results: {Path(result['out_dir']) / 'bench.json'}")
    return 0


def progress_steps(cfg, world_size: int) -> int | None:
    """Optimizer steps rank 0 will log in this run (one metrics line each), to size the progress bar."""
    plan = shard_plan(cfg.samples, world_size, cfg.batch_size, cfg.grad_accum_steps)
    last, first = (min(cfg.epochs, cfg.stop_after) if cfg.stop_after else cfg.epochs), 0
    if cfg.resume:  # torch is imported only when resuming
        from .training import checkpoint_epoch

        first = checkpoint_epoch(cfg.resume)
    return plan.optimizer_steps * max(last - first, 0) or None


def cmd_train(args: argparse.Namespace) -> int:
    """Validate, launch the DDP job with a progress bar, draw loss.png, print where everything is."""
    from .launch import plan_world_size, run_ddp

    cfg = config_from_args(args)
    world_size = plan_world_size(args.world_size, args.backend)
    validate(cfg, world_size)
    result = run_ddp("dp_helpers.scripts.train", *cfg.as_args(), world_size=world_size,
                     backend=args.backend, out_dir=args.out, timeout=args.timeout,
                     progress=progress_steps(cfg, world_size))
    from .plotting import save_loss_figure

    save_loss_figure(result.run_dir, Path(result.run_dir) / "loss.png")
    summary = result.summary
    print(f"final loss {summary['final_loss']:.6f} after {summary['steps']} steps on "
          f"{result.world_size} x {result.backend} in {result.wall_time:.1f}s")
    print(f"equivalence: {summary['equivalence']}")
    print(f"run folder: {result.run_dir}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point: bad input and failed runs end in one clear line and a non-zero exit; a bug keeps its traceback."""
    from .launch import DistributedRunError

    args = build_parser().parse_args(argv)
    try:
        return {"train": cmd_train, "doctor": cmd_doctor, "bench": cmd_bench}[args.command](args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except DistributedRunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: the run was stopped and no process is left running.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
