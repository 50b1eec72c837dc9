"""`python -m dp_helpers train | doctor | bench`: the main job, the machine report and the benchmark (see README)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path

from dp_helpers.tool.config import add_train_flags, config_from_args
from dp_helpers.tool.env import BACKENDS
from dp_helpers.tool.request import UsageError, check_train_request


class DefaultsOnce(argparse.ArgumentDefaultsHelpFormatter):
    """Each flag's default said once: not after a help text that already names it, nor for a default of nothing."""

    def _get_help_string(self, action):
        if "(default" in (action.help or "") or action.default in (None, ""):
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    """The CLI's parser: train, doctor and bench."""
    parser = argparse.ArgumentParser(prog="python -m dp_helpers", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train the source article's problem with DDP and write a run folder",
                           formatter_class=DefaultsOnce)
    train.add_argument("--world-size", type=int, default=None,
                       help="processes (default: one per GPU with >= 2 GPUs, else 2 CPU processes)")
    train.add_argument("--backend", choices=BACKENDS, default="auto", help="process-group backend")
    add_train_flags(train)
    train.add_argument("--out", default=None, help="run folder, new or empty (default: a new one under runs/)")
    train.add_argument("--timeout", type=float, default=None,
                       help="seconds before the run is stopped (default: no limit)")
    train.add_argument("--max-restarts", type=int, default=0,
                       help="times torchrun may start the whole group again after a rank dies; with --checkpoint the "
                            "job resumes from its last snapshot")
    train.add_argument("--link", default=None,
                       help="an emulated network between the ranks, BANDWIDTH[,LATENCY] such as 1gbit,20us: every "
                            "collective then takes the time that link needs (gloo only; the timings are emulated)")
    train.add_argument("--oversubscribe", action="store_true",
                       help="allow a world size far above the CPU cores (more than max(8, 4 x cores) processes)")
    sub.add_parser("doctor", help="what this machine can do and what train would pick")
    add_bench_parser(sub)
    return parser


def add_bench_parser(sub) -> None:
    """The bench command's flags."""
    bench = sub.add_parser("bench", help="throughput, speed-up and all-reduce bandwidth, measured side by side",
                           formatter_class=DefaultsOnce)
    bench.add_argument("--quick", action="store_true", help="fewer steps and sizes: about a minute on 2 CPU cores")
    bench.add_argument("--world-sizes", type=int, nargs="+", default=None,
                       help="default: 1 up to one process per core (CPU) or per GPU")
    bench.add_argument("--backend", choices=BACKENDS, default="auto", help="process-group backend")
    bench.add_argument("--out", default=None, help="folder for bench.json and the figures (default: new, under runs/)")
    bench.add_argument("--no-overhead", action="store_true", help="skip timing train against bare torchrun")
    bench.add_argument("--link", default=None,
                       help="an emulated network between the ranks of every multi-process launch, BANDWIDTH[,LATENCY] "
                            "such as 1gbit,1ms (gloo only; those timings are emulated, and bench.json says so)")
    bench.add_argument("--no-comm", action="store_true",
                       help="skip timing train's --comm methods (fp16, PowerSGD, local SGD, DiLoCo) against DDP")
    bench.add_argument("--batches", type=int, nargs="+", default=None,
                       help="per-process batch sizes to sweep; speed-up is reported at the largest (default: 64 256 1024)")
    bench.add_argument("--hidden", type=int, default=1024, help="width of the benchmark MLP's hidden layers")
    bench.add_argument("--depth", type=int, default=4, help="hidden layers of the benchmark MLP")


def flag_rows(command: str = "train") -> list[tuple[str, str, str]]:
    """(flag, default, meaning) of every flag of a CLI command: the README's table is this, and a test keeps it so."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    rows = []
    for action in sub._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        flag = " / ".join(f"`{s}`" for s in action.option_strings if s.startswith("--"))
        if action.choices:
            flag = flag[:-1] + " {" + ",".join(map(str, action.choices)) + "}`"
        default = action.default
        if isinstance(default, bool):  # checked first: 0 == False and 1 == True would match a dict lookup
            default = "on" if default else "off"
        else:
            default = {None: "see meaning", "": "none"}.get(default, f"`{default}`")
        rows.append((flag, default, action.help.replace("|", "/")))
    return rows


def cmd_doctor(_args: argparse.Namespace) -> int:
    """Print the environment report."""
    from dp_helpers.tool.env import format_report, report

    print(format_report(report()))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the benchmark and print its headline ratios."""
    from dp_helpers.tool.bench import BenchConfig, capacity, quick, run_bench

    cfg = BenchConfig(world_sizes=args.world_sizes or list(range(1, capacity(args.backend) + 1)),
                      hidden=args.hidden, depth=args.depth, overhead_check=not args.no_overhead,
                      comm_check=not args.no_comm, link=args.link)
    cfg = quick(cfg) if args.quick else cfg
    if args.batches:  # after quick(), which would replace them
        cfg = replace(cfg, batches=sorted(set(args.batches)), default_batch=max(args.batches))
    result = run_bench(cfg, args.out, args.backend)
    for w, s in result["speedup"].items():
        print(f"N={w}: speed-up {s:.2f} (ceiling {result['ceiling_speedup'][w]:.2f}), "
              f"{100 * result['efficiency_vs_ceiling'][w]:.0f}% of the ceiling")
    for method, r in (result.get("communication") or {"methods": {}})["methods"].items():
        print(f"--comm {method}: {r['bytes_vs_allreduce']:.1%} of allreduce's bytes per step, "
              f"{r['time_vs_allreduce']:.2f} x its step time")
    if args.link:
        print(f"every N-process timing above ran behind an emulated link ({args.link}): emulated, not measured on a network")
    print(f"results: {Path(result['out_dir']) / 'bench.json'}")
    return 0


def report(result, lines: list[str]) -> None:
    """Print the final lines and add them to console.log, which then holds everything the run printed."""
    for line in lines:
        print(line)
    log_lines(result.run_dir, lines)


def log_lines(run_dir, lines: list[str]) -> None:
    """Append what the CLI says at the end to the run's console.log (when the run got a folder)."""
    from dp_helpers.tool.files import append_text

    if run_dir is not None and Path(run_dir, "console.log").is_file():
        append_text(Path(run_dir) / "console.log", "".join(f"{line}\n" for line in lines))


def cmd_train(args: argparse.Namespace) -> int:
    """Validate, launch the DDP job with a progress bar, draw loss.png, print where everything is."""
    from dp_helpers.tool.launch import DistributedRunError, RunTimeoutError, run_ddp
    from dp_helpers.tool.launch.runners import ending_recorded

    cfg = config_from_args(args)
    script_args = cfg.as_args()
    plan = check_train_request(cfg, args.world_size, args.backend, args.oversubscribe, args.max_restarts, args.out,
                               args.timeout, args.link)  # every check, in one place, before anything starts
    try:
        with ending_recorded(cfg, f"--timeout {args.timeout:g} s" if args.timeout else "", interrupted):
            result = run_ddp("dp_helpers.scripts.train", *script_args, world_size=plan.world_size, backend=args.backend,
                             out_dir=args.out, timeout=args.timeout, progress=plan.steps, max_restarts=args.max_restarts,
                             link=args.link)
    except RunTimeoutError as exc:
        said = (f"{exc}\nThe run folder keeps what finished ({exc.run_dir}); raise --timeout, or leave it out: the CLI "
                "sets no limit by default.")
        log_lines(exc.run_dir, [f"error: {said}"])  # what the CLI prints, kept with the rest
        raise RunTimeoutError(said, run_dir=exc.run_dir) from None
    except DistributedRunError as exc:
        log_lines(exc.run_dir, [f"error: {exc}"])  # what the CLI prints, kept with the rest
        raise
    return report_train(result, cfg)


def report_train(result, cfg) -> int:
    """After a run: loss.png (a full disk marks the record failed), then the lines that say how it went."""
    from dp_helpers.tool.plotting import run_title, save_loss_figure
    from dp_helpers.tool.runs import mark_failed

    summary = result.summary
    try:
        save_loss_figure(result.run_dir, Path(result.run_dir) / "loss.png", title=run_title(summary))
    except OSError as exc:
        if exc.errno == errno.ENOSPC:  # trained, but what it wrote is incomplete: the record must not say finished
            mark_failed(result.run_dir, exc.strerror)
        exc.run_dir = result.run_dir
        raise
    stopped = [f"stopped by {summary['reason']} after epoch {len(summary['epoch_losses'])} of {cfg.epochs}"
               + (f"; --resume {cfg.checkpoint} continues it" if cfg.checkpoint else "")] \
        if summary.get("status") == "stopped" else []
    report(result, [f"final loss {summary['final_loss']:.6f} after {summary['steps']} steps on "
                    f"{result.world_size} x {result.backend}"
                    + (f" behind an emulated link ({summary['link']})" if summary.get("link") else "")
                    + f" in {result.wall_time:.1f}s", *stopped,
                    *snapshot_line(summary, cfg), f"equivalence: {summary['equivalence']}",
                    f"run folder: {result.run_dir}"])
    return 0


def snapshot_line(summary: dict, cfg) -> list[str]:
    """With --checkpoint, how long the saves kept rank 0 from training, and how they were written."""
    if not cfg.checkpoint or not summary.get("checkpoint_saves"):
        return []
    how = ("async: rank 0 copied the state, a thread wrote it" if cfg.async_checkpoint
           else "rank 0 wrote each while every rank waited; --async-checkpoint hides the write")
    return [f"{summary['checkpoint_saves']} snapshot(s) to {cfg.checkpoint}; training waited "
            f"{summary['checkpoint_stall_seconds']:.3f}s in all on rank 0 ({how})"]


def interrupted(exc: KeyboardInterrupt) -> str:
    """How the CLI's run was stopped: Ctrl-C, SIGTERM or SIGHUP (turned into Terminated, HungUp)."""
    if isinstance(exc, HungUp):
        return "hung up (SIGHUP: its terminal was closed)"
    return "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted (Ctrl-C)"


class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an exception so the launcher stops its processes before the CLI exits."""


class HungUp(KeyboardInterrupt):
    """SIGHUP (the terminal was closed), turned into an exception as SIGTERM is."""


def on_sigterm(signum, frame) -> None:
    """The SIGTERM and SIGHUP handler."""
    raise HungUp() if signum == getattr(signal, "SIGHUP", None) else Terminated()


def stop_signals() -> list[int]:
    """SIGTERM, and SIGHUP unless it is ignored (nohup: the run is meant to outlive its terminal)."""
    hangup = getattr(signal, "SIGHUP", None)  # not on Windows
    return [signal.SIGTERM] + ([hangup] if hangup and signal.getsignal(hangup) == signal.SIG_DFL else [])


def say(exc: BaseException, line: str) -> None:
    """Print the CLI's last line, and keep it in the run's console.log when the launcher put a run folder on exc."""
    with contextlib.suppress(OSError):  # a full disk: the line is still printed
        log_lines(getattr(exc, "run_dir", None), [line])
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:  # the terminal is gone (SIGHUP): the line is in console.log; exit quietly
        sys.stderr = sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (Python flushes these at exit)


def disk_full_sentence(exc: OSError) -> str:
    """A full disk in one sentence: what could not be written, where, and what to do."""
    said = exc.strerror if exc.strerror and exc.strerror.startswith("the disk is full") else (
        f"the disk is full: {Path(exc.filename).name if exc.filename else 'a file'} could not be written"
        + (f" in {Path(exc.filename).parent}" if exc.filename else ""))
    return f"{said}; free some space and run again"


def main(argv: list[str] | None = None) -> int:
    """Entry point: bad input and failed runs end in one clear line and a non-zero exit; a bug keeps its traceback."""
    from dp_helpers.tool.launch import DistributedRunError
    from dp_helpers.tool.launch.process import HELD_SIGNALS, signals_held

    args = build_parser().parse_args(argv)
    previous = {sig: signal.signal(sig, on_sigterm) for sig in stop_signals()}
    try:
        return {"train": cmd_train, "doctor": cmd_doctor, "bench": cmd_bench}[args.command](args)
    except (UsageError, DistributedRunError, KeyboardInterrupt, OSError) as exc:
        with signals_held():  # the run is over: one more Ctrl-C (often pressed twice) must not cut its last line
            code = last_words(exc)
        if argv is None and isinstance(exc, KeyboardInterrupt):  # this process is the command, and it ends now:
            previous = dict.fromkeys(HELD_SIGNALS, signal.SIG_IGN)  # one more Ctrl-C while Python exits is no death
        return code
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def last_words(exc: BaseException) -> int:
    """The CLI's last line for how it stopped, and its exit code; an error that is not the user's is raised again."""
    from dp_helpers.tool.launch import DistributedRunError

    if isinstance(exc, (UsageError, DistributedRunError)):
        print(f"error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, UsageError) else 1
    if isinstance(exc, HungUp):
        say(exc, "hung up (SIGHUP): the run was stopped and no process it started is left running.")
        return 129
    if isinstance(exc, Terminated):
        say(exc, "terminated (SIGTERM): the run was stopped and no process it started is left running.")
        return 143
    if isinstance(exc, KeyboardInterrupt):
        say(exc, "interrupted: the run was stopped and no process it started is left running.")
        return 130
    if exc.errno != errno.ENOSPC:
        raise exc
    folder = getattr(exc, "run_dir", None)
    print(f"error: {disk_full_sentence(exc)}" + (f"; the run folder keeps what was written: {folder}" if folder else ""),
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
