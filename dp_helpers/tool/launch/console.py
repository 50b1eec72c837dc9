"""Output streaming: every line torchrun and the workers print goes to console.log, worker lines to the screen."""

from __future__ import annotations

import math
import queue
import re
import sys
import threading
import time
from collections import deque

from dp_helpers.tool.files import named_on_failure
from dp_helpers.tool.launch.command import GRACE_S, LaunchPlan
from dp_helpers.tool.launch.diagnose import VICTIM_RE, RunTimeoutError
from dp_helpers.tool.launch.process import ProcessTree
from dp_helpers.tool.metrics import MetricsTail, metrics_dir
from dp_helpers.tool.sampler import plural

TAIL_LINES = 200  # kept in memory for error messages; console.log keeps every line
EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(: |$)")  # "ValueError: boom", "KeyboardInterrupt"; frames are indented
AFTER_TRACEBACK = ("At:", "During handling of the above exception", "The above exception was the direct cause")


class Rejoin:
    """Mends the lines torchrun's tail splits: it prefixes whatever part of a line a rank had written when it read."""

    def __init__(self, world_size: int):
        # a worker's print() writes its text and its newline apart (unbuffered), so torchrun can read "first" alone
        # and later "\n": one line reaches us as "[rank 0/2] first[rank 0/2] \n", possibly with other ranks between
        self.header = re.compile(rf"\[rank \d+/{world_size}\] ")
        self.pending: dict[str, str] = {}

    def __call__(self, raw: str) -> list[str]:
        """The whole lines that one line read from torchrun completes (none while a rank's line is still partial)."""
        starts = [m.start() for m in self.header.finditer(raw)]
        if not starts or starts[0] != 0:
            return [raw]  # torchrun's own chatter
        lines = []
        for begin, end in zip(starts, starts[1:] + [len(raw)], strict=True):
            header = self.header.match(raw, begin).group(0)
            body = self.pending.pop(header, "") + raw[begin + len(header):end]
            if end < len(raw) or not body.endswith("\n"):
                self.pending[header] = body  # cut off by the next rank's header (or the pipe's end): more may come
            else:
                lines.append(header + body)
        return lines

    def rest(self) -> list[str]:
        """Lines a rank never ended (its last print had end='')."""
        rest = [header + body + "\n" for header, body in self.pending.items()]
        self.pending.clear()
        return rest


def pump(stream, lines: queue.Queue) -> None:
    """Reader thread: push each output line (bytes -> str, '\\r' kept) onto the queue, then None at EOF."""
    for raw in iter(stream.readline, b""):
        lines.put(raw.decode("utf-8", errors="replace"))
    lines.put(None)


class Progress:
    """Steps done: a bar on a terminal or in a notebook; elsewhere (a CI log, a pipe) one line per quarter."""

    def __init__(self, total: int, world_size: int):
        self.total, self.done, self.quarter = total, 0, 1
        self.bar = None
        if sys.stderr.isatty() or "ipykernel" in sys.modules:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=f"starting {plural(world_size, 'process', 'processes')}", unit="step", leave=True)
        else:
            print(f"starting {plural(world_size, 'process', 'processes')} for {total} steps", file=sys.stderr, flush=True)

    def update(self, n: int) -> None:
        """n more steps done."""
        if n and not self.done and self.bar is not None:
            self.bar.set_description("train")  # the first step: start-up is over
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        reached = min(4, self.done * 4 // self.total)  # quarters done
        if self.bar is None and reached >= self.quarter:
            print(f"train: {25 * reached}% ({self.done}/{self.total} steps)", file=sys.stderr, flush=True)
            self.quarter = reached + 1

    def write(self, text: str) -> None:
        """A line above the bar (or just a line)."""
        if self.bar is not None:
            self.bar.write(text, file=sys.stdout)
        else:
            print(text, flush=True)

    def close(self) -> None:
        """Leave the bar where it got to."""
        if self.bar is not None:
            self.bar.close()


class Console:
    """Writes every line to <run>/console.log, echoes worker lines, and reports progress by following rank 0's metrics."""

    def __init__(self, plan: LaunchPlan, echo: bool | str):
        self.echo, self.tail, self.folding, self.shown_lines = echo, deque(maxlen=TAIL_LINES), {}, 0
        self.rejoin = Rejoin(plan.world_size)
        self.path = plan.run_dir / "console.log"
        self.file = self.path.open("w", encoding="utf-8")
        self.metrics = MetricsTail(metrics_dir(plan.run_dir) / "rank0.jsonl")
        self.bar = Progress(plan.progress, plan.world_size) if plan.progress else None

    def line(self, raw: str) -> None:
        """One line read from torchrun: the whole lines it completes are logged and shown."""
        for text in self.rejoin(raw):
            self.whole(text)

    def whole(self, text: str) -> None:
        """Log every line; show worker lines (torchrun's own chatter stays in the log)."""
        with named_on_failure(self.path):
            self.file.write(text)
        self.tail.append(text)
        if self.echo and text.startswith("[rank ") and (self.echo == "all" or self.shown(text)):
            text = text.rstrip("\n") if self.echo == "all" else consequence(text.rstrip("\n"))
            self.shown_lines += 1
            if self.bar is not None:
                self.bar.write(text)
            else:
                print(text, flush=True)

    def shown(self, text: str) -> bool:
        """Whether a worker line is echoed: of a traceback only its exception line (console.log keeps every line)."""
        prefix, _, body = text.rstrip("\n").partition("] ")
        state = self.folding.get(prefix)
        if body.startswith("Traceback (most recent call last):"):
            self.folding[prefix] = "traceback"
            return False
        if state == "traceback":
            if not body.strip() or body[0].isspace():  # a frame, its code line, or a blank line
                return False
            # the traceback's last line (what was raised), or a line of the rank's own that ends a cut-off traceback
            self.folding[prefix] = "after" if EXCEPTION_LINE.match(body) else None
            return True
        if state == "after" and (not body.strip() or body[0].isspace() or body.startswith(AFTER_TRACEBACK)):
            return False  # gloo's "At:" frames, a chained exception's sentence
        self.folding.pop(prefix, None)
        return True

    def tick(self) -> None:
        """Advance the bar by the steps rank 0 finished since the last tick; flush the log."""
        with named_on_failure(self.path):
            self.file.flush()
        if self.bar is not None:
            self.bar.update(self.metrics.new_lines())

    def close(self) -> None:
        """Final tick, then close the bar and the log."""
        try:
            for text in self.rejoin.rest():
                self.whole(text)
            self.tick()
        finally:  # a full disk: the file is closed all the same, and the error names it
            if self.bar is not None:
                self.bar.close()
            with named_on_failure(self.path):
                self.file.close()

    def last(self) -> str:
        """The most recent lines (for error messages)."""
        return "".join(self.tail)


def consequence(text: str) -> str:
    """A worker's line as echoed: an error caused by a peer that went away, shortened and named as a consequence."""
    prefix, _, body = text.partition("] ")
    found = VICTIM_RE.search(body) if EXCEPTION_LINE.match(body) else None
    if not found:
        return text
    return f"{prefix}] {body.split(':', 1)[0]}: … {found.group(0)} (a consequence: a peer went away; console.log has it all)"


def start_reader(stdout) -> tuple[threading.Thread, queue.Queue]:
    """A daemon thread that reads the pipe line by line into a queue."""
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=pump, args=(stdout, lines), daemon=True)
    reader.start()
    return reader, lines


def drain(reader: threading.Thread, lines: queue.Queue, console: Console, stdout) -> None:
    """After the tree is stopped: wait for EOF, log what is still queued, close the pipe (no descriptor leaks)."""
    reader.join(timeout=GRACE_S)
    if not reader.is_alive():  # closing it under a reader blocked in readline() would block here too
        stdout.close()
    while True:
        try:
            item = lines.get_nowait()
        except queue.Empty:
            break
        if item:
            console.line(item)


def stream(tree: ProcessTree, plan: LaunchPlan, console: Console, lines: queue.Queue) -> None:
    """Forward output until torchrun exits; enforce the deadline; never wait on a pipe orphans still hold."""
    limit = math.inf if plan.timeout is None else plan.timeout
    deadline, exited_at, last_scan = time.monotonic() + limit, None, 0.0
    while True:
        now = time.monotonic()
        if now - last_scan > 0.5:
            tree.remember()
            console.tick()
            last_scan = now
        try:
            item = lines.get(timeout=0.1)
        except queue.Empty:
            item = ""
        if item is None:
            break
        if item:
            console.line(item)
        if exited_at is None and tree.proc.poll() is not None:
            exited_at = now
        if exited_at is not None and now - exited_at > GRACE_S:
            break  # orphaned workers still hold the pipe; the tree kill deals with them
        if now > deadline:
            raise RunTimeoutError(f"run exceeded timeout={plan.timeout:g}s and was stopped.", run_dir=plan.run_dir)
