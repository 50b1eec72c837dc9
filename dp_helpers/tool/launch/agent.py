"""torchrun as run_ddp starts it: it dies with its launcher, and it records its workers' failures as data.

`python -m dp_helpers.tool.launch.agent <torchrun flags> script ...` is `python -m torch.distributed.run`
with two additions, both made here, after exec, rather than in a pre-exec hook of the launcher (a
forked child of a threaded parent must not run Python before exec):
- it dies with its launcher: the parent-death signal gives torchrun SIGTERM, and a watchdog thread that sees the
  launcher gone stops every process of the launch itself and ends this one, whatever torchrun's main thread is
  doing (a SIGTERM that lands while torchrun starts its workers could leave it waiting forever, at exit, on the
  log-tailing threads it never stopped: seen after a kill -9 of the CLI);
- `failures.json` in the run folder: torchrun's ChildFailedError.failures (rank, exit code, signal,
  the exception each rank's @record error file holds), which the launcher reads instead of parsing text.
With torchrun's own `--run-path --start-method fork` (what run_ddp passes on a Linux machine without a GPU) each
worker is forked from this process, which has imported torch already, and runs the script through runpy: on 2 cores that saves about 2 s of CPU
per worker per launch. `--run-path` takes a file; with `-m` (torchrun's --module, which --run-path ignores) the target
here is a module, run as `python -m` would. Each fork starts and ends as a fresh Python would (fresh_python,
run_target), and torchrun names every worker that had died, not only the first, and one that had raised and was
exiting. What a fork cannot undo: every rank
has the agent's hash seed (the same set order on every rank), and environment variables a script sets before
`import torch` come too late (torch is imported already).
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

from dp_helpers.tool.files import write_text_atomic

PR_SET_PDEATHSIG = 1
EXITING_S = 2.0  # how long a worker that has written its error file gets to exit before torchrun stops it
WATCH_S = 0.2  # how often the watchdog asks whether the launcher is still there


def die_with_launcher() -> None:
    """Ask Linux for SIGTERM when the launching thread dies; exit now if it is already gone."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    launcher = os.environ.get("DP_LAUNCHER_PID")
    if launcher and os.getppid() != int(launcher):  # it died before prctl: nobody would stop us later
        sys.exit(1)


def watch_launcher() -> None:
    """A daemon thread that ends this launch once the launcher is gone, even if torchrun never acts on SIGTERM."""
    launcher = os.environ.get("DP_LAUNCHER_PID")
    if not launcher or not launcher.isdigit():  # not started by run_ddp: nobody to watch
        return

    def watch() -> None:
        """Poll the parent pid (a dead launcher's children are given to another process); then stop everything."""
        while os.getppid() == int(launcher):
            time.sleep(WATCH_S)
        orphaned()

    threading.Thread(target=watch, name="dp-launcher-watchdog", daemon=True).start()


def orphaned() -> None:
    """The launcher died: stop every process of this launch (SIGTERM, then SIGKILL), tidy up, end this process."""
    import psutil

    from dp_helpers.tool.launch.process import marked, stop_all

    marker = os.environ.get("DP_LAUNCH_ID")
    stop_all(psutil.Process().children(recursive=True) + (marked(marker) if marker else []))
    remove_scratch()
    if os.getpgrp() == os.getpid():  # run_ddp's own session: this also takes a worker forked meanwhile
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os._exit(128 + signal.SIGTERM)


def use_scratch() -> None:
    """Keep what torch writes to the temporary folder (its workers' error pickles) in this launch's own folder."""
    folder = os.environ.get("DP_AGENT_TMPDIR")  # the launcher names it and removes it after the run
    if folder:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        tempfile.tempdir = folder  # torch.multiprocessing leaves a pytorch-errorfile-*.pickle per raising rank


def remove_scratch() -> None:
    """Remove this launch's temporary folder, whatever is in it."""
    folder = os.environ.get("DP_AGENT_TMPDIR")
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def exception_line(failure) -> str:
    """The 'SomeError: message' line of one ProcessFailure ('' for a signal death or no error file)."""
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message", "")
    return "" if str(message).startswith(("Signal ", "To enable traceback")) else str(message).strip()


def failure_records(failures: dict) -> list[dict]:
    """ChildFailedError.failures (global rank -> ProcessFailure) as JSON-ready records, in rank order."""
    return [{"rank": rank, "local_rank": f.local_rank, "exit_code": f.exitcode, "pid": f.pid,
             "signal": f.signal_name() if f.exitcode < 0 else "", "exception": exception_line(f),
             "error_file": f.error_file, "timestamp": f.timestamp} for rank, f in sorted(failures.items())]


def keep_every_failure() -> None:
    """Make torchrun report every forked worker that had died when it noticed a failure, not only the first it polled."""
    # with forked workers torchrun's monitor stops the others as soon as one has failed and names that one; when two
    # died in the same 0.1 s poll it names them in rank order, so a rank killed by a signal could lose its blame to a
    # peer that only lost its connection. Subprocess workers (GPUs) are reported in full already.
    from torch.distributed.elastic.multiprocessing import api

    poll = api.MultiprocessContext._poll

    def every_failure(self):
        """MultiprocessContext._poll, plus a failure for each worker already dead before it looked, or exiting."""
        dead = {i: p.exitcode for i, p in enumerate(self._pc.processes) if p.exitcode not in (None, 0)}
        result = poll(self)
        if result is None or not result.failures:
            return result
        for i, p in enumerate(self._pc.processes):
            if i not in dead and i not in result.failures and os.path.isfile(self.error_files[i]):
                p.join(EXITING_S)  # @record wrote its exception: it is on its way out (seen: a rank that timed out
                if p.exitcode not in (None, 0):  # was still exiting when its peer's lost connection was polled)
                    dead[i] = p.exitcode
        for i, code in dead.items():
            result.failures.setdefault(i, api.ProcessFailure(local_rank=i, pid=self._pc.processes[i].pid,
                                                             exitcode=code, error_file=self.error_files[i]))
        return result

    api.MultiprocessContext._poll = every_failure


def main(argv: list[str]) -> int:
    """Run torchrun's launcher; on a worker failure write failures.json, print torchrun's summary, return 1."""
    die_with_launcher()
    watch_launcher()
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = torchrun.parse_args(argv)
    if args.run_path:
        torchrun.run_script_path = run_target  # torchrun's --run-path entry point, widened to `-m module`
        keep_every_failure()
    use_scratch()
    try:
        torchrun.run(args)
    except ChildFailedError as exc:
        run_dir = Path(os.environ.get("DP_RUN_DIR", "."))
        write_text_atomic(run_dir / "failures.json", json.dumps(failure_records(exc.failures), indent=1) + "\n")
        print(exc, file=sys.stderr, flush=True)  # torchrun's own table, for people reading the log
        return 1
    except SignalException as exc:  # torchrun was stopped (and stopped its workers): one line, read by diagnose.py
        print(f"{type(exc).__module__}.{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 128 + int(exc.sigval)
    finally:
        stop_stragglers()
        remove_scratch()
    return 0


def run_target(target: str, *script_args: str) -> None:
    """A forked worker: `python script.py args` or `python -m module args`, run in this interpreter by runpy."""
    fresh_python(target)
    sys.argv = [target, *script_args]  # run_module(alter_sys=True) sets argv[0] to the module's file, as -m does
    interrupted = False
    try:
        if target.endswith(".py"):
            runpy.run_path(target, run_name="__main__")
        else:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
    except SystemExit as exc:  # sys.exit(), sys.exit(None), sys.exit(0): a success, which torchrun sees only returned
        if exc.code not in (None, 0):
            raise  # torchrun's wrapper ends the fork with this code (a message: printed, code 1)
    except BaseException as exc:  # a fresh Python prints the traceback; torchrun's wrapper would only store it
        print_from_script(exc, target)
        interrupted = isinstance(exc, KeyboardInterrupt)  # torchrun's wrapper would end the fork with code 0
        if not interrupted:
            raise
    finally:
        atexit._run_exitfuncs()  # a fork ends in os._exit: run the exit handlers, as Python's exit would
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)  # as a fresh Python ends after an uncaught Ctrl-C


def print_from_script(exc: BaseException, target: str) -> None:
    """Print the traceback as a fresh Python would, from the script's first frame (not runpy's, not this file's)."""
    tb, agent = exc.__traceback__, os.path.abspath(__file__)
    while tb is not None and (tb.tb_frame.f_code.co_filename in (agent, runpy.__file__)
                              or tb.tb_frame.f_code.co_filename.startswith("<frozen")):
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb or exc.__traceback__)
    sys.stderr.flush()


def fresh_python(target: str) -> None:
    """Undo what a fork inherits from torchrun and a fresh interpreter would not have."""
    import torch

    os.environ["DP_FORKED_RANK"] = str(os.getpid())  # dist.worker: return, for torchrun, instead of os._exit(0)
    # torchrun's handlers turn SIGTERM into an exception
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(number, signal.SIG_DFL)
    tempfile.tempdir = None  # the agent's is its launch's own folder, removed after the run: a fresh Python's TMPDIR
    torch.seed()  # every rank would draw the agent's random numbers: each fresh Python seeds its own at random
    if "numpy" in sys.modules:  # imported by the agent, so inherited (Python's own random reseeds itself after a fork)
        sys.modules["numpy"].random.seed()
    # the script's folder first on the import path for a file (`python script.py`), the working folder for -m
    sys.path[0] = os.path.dirname(os.path.abspath(target)) if target.endswith(".py") else os.getcwd()


def stop_stragglers() -> None:
    """SIGKILL any worker of this launch that outlived torchrun (its shutdown cut short): none may become an orphan."""
    from dp_helpers.tool.launch.process import marked, send

    marker = os.environ.get("DP_LAUNCH_ID")
    for p in marked(marker) if marker else []:
        send(p, signal.SIGKILL)


def exit_code(argv: list[str]) -> int:
    """main()'s code; an error it let through is printed, as Python would, and ends in code 1."""
    try:
        return main(argv)
    except SystemExit as exc:  # torchrun's usage errors (argparse has printed them), die_with_launcher
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)  # sys.exit("message"), as Python would print it
        return 1
    except BaseException:
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    code = exit_code(sys.argv[1:])
    # the workers are gone and every file is closed: skip the interpreter's finalization, which costs
    # about half a second of CPU once torch is imported, on every launch, and would wait for ever on
    # torchrun's log-tailing threads if a signal had cut its start short (they are not daemons)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:  # the launcher is gone, and its pipe with it
            pass
    os._exit(code)
