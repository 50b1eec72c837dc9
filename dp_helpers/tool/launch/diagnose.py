"""Why a run failed: which rank, its exit code and its exception, read from records, not from printed text.

First source: `failures.json`, written by dp_helpers.tool.launch.agent from torchrun's ChildFailedError
(the exception comes from each rank's @record error file). Fallback, when torchrun itself died or an
older agent ran: torchrun's printed "Root Cause" table, whose layout has changed between versions.
"""

from __future__ import annotations

import json
import re
import signal
from dataclasses import dataclass, replace
from pathlib import Path


class DistributedRunError(RuntimeError):
    """A launched run failed: names the failing rank(s), the exit code and the root-cause exception."""

    def __init__(self, message: str, ranks: tuple[int, ...] = (), exit_code: int | None = None,
                 cause: str = "", log_tail: str = "", run_dir: Path | None = None):
        super().__init__(message)
        self.ranks, self.exit_code, self.cause = ranks, exit_code, cause
        self.log_tail, self.run_dir = log_tail, run_dir


class RunTimeoutError(DistributedRunError, TimeoutError):
    """A launched run exceeded its timeout and was stopped."""


@dataclass(frozen=True)
class Failure:
    """One failed rank: its exit code, the signal that killed it ('' if none) and its exception line ('' if none)."""

    rank: int
    exit_code: int
    exception: str = ""
    signal: str = ""
    timestamp: int = 0  # seconds since the epoch when torchrun saw it (0: unknown)


def read_records(path: Path) -> list[Failure] | None:
    """The failures the agent recorded, or None when there is no readable record."""
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
        return [Failure(int(r["rank"]), int(r["exit_code"]), str(r.get("exception", "")), str(r.get("signal", "")),
                        int(r.get("timestamp", 0))) for r in rows]
    except (OSError, ValueError, KeyError, TypeError):
        return None


ENTRY_RE = re.compile(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)[^\n]*?(?:\n|$).*?error_file\s*:\s*(\S+)"
                      r"(?:\s*\n\s*traceback\s*:\s*([^\n]*))?", re.S)


def error_file_exception(error_file: str) -> str:
    """The exception line a worker's @record error file holds, or '' if there is none."""
    try:
        data = json.loads(Path(error_file).read_text(encoding="utf-8"))
        message = data["message"]
        return str(message["message"] if isinstance(message, dict) else message).strip()
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def parse_entry(rank: str, code: str, error_file: str, traceback: str | None) -> Failure:
    """One entry of torchrun's table: the exception from its error file, else from its traceback line."""
    exit_code, line = int(code), (traceback or "").strip()
    signal = m.group(1) if (m := re.match(r"Signal \d+ \((\w+)\)", line)) else ""
    exception = error_file_exception(error_file) if error_file != "<N/A>" else ""
    if not exception and not signal and not line.startswith(("To enable traceback", "Traceback")):
        exception = line
    return Failure(int(rank), exit_code, exception, signal)


def parse_table(log: str) -> list[Failure]:
    """Fallback: the failures in torchrun's printed summary, the root cause first."""
    if "Root Cause" not in log:
        return []
    failures_part, root_part = log.rsplit("Root Cause", 1)
    failures_part = failures_part.rsplit("Failures:", 1)[-1]
    root = [parse_entry(*m) for m in ENTRY_RE.findall(root_part)]
    others = [parse_entry(*m) for m in ENTRY_RE.findall(failures_part)]
    return root + [o for o in others if o.rank not in {r.rank for r in root}]


def rank_output(log: str, rank: int) -> list[str]:
    """Every line one rank printed (its '[rank r/W] ' prefixed lines)."""
    return [line for line in log.splitlines() if line.startswith(f"[rank {rank}/")]


def last_exception_line(log: str, rank: int) -> str:
    """Without a recorded exception: the last 'SomethingError: …' line that rank printed."""
    pattern = r"\w+(Error|Exception|Interrupt)\b|what\(\):|Fatal Python error"  # Python, C++ and fatal errors
    hits = [ln for ln in rank_output(log, rank) if re.search(pattern, ln)]
    return hits[-1].split("] ", 1)[-1].strip() if hits else ""


VICTIM_RE = re.compile(r"Connection (closed|reset) by peer|Connection refused|remote worker crash|Broken pipe|"
                       r"remote process exit|ncclRemoteError", re.I)
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")  # how torchrun (or a person) stops the other ranks


# faulthandler's "Extension modules: torch._C, ..." after a crash, or a piece of it (a long line can arrive cut)
MODULE_LIST = re.compile(r"(?=.*\w\.\w)[\s,]*(\w+(\.\w+)*)?(\s*,\s*[\w.]+)+[\s,]*(\(total: \d+\))?|"
                         r"Extension modules:.*|\w+(\.\w+)+,?")


def suspicion(f: Failure) -> int:
    """0: its own exception; 1: crashed (SIGSEGV, ...); 2: SIGKILL; 3: its own exit code; 4: a peer's failure; 5: stopped."""
    if f.exception and not VICTIM_RE.search(f.exception):
        return 0  # also when a signal followed the exception (an abort during shutdown)
    if f.signal == "SIGKILL":
        # from outside (the OOM killer, kill -9, --fail-at), or torchrun's escalation after a SIGTERM was ignored;
        # the latter only follows another rank's failure, which then ranks higher if it left an exception or crashed
        return 2
    if f.signal and f.signal not in STOP_SIGNALS:
        return 1
    if f.signal:
        return 5
    return 4 if f.exception else 3  # no exception and no signal: the rank chose to exit (sys.exit(code))


def culprit_first(found: list[Failure]) -> list[Failure]:
    """The rank most likely to have caused the failure first, then the others; ties keep torchrun's time order."""
    # torchrun's own root cause compares timestamps in whole seconds, so a victim can win a tie
    return sorted(found, key=lambda f: (suspicion(f), f.timestamp))


def last_lines(log: str, n: int = 40) -> str:
    """The last n lines of the captured output, for error messages."""
    return "\n".join(log.splitlines()[-n:])


def find_failures(run_dir: Path, log: str) -> list[Failure]:
    """The run's failures, culprit first: from the agent's record, else from torchrun's table; causes filled in from the log."""
    found = read_records(run_dir / "failures.json")
    found = parse_table(log) if found is None else found
    # a rank killed by SIGKILL raised nothing: an exception line it printed is older (an earlier restart's)
    found = [f if f.exception or f.signal == "SIGKILL" else replace(f, exception=last_exception_line(log, f.rank))
             for f in found]
    return culprit_first(found)


def cause_of(failure: Failure) -> str:
    """The exception line, else the signal, else what is known."""
    if failure.exception:
        return failure.exception
    if failure.signal:
        return f"killed by {failure.signal}"
    return "exited without an exception (sys.exit or os._exit with that code)" if failure.exit_code > 0 else \
        "no exception recorded"


def describe(first: Failure, others: list[Failure]) -> str:
    """'rank r failed with exit code c: <cause>' for the culprit, with what a peer's failure or a timeout means."""
    cause = cause_of(first)
    message = f"rank {first.rank} failed with exit code {first.exit_code}: {cause}"
    if "Timed out" in cause:
        message += " (this rank waited for a peer that never arrived: the hung rank may be another one)"
    elif VICTIM_RE.search(cause) and not others:
        message += (" (its peers exited without failing: a collective that only some ranks call, inside "
                    "`if rank == 0:`?, or a rank that left its loop early)")
    return message


def fate(f: Failure) -> str:
    """What became of a rank after the culprit failed, in a few words."""
    if f.exception and VICTIM_RE.search(f.exception):
        return f"rank {f.rank} lost its connection to a failed peer (a consequence)"
    if "Timed out" in f.exception:
        return f"rank {f.rank} timed out waiting for a peer (a consequence)"
    if f.signal in STOP_SIGNALS:
        return f"rank {f.rank} was stopped by torchrun ({f.signal})"
    if f.exception:
        return f"rank {f.rank} failed too: {f.exception[:120]}"
    return f"rank {f.rank} exited with code {f.exit_code}" + (f" ({f.signal})" if f.signal else "")


def signal_name(number: int) -> str:
    """'SIGTERM' for 15; 'signal 99' for a number this platform does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def failure(rc: int, log: str, run_dir: Path, found: list[Failure] | None = None) -> DistributedRunError:
    """The error for a failed run in a few lines: the culprit and its cause, the others' fate, where the full output is."""
    tail, found = last_lines(log), find_failures(run_dir, log) if found is None else culprit_first(found)
    full = f"every rank's full output and tracebacks: {run_dir / 'console.log'}"
    stopped = re.search(r"SignalException: Process \d+ got signal: (\d+)", log)
    if not found and stopped:  # torchrun's agent itself got a signal: from outside (a scheduler, kill), not a rank
        name = signal_name(int(stopped.group(1)))
        return DistributedRunError(f"torchrun itself was stopped by {name} from outside (a scheduler or a kill) and "
                                   f"stopped its workers; no rank failed\n{full}", exit_code=rc, log_tail=tail,
                                   run_dir=run_dir)
    if not found:
        return DistributedRunError(f"torchrun exited with code {rc} before any rank reported a failure; last output:\n"
                                   f"{last_lines(log, 5)}\n{full}", exit_code=rc, log_tail=tail, run_dir=run_dir)
    first, lines = found[0], [describe(found[0], found[1:])]
    if found[1:]:
        lines.append("then " + "; ".join(map(fate, found[1:])))
    said = [line.split("] ", 1)[-1] for line in rank_output(log, first.rank)]
    said = [w for w in said if w.strip() and not w[0].isspace() and not w.startswith(("Current thread", "Thread 0x"))
            and not MODULE_LIST.fullmatch(w.strip())]
    if said and (first.exit_code < 0 or not first.exception):  # a signal or sys.exit: its last words are the clue
        lines.append(f"rank {first.rank}'s last lines: " + " | ".join(w[:160] for w in said[-2:]))
    return DistributedRunError("\n".join([*lines, full]), ranks=tuple(f.rank for f in found),
                               exit_code=first.exit_code, cause=cause_of(first), log_tail=tail, run_dir=run_dir)
