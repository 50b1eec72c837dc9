"""Process lifecycle: start a command in its own session, remember its descendants, stop the whole tree."""

from __future__ import annotations

import os
import signal
import subprocess

import psutil

from .command import GRACE_S


class ProcessTree:
    """A started process and every descendant seen so far (orphans stay known after their parent died)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.seen = proc, {}

    def remember(self) -> None:
        """Record the current descendants: once the root is gone they can no longer be found through it."""
        if self.proc.returncode is not None:  # reaped: its pid may already belong to another process
            return
        try:
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                self.seen.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            pass

    def pids(self) -> list[int]:
        """The root's and every remembered descendant's pid."""
        return [self.proc.pid, *self.seen]

    def kill(self) -> int:
        """SIGTERM the root and every descendant, SIGKILL what is left after a grace period; returns how many were stopped."""
        self.remember()
        members = list(self.seen.values())
        if self.proc.poll() is None:
            members.append(psutil.Process(self.proc.pid))
        family = [p for p in members if alive(p)]
        for p in family:
            send(p, signal.SIGTERM)
        _, left = psutil.wait_procs(family, timeout=GRACE_S)
        for p in left:
            send(p, signal.SIGKILL)
        psutil.wait_procs(left, timeout=GRACE_S)
        self.proc.wait()
        return len(family)


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
