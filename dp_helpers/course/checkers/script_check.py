"""Checkers that run a learner's code on real gloo processes and answer in one sentence (notebooks 00, 04, 08).

Notebook 00: the learner turns the one-device loop `scripts/one_device_loop.py` into a DDP script; the
checker launches it under torchrun with probes (`probe.py`, beside this file), compares the saved weights and the
printed losses with the one-device loop run in this process on the global batch, and names the first
mistake it finds (no process group, no DDP, no DistributedSampler, no set_epoch, a collective only some
ranks call, saving or printing on every rank, a division too many). Notebooks 04 and 08: the learner fills
in a skeleton (course/templates/), which my_ddp_check.py and my_zero1_check.py (beside this file) run next to torch's DDP or
one process; and a byte count per rank is predicted, then measured.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import functools
import io
import json
import re
import runpy
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dp_helpers.course.checkers.exercises import Verdict, _unanswered, difference, verdict
from dp_helpers.course.checkers.probe import COLLECTIVES, group_timeout_s
from dp_helpers.tool.env import worker_numerics
from dp_helpers.tool.i18n import language, tr, tr_later
from dp_helpers.tool.launch import DistributedRunError, RunTimeoutError, run_ddp, run_json
from dp_helpers.tool.launch.diagnose import VICTIM_RE

PACKAGE = Path(__file__).resolve().parents[2]  # dp_helpers
TEMPLATE = PACKAGE / "scripts" / "one_device_loop.py"
CHINESE_TEMPLATES = PACKAGE / "course" / "templates" / "zh-CN"  # the same code, comments in Chinese
GLOBAL_BATCH = 48  # the template's 960 samples make 20 full steps an epoch on 1, 2 and 3 ranks (24 and 16 each)
EPOCHS, LR = 4, 0.05  # the template's defaults
LAUNCH_TIMEOUT_S = 90
ON_CPU = {"CUDA_VISIBLE_DEVICES": ""}  # the exercises run on gloo CPU ranks, also on a machine with GPUs
EPOCH_LINE = re.compile(r"epoch\D*(\d+).*?loss\D*?(-?\d+\.\d+(?:e-?\d+)?)", re.I)


_FOLDERS: dict[str, Path] = {}  # this process's latest folder per exercise: a failed run's logs, kept to read


def log_folder(name: str) -> Path:
    """A new folder of this caller's own for an exercise's launches (the previous one for it removed; all at exit)."""
    if not _FOLDERS:
        atexit.register(lambda: [discard(folder) for folder in list(_FOLDERS.values())])
    discard(_FOLDERS.get(name))
    _FOLDERS[name] = Path(tempfile.mkdtemp(prefix=f"dp-course-{name}-"))  # private: two kernels never share one
    return _FOLDERS[name]


def discard(folder: Path | None) -> None:
    """Remove a check's folder once nothing in it is worth reading (its runs passed)."""
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


@dataclass
class Outcome:
    """What one run left: the saved weights, the epoch losses rank 0 printed, who printed them, the probes."""

    weights: dict | None
    losses: list[str]
    printers: list[int] = field(default_factory=list)
    probes: dict[int, list[dict]] = field(default_factory=dict)


def start_ddp_exercise(path="my_ddp.py") -> None:
    """Notebook 00: copy the one-device loop to `path` to edit (a file already there is kept: it may be your work)."""
    copy_template(TEMPLATE, Path(path), tr("the one-device loop"), tr("turn it into DDP"), "check_ddp_script")


def copy_template(template: Path, path: Path, what: str, task: str, checker: str) -> None:
    """Copy an exercise's starting file to path unless one is there already, and say what to do next (what, task: tr())."""
    if not path.exists():
        shutil.copyfile(in_language(template), path)
    if same_as_template(path, template):
        print(tr("{path}: {what}, ready to edit. Open it in the editor, {task}, then run {checker}({path!r}).",
                 path=str(path), what=what, task=task, checker=checker))
    else:
        print(tr("{path}: your file, kept. Open it in the editor, {task}, then run {checker}({path!r}).",
                 path=str(path), task=task, checker=checker))


def in_language(template: Path) -> Path:
    """The starting file in the checkers' language: the Chinese edition's learner gets Chinese comments."""
    chinese = CHINESE_TEMPLATES / template.name
    return chinese if language() == "zh-CN" and chinese.exists() else template


def same_as_template(path: Path, template: Path = TEMPLATE) -> bool:
    """Whether the file is still the untouched starting file (in either language)."""
    text = path.read_text(encoding="utf-8")
    return any(text == t.read_text(encoding="utf-8") for t in (template, CHINESE_TEMPLATES / template.name) if t.exists())


def epoch_losses(lines: list[str]) -> list[str]:
    """The loss of each 'epoch N ... loss X' line, in order, as printed."""
    return [m.group(2) for m in map(EPOCH_LINE.search, lines) if m]


def same_loss(printed: str, exact: str) -> bool:
    """Whether a printed loss is the exact one, to float32's tolerance or to the digits printed (':.4f' rounds)."""
    places = len(printed.split("e")[0].split(".")[1]) if "." in printed else 0
    return abs(float(printed) - float(exact)) <= max(2e-6 + 1e-5 * abs(float(exact)), 0.5 * 10 ** -places)


@functools.lru_cache(maxsize=4)
def one_device(lr: float | None = None) -> Outcome:
    """The template itself, run in this process on the global batch (lr: another learning rate)."""
    with tempfile.TemporaryDirectory() as folder, worker_numerics(), contextlib.redirect_stdout(io.StringIO()) as out:
        argv, sys.argv = sys.argv, [str(TEMPLATE), "--batch-size", str(GLOBAL_BATCH), "--out", f"{folder}/w.pt",
                                    *(["--lr", str(lr)] if lr else [])]
        try:
            runpy.run_path(str(TEMPLATE), run_name="__main__")
        finally:
            sys.argv = argv
        weights = torch.load(f"{folder}/w.pt", weights_only=True)
    return Outcome(weights, epoch_losses(out.getvalue().splitlines()))


def read_probes(run_dir: Path) -> dict[int, list[dict]]:
    """Every rank's probe records, by rank."""
    files = sorted((run_dir / "probe").glob("rank*.jsonl"))
    return {int(f.stem[4:]): [json.loads(line) for line in f.read_text().splitlines() if line.strip()] for f in files}


def launch(path: Path, world_size: int, folder: Path) -> Outcome | str:
    """Run the learner's script on world_size ranks: its Outcome, or the sentence that says why it failed."""
    run_dir, out = folder / f"w{world_size}", folder / f"weights_w{world_size}.pt"
    try:
        result = run_ddp("dp_helpers.course.checkers.probe", str(path.resolve()), "--batch-size", GLOBAL_BATCH // world_size,
                         "--out", str(out), world_size=world_size, backend="gloo", out_dir=run_dir,
                         timeout=LAUNCH_TIMEOUT_S, echo=False, env=ON_CPU)
    except DistributedRunError as exc:  # RunTimeoutError too
        return failure_sentence(exc, read_probes(run_dir), world_size, run_dir)
    lines = [line.split("] ", 1) for line in result.log.splitlines() if line.startswith("[rank ")]
    printed = [(int(head.split()[1].split("/")[0]), text) for head, text in lines if EPOCH_LINE.search(text)]
    weights = torch.load(out, weights_only=True) if out.exists() else None
    return Outcome(weights, epoch_losses([t for r, t in printed if r == 0]), sorted({r for r, _ in printed}),
                   read_probes(run_dir))


# exceptions whose usual cause in these exercises is one known slip (the hints are English templates: tr(words))
ERROR_HINTS = {
    "'NoneType' object has no attribute 'wait'":
        tr_later("dist.all_reduce returns a work handle only with async_op=True (without it, it blocks and returns None)"),
    "Boolean value of Tensor with more than one value is ambiguous":
        tr_later("`param in a_list` compares tensors by value; use a set, or compare ids"),
    "NotImplementedError": tr_later("a method of the skeleton still raises NotImplementedError: write its body"),
}
# what message_problem looks for in a failure sentence, in the language it was written in: how the note on the logs
# begins, and the word of the sentences about a rank left waiting
LOGS_OPENING, WAITED = tr_later("(every rank's output"), tr_later("waited")


def failure_sentence(exc: DistributedRunError, probes: dict, world_size: int, run_dir: Path,
                     timeout_s: float = LAUNCH_TIMEOUT_S) -> str:
    """A failed launch in one sentence: the failing rank's own exception, a group that never formed, or a collective only some ranks made."""
    logs = tr("(every rank's output: {path})", path=run_dir / "console.log")
    cause = (exc.cause or str(exc)).strip().splitlines()[-1]
    setup = group_problem(cause, logs)
    if setup:
        return setup
    if own_error(exc, cause, probes):
        hint = next((tr(": {hint}", hint=tr(words)) for text, words in ERROR_HINTS.items() if text in cause), "")
        return tr("on {world_size} ranks, rank {rank} raised {cause}{line}{hint} {logs}.", world_size=world_size,
                  rank=exc.ranks[0], cause=cause, line=your_line(full_log(exc, run_dir), exc.ranks[0]), hint=hint,
                  logs=logs)
    mismatch = collective_mismatch(probes)
    if mismatch:
        return mismatch
    if isinstance(exc, RunTimeoutError):
        return tr("on {world_size} ranks your code ran past {timeout_s:g} s and was stopped: every rank kept waiting. "
                  "A receive that no rank's send meets (a blocking recv before any send?), or a loop that never ends? "
                  "{logs}.", world_size=world_size, timeout_s=timeout_s, logs=logs)
    left = sorted(r for r, events in probes.items() if any(e["event"] == "end" for e in events))
    if left and ("reset by peer" in cause or "closed by peer" in cause):
        needing = [r for r in range(world_size) if r not in left]
        return tr("rank(s) {left} finished while rank(s) {needing} still needed them: every rank must run every "
                  "step, since DDP's backward is a collective, as is every all_reduce {logs}.", left=left,
                  needing=needing, logs=logs)
    if "timed out" in cause.lower() and exc.ranks:
        waiting, others = exc.ranks[0], [r for r in range(world_size) if r != exc.ranks[0]]
        return tr("rank {rank} waited {timeout_s:g} s in a collective that rank(s) {others} never reached: a hang; is "
                  "a rank stuck in a loop, or busy with work the others skip? {logs}", rank=waiting,
                  timeout_s=group_timeout_s(), others=others, logs=logs)
    return tr("on {world_size} ranks your script failed: {cause} {logs}.", world_size=world_size, cause=cause,
              logs=logs)


def group_problem(cause: str, logs: str) -> str | None:
    """A launch that failed while the ranks formed their group or chose their shards, in one sentence (or None)."""
    if "DistNetworkError" in cause or "connect to" in cause or "address already in use" in cause.lower():
        return tr("the process group never formed ({cause}): under torchrun call dist.init_process_group(backend) "
                  "with no address, port or init_method; torchrun picks a free port and gives it to every rank {logs}.", cause=cause,
                  logs=logs)
    if "Invalid rank" in cause:
        return tr("{cause}: a DistributedSampler (or a group) built for another world size; leave num_replicas and "
                  "rank out, they default to the process group's {logs}.", cause=cause, logs=logs)
    return None


def full_log(exc: DistributedRunError, run_dir: Path) -> str:
    """Every line the run printed (console.log), else what the error kept."""
    path = Path(exc.run_dir or run_dir) / "console.log"
    return path.read_text(encoding="utf-8") if path.is_file() else f"{exc}\n{exc.log_tail}"


def own_error(exc: DistributedRunError, cause: str, probes: dict) -> bool:
    """Whether the first failing rank raised an exception of its own, not one from waiting for a peer that left."""
    # what a rank reports when a peer went away or never came (the launcher's list) or timed out: never the cause
    if not exc.ranks or isinstance(exc, RunTimeoutError) or VICTIM_RE.search(cause) or \
            any(words in cause.lower() for words in ("timed out", "timeout")):
        return False
    calls = [e for e in probes.get(exc.ranks[0], []) if e["event"] in COLLECTIVES]
    return not (calls and calls[-1].get("phase") == "start")  # it failed inside a collective: its peers are the story


def your_line(log: str, rank: int) -> str:
    """', in <file>, line N': rank's last traceback frame in the learner's own code (not torch's, not ours), or ''."""
    package = str(PACKAGE)
    own = [line for line in log.splitlines() if line.startswith(f"[rank {rank}/")]
    frames = [(f, n) for f, n in re.findall(r'File "([^"]+)", line (\d+)', "\n".join(own))
              if not f.startswith(("<", package)) and "site-packages" not in f and "/lib/python" not in f]
    return tr(", in {file}, line {line}", file=Path(frames[-1][0]).name, line=frames[-1][1]) if frames else ""


def collective_mismatch(probes: dict[int, list[dict]]) -> str | None:
    """The first collective that not every rank made, in words, or None."""
    calls = {r: [e["event"] for e in events if e.get("phase") == "start" and e["event"] in COLLECTIVES]
             for r, events in sorted(probes.items())}
    finished = {r for r, events in probes.items() if any(e["event"] == "end" for e in events)}
    for i in range(max(map(len, calls.values()), default=0)):
        names = {r: c[i] if i < len(c) else None for r, c in calls.items()}
        if len(set(names.values())) > 1:
            made = next(r for r, n in names.items() if n)
            missing = [r for r, n in names.items() if n is None]
            other = next((tr("rank {rank} called {name}", rank=r, name=n) for r, n in names.items()
                          if n not in (None, names[made])), None)
            if other:
                return tr("rank {rank} called {name} (its collective number {number}) where {other}: every rank must "
                          "make the same collectives in the same order.", rank=made, name=names[made], number=i + 1,
                          other=other)
            if set(missing) <= finished:
                return tr("rank {rank} called {name} (its collective number {number}), and rank(s) {missing} finished "
                          "without calling it: is it inside `if rank == 0:`? Every rank must call it.", rank=made,
                          name=names[made], number=i + 1, missing=missing)
            return tr("rank {rank} waited in {name} (its collective number {number}) for rank(s) {missing}, which had "
                      "not called it when the run failed: is it inside `if rank == 0:`, or is a rank stuck or slow?",
                      rank=made, name=names[made], number=i + 1, missing=missing)
    return None


def events(outcome: Outcome, rank: int, name: str) -> list[dict]:
    """One rank's records of one kind (a call's entry, not its exit)."""
    return [e for e in outcome.probes.get(rank, []) if e["event"] == name and e.get("phase") != "done"]


def setup_problem(outcome: Outcome, world_size: int) -> str | None:
    """A missing piece of the DDP recipe (process group, DDP, DistributedSampler, set_epoch), or None."""
    if not events(outcome, 0, "init_process_group"):
        return tr("no process group: call dist.init_process_group() first; without it each process trains alone.")
    if not any(e.get("what") == "ddp" for e in events(outcome, 0, "__init__")):
        return tr("the model is never wrapped in DistributedDataParallel: nothing averages the gradients across ranks.")
    for rank in range(world_size):
        built = events(outcome, rank, "sampler")
        if not built:
            return tr("no DistributedSampler: every rank iterates all 960 samples; give the DataLoader "
                      "sampler=DistributedSampler(dataset) so that each rank gets its own share.")
        s = built[-1]
        if (s["num_replicas"], s["rank"]) != (world_size, rank):
            return tr("rank {rank}'s DistributedSampler has num_replicas={num_replicas}, rank={its_rank}; it needs "
                      "{world_size} and {rank} (leave them out: they default to the process group's).", rank=rank,
                      num_replicas=s["num_replicas"], its_rank=s["rank"], world_size=world_size)
        if not s["shuffle"] or s["seed"] != 0:
            return tr("the DistributedSampler has shuffle={shuffle}, seed={seed}: the one-device loop shuffles with "
                      "seed 0 + epoch, which is DistributedSampler's default (shuffle=True, seed=0).",
                      shuffle=s["shuffle"], seed=s["seed"])
    epochs = [e["epoch"] for e in events(outcome, 0, "__iter__")]
    if epochs != list(range(EPOCHS)):
        return tr("the sampler's epochs were {epochs}, not {expected}: call sampler.set_epoch(epoch) at the start of "
                  "every epoch, or every epoch shuffles alike.", epochs=epochs, expected=list(range(EPOCHS)))
    return None


def output_problem(outcome: Outcome) -> str | None:
    """Something wrong with what the ranks saved or printed, or None."""
    savers = sorted(r for r in outcome.probes if events(outcome, r, "save"))
    if savers and savers != [0]:
        return tr("rank {rank} saved too: only rank 0 may write the file (put torch.save under `if rank == 0:`).",
                  rank=savers[-1])
    if outcome.weights is None:
        return tr("nothing was saved at --out: rank 0 must torch.save the model's weights there.")
    if any(k.startswith("module.") for k in outcome.weights):
        return tr("the saved names start with 'module.' (the DDP wrapper's): save model.module.state_dict().")
    if outcome.printers != [0]:
        return (tr("ranks {ranks} print the epoch loss: print on rank 0 only.", ranks=outcome.printers)
                if outcome.printers else
                tr("rank 0 prints no 'epoch N loss X' line: keep the one-device loop's print, on rank 0."))
    return None


def same(a: dict, b: dict) -> bool:
    """Equal weights, to float32's tolerance."""
    try:
        torch.testing.assert_close(a, b)
    except AssertionError:
        return False
    return True


def result_problem(outcome: Outcome, reference: Outcome, world_size: int) -> str | None:
    """Weights or losses that differ from the one-device loop's on the global batch, with the likely cause."""
    if not same(outcome.weights, reference.weights):
        batches = {e["batch_size"] for e in events(outcome, 0, "__init__") if e.get("what") == "loader"}
        if batches and batches != {GLOBAL_BATCH // world_size}:
            return tr("rank 0's DataLoader takes batches of {batches}, and the checker passed --batch-size "
                      "{batch_size}: --batch-size is already the batch of one process, use it as it is.",
                      batches=sorted(batches), batch_size=GLOBAL_BATCH // world_size)
        if same(outcome.weights, one_device(LR / world_size).weights):
            return tr("the gradients come out {world_size}x too small: DDP already averages them over the ranks, "
                      "so the loss must not be divided by world_size again.", world_size=world_size)
        if same(outcome.weights, one_device(LR * world_size).weights):
            return tr("the steps come out {world_size}x too large: the gradients are summed over the ranks, or the "
                      "learning rate is multiplied by world_size; DDP averages, and this exercise keeps the one-device "
                      "learning rate (scaling it with the batch is a choice notebook 06 discusses, not part of DDP).",
                      world_size=world_size)
        gap = max((outcome.weights[k] - reference.weights[k]).abs().max().item() for k in reference.weights)
        return tr("on {world_size} ranks the weights differ from one device on the global batch of {batch} by up to "
                  "{gap:.3g}: does every rank build the same dataset (seeded alike), call optimizer.zero_grad() every "
                  "step, and keep the loop's model, loss and learning rate?", world_size=world_size,
                  batch=GLOBAL_BATCH, gap=gap)
    if len(outcome.losses) != EPOCHS:
        return tr("rank 0 printed {lines} lines like 'epoch N ... loss X', and the checker reads one per epoch "
                  "({epochs}): keep the one-device loop's print once an epoch; other lines must not contain both "
                  "words.", lines=len(outcome.losses), epochs=EPOCHS)
    if not all(map(same_loss, outcome.losses, reference.losses)):
        return tr("rank 0 printed losses {printed}, one device prints {expected}: all-reduce the sum of the losses "
                  "and the number of samples before dividing (rank 0 alone saw only its share).",
                  printed=", ".join(outcome.losses), expected=", ".join(reference.losses))
    return None


def file_problem(path: Path, template: Path, untouched: str) -> str | None:
    """Why the learner's file cannot run yet (missing, untouched, a syntax error), before anything is launched."""
    if not path.exists():
        return tr("there is no {path} yet: run the cell above this one first.", path=path)
    if not path.is_file():
        return tr("{path} is a folder: give the path of your .py file.", path=path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return tr("{path} is not UTF-8 text: save it as a Python file in UTF-8.", path=path)
    if same_as_template(path, template):
        return tr("{path} is still {untouched}: edit it, save it, run this again.", path=path, untouched=untouched)
    try:
        compile(text, str(path), "exec")
    except SyntaxError as exc:
        return tr("{path}, line {line}: {error}.", path=path, line=exc.lineno, error=exc.msg)
    left = [name for name in unwritten(text) if name in unwritten(template.read_text(encoding="utf-8"))]
    if left:  # the launch would only end in this NotImplementedError, seconds later
        return tr("{path}: {names} still raise NotImplementedError, as in the skeleton: write their bodies, then run "
                  "this again.", path=path, names=", ".join(left))
    return None


def unwritten(text: str) -> list[str]:
    """The functions and methods whose whole body, a docstring aside, is `raise NotImplementedError`, in order."""
    stubs = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body[1:] if ast.get_docstring(node) is not None else node.body
            if len(body) == 1 and isinstance(body[0], ast.Raise) and "NotImplementedError" in ast.unparse(body[0]):
                stubs.append((node.lineno, node.name))
    return [name for _, name in sorted(stubs)]


def check_ddp_script(path="my_ddp.py") -> Verdict:
    """Notebook 00: the learner's DDP script on 2 and 3 gloo ranks against the one-device loop on the global batch."""
    path = Path(path)
    early = file_problem(path, TEMPLATE, tr("the one-device loop"))
    if early:
        return verdict(False, early)
    reference, folder = one_device(), log_folder("ddp_script")
    for world_size in (2, 3):
        outcome = launch(path, world_size, folder)
        problem = outcome if isinstance(outcome, str) else (
            setup_problem(outcome, world_size) or output_problem(outcome)
            or result_problem(outcome, reference, world_size))
        if problem:
            return verdict(False, problem)
    discard(folder)
    tip = "" if "gc.collect" in path.read_text(encoding="utf-8") else tr(
        " At home, free the DDP model before destroy_process_group() (del, gc.collect(): examples/train_ddp.py); "
        "the checker's runs skip the interpreter's exit, where gloo can otherwise abort.")
    return verdict(True, tr("on 2 and 3 ranks your script ends with the weights and prints the losses of one device "
                            "on the global batch of {batch}; rank 0 alone saved and printed.{tip}", batch=GLOBAL_BATCH,
                            tip=tip))


CORE_TEMPLATE = PACKAGE / "course" / "templates" / "my_ddp_core.py"
CORE_CAP = 4000  # bytes: the 32-wide MLP's 7 gradients (the largest 4,096 bytes) fall into 3 buckets


def start_my_ddp_exercise(path="my_ddp_core.py") -> None:
    """Notebook 04: copy the MyDDP skeleton to `path` to edit (a file already there is kept: it may be your work)."""
    copy_template(CORE_TEMPLATE, Path(path), tr("the MyDDP skeleton"), tr("write ready() and launch()"),
                  "check_my_ddp")


def bucket_problem(step: dict, buckets: int, where: str, overlap: bool = True) -> str | None:
    """Buckets launched too few, too often, out of order, only after the backward or waited for inside it, or None."""
    kinds = [e["kind"] for e in step["events"]]
    launched = launched_buckets(step)
    if not launched_each_once(step, buckets):
        return tr("{where}, the buckets launched were {launched} of {expected}: launch(k) must run once per bucket, as "
                  "soon as all of bucket k's gradients are ready (and those of the buckets before it).", where=where,
                  launched=launched, expected=list(range(buckets)))
    if launched != sorted(launched):
        return tr("{where}, the buckets were launched in the order {launched}: launch them by index, 0 first, a full "
                  "bucket waiting for the ones before it; two ranks whose gradients arrive in another order would "
                  "otherwise all-reduce different buckets together.", where=where, launched=launched)
    last_ready = len(kinds) - 1 - kinds[::-1].index("ready")
    if not overlap:  # a model whose first bucket fills last: every launch waits for it, rightly
        return None
    if kinds.index("launch") > last_ready:
        return tr("{where}, every all-reduce started after the last gradient was ready: launch a bucket inside "
                  "ready(), as soon as it is full, so that it travels while the backward computes the rest.",
                  where=where)
    if "wait" in kinds and kinds.index("wait") < last_ready:
        return tr("{where}, an all-reduce was waited for while the backward still produced gradients: then the "
                  "backward stalls on every bucket; wait only in finish(), once the backward is done.", where=where)
    return None


def launched_buckets(step: dict) -> list[int]:
    """The bucket indices a recorded step launched, in order."""
    return [e["arg"] for e in step["events"] if e["kind"] == "launch"]


def launched_each_once(step: dict, buckets: int) -> bool:
    """Whether the step launched every one of the buckets exactly once (in any order)."""
    return sorted(launched_buckets(step)) == list(range(buckets))


def gradient_problem(step: dict, world_size: int, where: str) -> str | None:
    """Averaged gradients that differ from DDP's, with the likely cause, or None."""
    if abs(step["ratio"] - world_size) < 0.05 * world_size:
        return tr("{where}, your gradients are {world_size}x DDP's: the all-reduce sums, so divide each bucket by "
                  "the world size.", where=where, world_size=world_size)
    if abs(step["ratio"] - 1 / world_size) < 0.05 / world_size:
        return tr("{where}, your gradients are 1/{world_size} of DDP's: they are divided by the world size twice.",
                  where=where, world_size=world_size)
    if step["gap"] > 1e-5:
        return tr("{where}, your gradients differ from DDP's by up to {gap:.3g}.", where=where, gap=step["gap"])
    return None


SKELETON_TIMEOUT_S = 45  # a right answer takes 5-20 s on 2 busy cores; a loop that never ends is stopped sooner


def records(exercise: str, path: Path, world_size: int, *args) -> list[dict] | str:
    """Run <exercise>_check.py (beside this file) with the learner's file on world_size gloo ranks: each rank's record."""
    run_dir = log_folder(f"{exercise}_w{world_size}") / "run"
    try:
        ranks = run_json(f"dp_helpers.course.checkers.{exercise}_check", exercise, "--module", str(path.resolve()), *args,
                         world_size=world_size, backend="gloo", out_dir=run_dir, timeout=SKELETON_TIMEOUT_S,
                         env={**ON_CPU, "DP_PG_TIMEOUT": str(group_timeout_s())})  # a hang fails in seconds
    except DistributedRunError as exc:
        return failure_sentence(exc, {}, world_size, run_dir, SKELETON_TIMEOUT_S)
    discard(run_dir.parent)  # it ran: the records are read, and the logs hold nothing to diagnose
    return ranks


def skeleton_problem(exercise: str, path: Path, template: Path, untouched: str, world_sizes: tuple[int, ...], judge,
                     failed=lambda sentence, world_size: sentence) -> str | None:
    """The learner's file refused before a launch, or run on each world size in turn and judged: the first problem, or None."""
    early = file_problem(path, template, untouched)
    if early:
        return early
    for world_size in world_sizes:
        ranks = records(exercise, path, world_size)
        if isinstance(ranks, str):  # the run failed: the sentence says so
            return failed(ranks, world_size)
        problem = judge(ranks)
        if problem:
            return tr("on {world_size} ranks, {problem}", world_size=world_size, problem=problem)
    return None


def check_my_ddp(path="my_ddp_core.py") -> Verdict:
    """Notebook 04: the learner's MyDDP on 2 gloo ranks against torch's DDP: buckets, their order, the gradients."""
    path = Path(path)
    early = file_problem(path, CORE_TEMPLATE, tr("the MyDDP skeleton"))
    if early:
        return verdict(False, early)
    ranks = records("my_ddp", path, 2, "--cap", CORE_CAP)
    if isinstance(ranks, str):
        return verdict(False, ranks)
    for rank, record in enumerate(ranks):
        for s, step in enumerate(record["steps"], start=1):
            where = tr("on rank {rank}, step {step}", rank=rank, step=s)
            problem = bucket_problem(step, record["buckets"], where) or gradient_problem(step, len(ranks), where)
            if problem:
                return verdict(False, problem)
        if record["weight_gap"] > 1e-5:
            return verdict(False, tr("on rank {rank} the weights end {gap:.3g} away from DDP's.", rank=rank,
                                     gap=record["weight_gap"]))
        late = record["reordered"]  # bucket 1 fills before bucket 0: one hook must then launch both, in order
        where = tr("on rank {rank}, with a model whose layers run in the reverse order of their registration",
                   rank=rank)
        problem = bucket_problem(late["steps"][0], late["buckets"], where, overlap=False) or \
            gradient_problem(late["steps"][0], len(ranks), where)
        if problem and not launched_each_once(late["steps"][0], late["buckets"]):  # bucket_problem's first sentence
            return verdict(False, tr("{problem} (one ready() may have to launch several buckets: a loop)",
                                     problem=problem))
        if problem:
            return verdict(False, problem)
    return verdict(True, tr("on 2 ranks, {steps} steps: {buckets} buckets launched in order during the backward, "
                            "gradients and weights equal to torch's DistributedDataParallel, also for a model whose "
                            "layers run in the reverse order of their registration.", steps=len(ranks[0]["steps"]),
                            buckets=ranks[0]["buckets"]))


ZERO1_TEMPLATE = PACKAGE / "course" / "templates" / "my_zero1.py"


def start_my_zero1_exercise(path="my_zero1.py") -> None:
    """Notebook 08: copy the MyZero1 skeleton to `path` to edit (a file already there is kept: it may be your work)."""
    copy_template(ZERO1_TEMPLATE, Path(path), tr("the MyZero1 skeleton"), tr("write step()"), "check_my_zero1")


def zero1_calls_problem(step: int, names: list[str], chunk: int) -> str | None:
    """A ZeRO-1 step that all-reduced, or lacked the reduce-scatter or the all-gather, in words, or None."""
    if "all_reduce" in names:
        return tr("step {step} all-reduced the whole gradient: then every rank holds all of it; reduce-scatter it, so "
                  "that each rank receives only its chunk of {chunk} values.", step=step, chunk=chunk)
    if any(n.startswith("reduce_scatter") for n in names) and any(n.startswith("all_gather") for n in names):
        return None
    if not names:
        return tr("step {step} called no collective: ZeRO-1 needs one reduce-scatter and one all-gather.", step=step)
    return tr("step {step} called {names}: ZeRO-1 needs one reduce-scatter and one all-gather.", step=step,
              names=names)


def zero1_problem(ranks: list[dict]) -> str | None:
    """What a ZeRO-1 run did wrong (the collectives, the state kept, the ranks' weights, the result), or None."""
    world_size, numel = len(ranks), ranks[0]["numel"]
    chunk = -(-numel // world_size)
    for s, calls in enumerate((st["calls"] for st in ranks[0]["steps"]), start=1):
        problem = zero1_calls_problem(s, [c["name"] for c in calls], chunk)
        if problem:
            return problem
    kept = [r["state"] for r in ranks]
    if any(k > chunk for k in kept):
        return tr("the ranks keep {kept} values of optimizer state: each needs only its chunk, {chunk}.", kept=kept,
                  chunk=chunk)
    if any(r["weights"] != ranks[0]["weights"] for r in ranks[1:]):
        return tr("the ranks' weights differ after training: all-gather every rank's updated chunk into the "
                  "parameters.")
    for s, st in enumerate(ranks[0]["steps"], start=1):
        if st["gap"] > 1e-5:
            if st["gap_if_summed"] <= 1e-5:
                return tr("step {step} used the sum of the ranks' gradients: divide the reduce-scattered chunk by "
                          "world_size.", step=s)
            if st.get("gap_if_divided_twice", 1.0) <= 1e-5:
                return tr("step {step} divided the gradient by world_size twice: once, after the reduce-scatter, is "
                          "enough.", step=s)
            return tr("after step {step} the weights differ from one process on the global batch by {gap:.3g}: does "
                      "each rank reduce-scatter the gradients (not the parameters), update exactly its own chunk "
                      "(rank * chunk to (rank + 1) * chunk) with velocity = momentum * velocity + gradient (torch's "
                      "SGD: no dampening), and write the all-gathered values back into the parameters?", step=s,
                      gap=st["gap"])
    return None


def check_my_zero1(path="my_zero1.py") -> Verdict:
    """Notebook 08: the learner's ZeRO-1 step on 2 and 3 gloo ranks against one process with the global batch."""
    problem = skeleton_problem("my_zero1", Path(path), ZERO1_TEMPLATE, tr("the MyZero1 skeleton"), (2, 3),
                               zero1_problem)
    if problem:
        return verdict(False, problem)
    return verdict(True, tr("on 2 and 3 ranks: one reduce-scatter and one all-gather a step, 1/world_size of the "
                            "momentum on each rank, and the weights of one process on the global batch."))


@functools.lru_cache(maxsize=8)
def measured_bytes(stage: int, world_size: int, width: int, depth: int) -> tuple:
    """The bytes rank 0 holds after a ZeRO-`stage` step, measured on real ranks (once per setting: a re-check is instant)."""
    folder = log_folder("memory")
    ranks = run_json("sharded", "memory", "--experiment", "memory", "--strategies", f"ZeRO-{stage}", "--width", width,
                     "--depth", depth, "--steps", 2, world_size=world_size, backend="gloo", timeout=LAUNCH_TIMEOUT_S,
                     out_dir=folder / "run", env=ON_CPU)
    discard(folder)
    return tuple(ranks[0][f"ZeRO-{stage}"]["held"].items())


def too_high_or_low(prediction, measured: dict) -> str:
    """': too high' or ': too low' for the first predicted number that differs from the measured one, else ''."""
    for key, want in measured.items():
        got = prediction.get(key) if isinstance(prediction, dict) else None
        if isinstance(got, (int, float)) and not isinstance(got, bool) and got != want:
            return tr(": too high") if got > want else tr(": too low")
    return ""


def check_memory_prediction(prediction: dict, stage: int = 2, world_size: int = 3, width: int = 64,
                            depth: int = 2) -> Verdict:
    """Notebook 08: the bytes a rank holds under ZeRO-`stage` with fp32 Adam, predicted, then measured on real ranks."""
    if _unanswered(prediction):
        return verdict(False, tr("replace each ... with your prediction in bytes, then run the cell again."))
    if stage not in (1, 2, 3) or isinstance(stage, bool):
        return verdict(False, tr("stage must be 1, 2 or 3 (the ZeRO stages), not {stage!r}.", stage=stage))
    for name, value, low in (("world_size", world_size, 1), ("width", width, 1), ("depth", depth, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= (8 if name == "world_size" else 4096):
            return verdict(False, tr("{name} must be a whole number from {low} to {high}, not {value!r}.", name=name,
                                     low=low, high=8 if name == "world_size" else 4096, value=value))
    measured = dict(measured_bytes(stage, world_size, width, depth))
    problem = difference(prediction, measured, tr("your prediction"))
    if problem:  # the measured bytes stay unsaid: they would be the answer
        return verdict(False, tr("{problem}{direction}, as measured on rank 0 of {world_size}. Mind the padding of the "
                                 "flat buffer to a multiple of the world size, and Adam's 4-byte step counter.",
                                 problem=problem, direction=too_high_or_low(prediction, measured),
                                 world_size=world_size))
    return verdict(True, tr("measured on {world_size} gloo ranks, rank 0 holds exactly what you predicted: {measured}.",
                            world_size=world_size, measured=measured))


ALL_GATHER_TEMPLATE = PACKAGE / "course" / "templates" / "my_all_gather.py"
POINT_TO_POINT = ("send", "recv", "isend", "irecv")


def start_my_all_gather_exercise(path="my_all_gather.py") -> None:
    """Notebook 03: copy the ring_all_gather skeleton to `path` to edit (a file already there is kept: it may be your work)."""
    copy_template(ALL_GATHER_TEMPLATE, Path(path), tr("the ring_all_gather skeleton"), tr("write its loop"),
                  "check_my_all_gather")


def all_gather_problem(ranks: list[list[dict]]) -> str | None:
    """What a ring all-gather did wrong (collectives, peers, the result, the bytes) on some rank and case, or None."""
    world_size = len(ranks)
    for rank, cases in enumerate(ranks):
        right, left = (rank + 1) % world_size, (rank - 1) % world_size
        for case in cases:
            where = tr("rank {rank}, a {dtype} tensor of shape {shape}", rank=rank,
                       dtype=case["dtype"].replace("torch.", ""), shape=tuple(case["shape"]))
            problem = peer_problem(case["calls"], rank, right, left) or piece_problem(case, world_size)
            if problem:
                return tr("{where}: {problem}", where=where, problem=problem)
            if case["bytes"] > (world_size - 1) * case["mine"]:
                return tr("{where}: it sent {sent} bytes where {pieces} pieces of {mine} are enough: send each piece on "
                          "once, the one that arrived last.", where=where, sent=case["bytes"], pieces=world_size - 1,
                          mine=case["mine"])
    return None


def peer_problem(calls: list[dict], rank: int, right: int, left: int) -> str | None:
    """A collective used, or a message sent or received beyond the two neighbours, in words, or None."""
    collectives = sorted({c["name"] for c in calls if c["name"] not in POINT_TO_POINT})
    if collectives:
        return tr("your code called dist.{name}: build the all-gather from isend/irecv (or send/recv) only.",
                  name=collectives[0])
    sent_to = sorted({c["peer"] for c in calls if "send" in c["name"]} - {right})
    heard = sorted({c["peer"] for c in calls if "recv" in c["name"]} - {left})
    if sent_to:
        return tr("it sent to rank {peer}: in the ring rank {rank} sends to its right neighbour {right} only and "
                  "receives from its left neighbour {left} only.", peer=sent_to[0], rank=rank, right=right, left=left)
    if heard:
        return tr("it received from rank {peer}: in the ring rank {rank} sends to its right neighbour {right} only and "
                  "receives from its left neighbour {left} only.", peer=heard[0], rank=rank, right=right, left=left)
    return None


def piece_problem(case: dict, world_size: int) -> str | None:
    """A result of the wrong shape, or pieces missing or out of place, in words, or None."""
    want = [world_size * case["shape"][0], *case["shape"][1:]]
    if case["result_shape"] != want:
        return tr("the result has shape {shape}, where dist.all_gather's concatenation has {want}.",
                  shape=case["result_shape"], want=want)
    if case["whose"] != list(range(world_size)):
        return tr("the result's pieces hold the tensors of ranks {whose} (None: nobody's), where piece k must hold "
                  "rank k's.", whose=case["whose"])
    return None


def message_problem(failure: str, world_size: int) -> str:
    """A failed ring all-gather's sentence, with what hangs and aborts mean for messages."""
    logs = failure[failure.rfind(tr(LOGS_OPENING)):]
    if "never waited on" in failure:
        return tr("on {world_size} ranks your ring_all_gather returned without waiting for its messages: dist.isend "
                  "and dist.irecv only start a transfer; call .wait() on each handle they return before you read the "
                  "piece received or send it on {logs}.", world_size=world_size, logs=logs)
    if "waited" in failure or tr(WAITED) in failure or "timed out" in failure:
        return tr("on {world_size} ranks a rank waited {timeout_s:g} s for a message that never came (a hang): if "
                  "every rank first blocks in recv (or send), nobody sends; post the receive and the send together "
                  "(dist.irecv, dist.isend, then wait for both) {logs}.", world_size=world_size,
                  timeout_s=group_timeout_s(), logs=logs)
    if "Aborted" in failure:
        return tr("{failure} A message whose size differs from its receive buffer aborts gloo: send exactly one "
                  "piece, into a piece of the same shape.", failure=failure)
    return failure


def check_my_all_gather(path="my_all_gather.py") -> Verdict:
    """Notebook 03: the learner's ring all-gather on 3 and 4 gloo ranks against dist.all_gather, over five inputs."""
    problem = skeleton_problem("my_all_gather", Path(path), ALL_GATHER_TEMPLATE, tr("the ring_all_gather skeleton"),
                               (3, 4), all_gather_problem, message_problem)
    if problem:
        return verdict(False, problem)
    return verdict(True, tr("on 3 and 4 ranks, five shapes and dtypes: dist.all_gather's result, from messages to the "
                            "right neighbour only, (W - 1) pieces sent by each rank."))


LIVE_MEAN_TEMPLATE = PACKAGE / "course" / "templates" / "my_live_mean.py"


def start_my_live_mean_exercise(path="my_live_mean.py") -> None:
    """Copy the live_mean skeleton to `path` to edit (a file already there is kept: it may be your work)."""
    copy_template(LIVE_MEAN_TEMPLATE, Path(path), tr("the live_mean skeleton"), tr("write its body"),
                  "check_my_live_mean")


def live_mean_problem(ranks: list[list[dict]]) -> str | None:
    """What a survivors' average did wrong on some rank and case (its count, a dead rank's values, the divisor), or None."""
    from dp_helpers.course.checkers.my_live_mean_check import grads_of

    world_size = len(ranks)
    for rank, cases in enumerate(ranks):
        for case in cases:
            dtype, dead = getattr(torch, case["dtype"].removeprefix("torch.")), case["dead"]
            live = [r for r in range(world_size) if r not in dead]
            where = tr("with rank(s) {dead} dead, rank {rank}", dead=dead, rank=rank) if dead else \
                tr("with every rank alive, rank {rank}", rank=rank)
            if case["returned"] != len(live):
                return tr("{where} returned {got}, where {live} ranks are alive: return how many are.", where=where,
                          got=case["returned"], live=len(live))
            sums = [sum(gs) for gs in zip(*(grads_of(r, dtype) for r in live), strict=True)]
            problem = mean_problem(case, [s / len(live) for s in sums], rank, dead, world_size, sums, dtype)
            if problem:
                return tr("{where}: {problem}", where=where, problem=problem)
    return None


def mean_problem(case: dict, want: list, rank: int, dead: list, world_size: int, sums: list, dtype) -> str | None:
    """How one rank's gradients differ from the live ranks' mean, named by the usual slip, or None."""
    from dp_helpers.course.checkers.my_live_mean_check import grads_of

    got = [torch.tensor(g, dtype=dtype) for g in case["grads"]]

    def like(values) -> bool:
        """Whether the rank's gradients are these values, to rounding."""
        return all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(got, values, strict=True))

    if like(want):
        return None
    if rank in dead and like(grads_of(rank, dtype)):
        return tr("dead in this case, it kept its own values: it takes the survivors' mean too (a replica that comes "
                  "back heals from it).")
    everyone = [sum(gs) / world_size for gs in zip(*(grads_of(r, dtype) for r in range(world_size)), strict=True)]
    if dead and like(everyone):
        return tr("its gradients became the mean over all {world_size} ranks: a dead replica's values must not count "
                  "(let it send zeros).", world_size=world_size)
    if dead and like([s / world_size for s in sums]):
        return tr("its gradients became the live ranks' sum divided by {world_size}: divide by the number of ranks "
                  "alive, not by the world size.", world_size=world_size)
    return tr("its gradients became {got} where the live ranks' mean is {want}.",
              got=[g.flatten().tolist() for g in got], want=[w.flatten().tolist() for w in want])


def check_my_live_mean(path="my_live_mean.py") -> Verdict:
    """The learner's survivors' average on 3 and 4 gloo ranks, with no rank, one or all but one dead."""
    problem = skeleton_problem("my_live_mean", Path(path), LIVE_MEAN_TEMPLATE, tr("the live_mean skeleton"), (3, 4),
                               live_mean_problem)
    if problem:
        return verdict(False, problem)
    return verdict(True, tr("on 3 and 4 ranks, with no rank, one or all but one dead, in float32 and float64: every rank "
                            "holds the live ranks' mean, and knows how many they are."))
