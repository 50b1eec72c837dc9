"""torchrun as run_ddp starts it: it dies with its launcher, and it records its workers' failures as data.

`python -m dp_helpers.launch.agent <torchrun flags> script ...` is `python -m torch.distributed.run`
with two additions, both made here, after exec, rather than in a pre-exec hook of the launcher (a
forked child of a threaded parent must not run Python before exec):
- the parent-death signal: if the launching process dies (a killed Jupyter kernel), torchrun gets
  SIGTERM and stops its workers;
- `failures.json` in the run folder: torchrun's ChildFailedError.failures (rank, exit code, signal,
  the exception each rank's @record error file holds), which the launcher reads instead of parsing text.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from ..runs import write_text_atomic

PR_SET_PDEATHSIG = 1


def die_with_launcher() -> None:
    """Ask Linux for SIGTERM when the launching thread dies; exit now if it is already gone."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    launcher = os.environ.get("DP_LAUNCHER_PID")
    if launcher and os.getppid() != int(launcher):  # it died before prctl: nobody would stop us later
        sys.exit(1)


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


def main(argv: list[str]) -> int:
    """Run torchrun's launcher; on a worker failure write failures.json, print torchrun's summary, return 1."""
    die_with_launcher()
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        torchrun.run(torchrun.parse_args(argv))
    except ChildFailedError as exc:
        run_dir = Path(os.environ.get("DP_RUN_DIR", "."))
        write_text_atomic(run_dir / "failures.json", json.dumps(failure_records(exc.failures), indent=1) + "\n")
        print(exc, file=sys.stderr, flush=True)  # torchrun's own table, for people reading the log
        return 1
    finally:
        stop_stragglers()
    return 0


def stop_stragglers() -> None:
    """SIGKILL any worker of this launch that outlived torchrun (its shutdown cut short): none may become an orphan."""
    from .process import marked, send

    marker = os.environ.get("DP_LAUNCH_ID")
    for p in marked(marker) if marker else []:
        send(p, signal.SIGKILL)


if __name__ == "__main__":
    code = main(sys.argv[1:])
    # the workers are gone and every file is closed: skip the interpreter's finalization, which costs
    # about half a second of CPU once torch is imported, on every launch
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
