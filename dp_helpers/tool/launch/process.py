"""Process lifecycle: start a command in its own session, remember its descendants, stop the whole tree."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading

import psutil

from dp_helpers.tool.launch.command import GRACE_S

HELD_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                     if hasattr(signal, name))  # Windows has no SIGHUP


@contextlib.contextmanager
def signals_held():
    """Ctrl-C, SIGTERM and SIGHUP wait while the block runs, so that one more cannot cut short a stop or its record."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread can set handlers
        yield
        return
    caught: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: caught.append(signum)) for sig in HELD_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if caught and sys.exc_info()[1] is None:  # nothing under way: deliver it now; else the first stop goes on
        signal.raise_signal(caught[0])


class ProcessTree:
    """A started process and every descendant seen so far (orphans stay known after their parent died)."""

    # With a marker (DP_LAUNCH_ID in the environment the tree started with), kill() also sweeps the machine
    # for any process that inherited it: workers torchrun was still starting, orphans in other sessions
    # (torchrun gives each worker its own session, so a process-group kill would miss them).

    def __init__(self, proc: subprocess.Popen, marker: str | None = None):
        self.proc, self.seen, self.marker = proc, {}, marker

    def remember(self) -> None:
        """Record the current descendants: once the root is gone they can no longer be found through it."""
        if self.proc.returncode is not None:  # reaped: its pid may already belong to another process
            return
        try:
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                self.seen.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            pass

    def kill(self) -> int:
        """SIGTERM the root and every descendant, SIGKILL what is left after a grace period; returns how many were stopped."""
        self.remember()
        members = list(self.seen.values())
        if self.proc.poll() is None:
            members.append(psutil.Process(self.proc.pid))
        stopped = stop_all(members)
        self.proc.wait()
        return stopped + (self.sweep() if self.marker else 0)

    def sweep(self, passes: int = 20) -> int:
        """SIGKILL every process carrying the marker, pass after pass until a pass finds none; returns how many."""
        stopped = 0
        for _ in range(passes):
            found = marked(self.marker)
            if not found:
                break
            for p in found:
                send(p, signal.SIGKILL)
            psutil.wait_procs(found, timeout=GRACE_S)
            stopped += len(found)
        return stopped


def stop_all(processes: list[psutil.Process]) -> int:
    """SIGTERM the live ones, SIGKILL what is left after a grace period; returns how many were alive."""
    family = list({p.pid: p for p in processes if alive(p)}.values())  # each once
    for p in family:
        send(p, signal.SIGTERM)
    _, left = psutil.wait_procs(family, timeout=GRACE_S)
    for p in left:
        send(p, signal.SIGKILL)
    psutil.wait_procs(left, timeout=GRACE_S)
    return len(family)


def marked(marker: str) -> list[psutil.Process]:
    """Live processes (zombies excluded) whose environment has DP_LAUNCH_ID=marker."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get("DP_LAUNCH_ID") == marker and alive(p):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def alive(p: psutil.Process) -> bool:
    """Running and not a zombie."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def send(p: psutil.Process, sig: int) -> None:
    """Send a signal to a process that may already be gone."""
    try:
        p.send_signal(sig)
    except psutil.NoSuchProcess:
        pass


def kill_session(pgid: int) -> None:
    """SIGKILL a process group that start_new_session created, if anything is left in it."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def start(command: list[str], env: dict[str, str]) -> subprocess.Popen:
    """Start a command in its own session, stdout and stderr merged into one pipe (no pre-exec hook: fork-safe)."""
    return subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)


def run_tree(command: list[str], timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """subprocess.run(capture_output=True, text=True) that stops the whole tree, not only the child, on a timeout or an interrupt."""
    proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    tree = ProcessTree(proc)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise subprocess.TimeoutExpired(command, timeout) from exc
    finally:
        tree.kill()  # on a timeout or KeyboardInterrupt: the child and its descendants
        kill_session(proc.pid)  # what a finished child left behind in its session (unless it left the session)
        for stream in (proc.stdout, proc.stderr):
            stream.close()
    return subprocess.CompletedProcess(command, proc.returncode, out, err)
