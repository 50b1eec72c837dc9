"""The checker of notebook 00's exercise: the learner's DDP script, run on 2 and 3 real gloo processes.

The learner turns the one-device loop `scripts/one_device_loop.py` into a DDP script. The checker
launches it under torchrun with probes (`scripts/probe.py`), compares the saved weights and the printed
losses with the one-device loop run in this process on the global batch, and answers in one sentence:
correct, or the first mistake it can name (no process group, no DDP, no DistributedSampler, no
set_epoch, a collective only some ranks call, saving or printing on every rank, a division too many).
"""

from __future__ import annotations

import contextlib
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

from .env import worker_numerics
from .exercises import Verdict, verdict
from .launch import DistributedRunError, RunTimeoutError, run_ddp
from .scripts.probe import COLLECTIVES, GROUP_TIMEOUT_S

TEMPLATE = Path(__file__).resolve().parent / "scripts" / "one_device_loop.py"
GLOBAL_BATCH = 48  # the template's 960 samples make 20 full steps an epoch on 1, 2 and 3 ranks (24 and 16 each)
EPOCHS = 4
LAUNCH_TIMEOUT_S = 90
EPOCH_LINE = re.compile(r"epoch\D*(\d+).*?loss\D*?(-?\d+\.\d+(?:e-?\d+)?)", re.I)


@dataclass
class Outcome:
    """What one run left: the saved weights, the epoch losses rank 0 printed, who printed them, the probes."""

    weights: dict | None
    losses: list[float]
    printers: list[int] = field(default_factory=list)
    probes: dict[int, list[dict]] = field(default_factory=dict)


def start_ddp_exercise(path="my_ddp.py") -> None:
    """Copy the one-device loop to `path` to edit (a file already there is kept: it may be your work)."""
    path = Path(path)
    if not path.exists():
        shutil.copyfile(TEMPLATE, path)
    print(f"{path}: {'the one-device loop, ready to edit' if same_as_template(path) else 'your script, kept'}. "
          f"Open it in the editor, turn it into DDP, then run check_ddp_script({str(path)!r}).")


def same_as_template(path: Path) -> bool:
    """Whether the file is still the untouched one-device loop."""
    return path.read_text(encoding="utf-8") == TEMPLATE.read_text(encoding="utf-8")


def epoch_losses(lines: list[str]) -> list[float]:
    """The loss of each 'epoch N ... loss X' line, in order."""
    return [float(m.group(2)) for m in map(EPOCH_LINE.search, lines) if m]


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
        result = run_ddp("dp_helpers.scripts.probe", str(path.resolve()), "--batch-size", GLOBAL_BATCH // world_size,
                         "--out", str(out), world_size=world_size, backend="gloo", out_dir=run_dir,
                         timeout=LAUNCH_TIMEOUT_S, echo=False)
    except DistributedRunError as exc:  # RunTimeoutError too
        return failure_sentence(exc, read_probes(run_dir), world_size, run_dir)
    lines = [line.split("] ", 1) for line in result.log.splitlines() if line.startswith("[rank ")]
    printed = [(int(head.split()[1].split("/")[0]), text) for head, text in lines if EPOCH_LINE.search(text)]
    weights = torch.load(out, weights_only=True) if out.exists() else None
    return Outcome(weights, epoch_losses([t for r, t in printed if r == 0]), sorted({r for r, _ in printed}),
                   read_probes(run_dir))


def failure_sentence(exc: DistributedRunError, probes: dict, world_size: int, run_dir: Path) -> str:
    """A failed launch in one sentence: a collective only some ranks made, or the failing rank's exception."""
    mismatch = collective_mismatch(probes)
    if mismatch:
        return mismatch
    logs = f"every rank's output: {run_dir / 'console.log'}"
    if isinstance(exc, RunTimeoutError):
        return f"on {world_size} ranks your script ran past {LAUNCH_TIMEOUT_S} s and was stopped ({logs})."
    cause = (exc.cause or str(exc)).strip().splitlines()[-1]
    if "timed out" in cause.lower() and exc.ranks:
        waiting, others = exc.ranks[0], [r for r in range(world_size) if r != exc.ranks[0]]
        return (f"rank {waiting} waited {GROUP_TIMEOUT_S} s in a collective that rank(s) {others} never reached: a "
                f"hang; is a rank stuck in a loop, or busy with work the others skip? ({logs})")
    return f"on {world_size} ranks your script failed: {cause} ({logs})."


def collective_mismatch(probes: dict[int, list[dict]]) -> str | None:
    """The first collective that not every rank made, in words, or None."""
    calls = {r: [e["event"] for e in events if e.get("phase") == "start" and e["event"] in COLLECTIVES]
             for r, events in sorted(probes.items())}
    for i in range(max(map(len, calls.values()), default=0)):
        names = {r: c[i] if i < len(c) else None for r, c in calls.items()}
        if len(set(names.values())) > 1:
            made = next(r for r, n in names.items() if n)
            others = ", ".join(f"rank {r} {'never called it' if n is None else 'called ' + n}"
                               for r, n in names.items() if n != names[made])
            return (f"rank {made} called {names[made]} (its collective number {i + 1}) and {others}: every rank "
                    "must make the same collectives in the same order; is one inside `if rank == 0:`?")
    return None


def events(outcome: Outcome, rank: int, name: str) -> list[dict]:
    """One rank's records of one kind (a call's entry, not its exit)."""
    return [e for e in outcome.probes.get(rank, []) if e["event"] == name and e.get("phase") != "done"]


def setup_problem(outcome: Outcome, world_size: int) -> str | None:
    """A missing piece of the DDP recipe (process group, DDP, DistributedSampler, set_epoch), or None."""
    if not events(outcome, 0, "init_process_group"):
        return "no process group: call dist.init_process_group() first; without it each process trains alone."
    if not any(e.get("what") == "ddp" for e in events(outcome, 0, "__init__")):
        return "the model is never wrapped in DistributedDataParallel: nothing averages the gradients across ranks."
    for rank in range(world_size):
        built = events(outcome, rank, "sampler")
        if not built:
            return ("no DistributedSampler: every rank iterates all 960 samples; give the DataLoader "
                    "sampler=DistributedSampler(dataset) so that each rank gets its own share.")
        s = built[-1]
        if (s["num_replicas"], s["rank"]) != (world_size, rank):
            return (f"rank {rank}'s DistributedSampler has num_replicas={s['num_replicas']}, rank={s['rank']}; it "
                    f"needs {world_size} and {rank} (leave them out: they default to the process group's).")
        if not s["shuffle"] or s["seed"] != 0:
            return (f"the DistributedSampler has shuffle={s['shuffle']}, seed={s['seed']}: the one-device loop "
                    "shuffles with seed 0 + epoch, which is DistributedSampler's default (shuffle=True, seed=0).")
    epochs = [e["epoch"] for e in events(outcome, 0, "__iter__")]
    if epochs != list(range(EPOCHS)):
        return (f"the sampler's epochs were {epochs}, not {list(range(EPOCHS))}: call sampler.set_epoch(epoch) at "
                "the start of every epoch, or every epoch shuffles alike.")
    return None


def output_problem(outcome: Outcome) -> str | None:
    """Something wrong with what the ranks saved or printed, or None."""
    savers = sorted(r for r in outcome.probes if events(outcome, r, "save"))
    if savers and savers != [0]:
        return f"rank {savers[-1]} saved too: only rank 0 may write the file (put torch.save under `if rank == 0:`)."
    if outcome.weights is None:
        return "nothing was saved at --out: rank 0 must torch.save the model's weights there."
    if any(k.startswith("module.") for k in outcome.weights):
        return "the saved names start with 'module.' (the DDP wrapper's): save model.module.state_dict()."
    if outcome.printers != [0]:
        return (f"ranks {outcome.printers} print the epoch loss: print on rank 0 only." if outcome.printers else
                "rank 0 prints no 'epoch N loss X' line: keep the one-device loop's print, on rank 0.")
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
        lr = 0.05
        if same(outcome.weights, one_device(lr / world_size).weights):
            return (f"the gradients come out {world_size}x too small: DDP already averages them over the ranks, "
                    "so the loss must not be divided by world_size again.")
        if same(outcome.weights, one_device(lr * world_size).weights):
            return f"the gradients come out {world_size}x too large: average them, do not sum them over the ranks."
        gap = max((outcome.weights[k] - reference.weights[k]).abs().max().item() for k in reference.weights)
        return (f"on {world_size} ranks the weights differ from one device on the global batch of {GLOBAL_BATCH} by "
                f"up to {gap:.3g}.")
    if len(outcome.losses) != EPOCHS or any(abs(a - b) > 2e-6 + 1e-5 * abs(b)
                                            for a, b in zip(outcome.losses, reference.losses, strict=False)):
        return (f"rank 0 printed losses {outcome.losses}, one device prints {reference.losses}: all-reduce the sum "
                "of the losses and the number of samples before dividing (rank 0 alone saw only its share).")
    return None


def check_ddp_script(path="my_ddp.py") -> Verdict:
    """Notebook 00: the learner's DDP script on 2 and 3 gloo ranks against the one-device loop on the global batch."""
    path = Path(path)
    if not path.exists():
        return verdict(False, f"there is no {path} yet: run start_ddp_exercise({str(path)!r}) first.")
    if same_as_template(path):
        return verdict(False, f"{path} is still the one-device loop: turn it into DDP, save it, run this again.")
    try:
        compile(path.read_text(encoding="utf-8"), str(path), "exec")
    except SyntaxError as exc:
        return verdict(False, f"{path}, line {exc.lineno}: {exc.msg}.")
    reference, folder = one_device(), Path(tempfile.mkdtemp(prefix="ddp-check-"))  # kept when a run fails: its logs
    for world_size in (2, 3):
        outcome = launch(path, world_size, folder)
        problem = outcome if isinstance(outcome, str) else (
            setup_problem(outcome, world_size) or output_problem(outcome)
            or result_problem(outcome, reference, world_size))
        if problem:
            return verdict(False, problem)
    shutil.rmtree(folder, ignore_errors=True)
    return verdict(True, f"on 2 and 3 ranks your script ends with the weights and prints the losses of one device "
                         f"on the global batch of {GLOBAL_BATCH}; rank 0 alone saved and printed.")
