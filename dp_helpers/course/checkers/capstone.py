"""Notebook 07's capstone: the learner completes the real-job DDP script, and the checker runs it on real processes.

`start_real_job_exercise` copies templates/my_real_job.py: examples/train_ddp_real.py with the bodies of
`train_step`, `evaluate`, `save_checkpoint` and `load_checkpoint` taken out. `check_real_job` launches the learner's
file under torchrun with the probes of probe.py (plus a count of DDP's gradient all-reduces and of optimizer
steps) on 2 gloo ranks stopped after an epoch, again to resume, and on 3; it compares the weights and the printed
lines with examples/train_ddp_real.py on one process with the global batch, and names the first mistake it finds in
one sentence: an all-reduce per micro-batch (no `no_sync`, or `no_sync` around the backward only), clipping before
unscaling, a checkpoint written by every rank or straight into place, a resume that restarts the epochs or the
optimizer, held-out scores from padded shards, a hang. fp16 runs on GPUs only in these scripts, so clipping
before unscaling is read from the source, not run; the template's model has no dropout, so a lost random state
is not observable here.
"""

from __future__ import annotations

import ast
import functools
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from dp_helpers.course.checkers.exercises import Verdict, verdict
from dp_helpers.course.checkers.script_check import (
    LAUNCH_TIMEOUT_S,
    ON_CPU,
    copy_template,
    discard,
    failure_sentence,
    file_problem,
    log_folder,
    read_probes,
    same,
)
from dp_helpers.tool.i18n import tr
from dp_helpers.tool.launch import DistributedRunError, run_ddp

TEMPLATE = Path(__file__).resolve().parents[1] / "templates" / "my_real_job.py"  # dp_helpers/course/templates
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "train_ddp_real.py"  # the repository's examples/
GLOBAL_BATCH, EPOCHS = 48, 3  # 960 samples: 20 batches an epoch on 2 ranks of 24 and on 3 of 16; 250 held out


@dataclass
class Run:
    """What one launch left: the weights saved at --out (None if none), rank 0's epoch lines, every rank's probes."""

    weights: dict | None
    lines: list[str]
    probes: dict[int, list[dict]]
    out: str = ""

    def count(self, rank: int, event: str, **fields) -> list[dict]:
        """One rank's records of an event (entries, not exits) whose fields match."""
        return [e for e in self.probes.get(rank, []) if e["event"] == event and e.get("phase") != "done"
                and all(e.get(k) == v for k, v in fields.items())]


def start_real_job_exercise(path="my_real_job.py") -> None:
    """Notebook 07: copy the real-job skeleton to `path` to edit (a file already there is kept: it may be your work)."""
    copy_template(TEMPLATE, Path(path), tr("the real-job skeleton"), tr("write its four functions"), "check_real_job")


def epoch_lines(log: str) -> list[str]:
    """Rank 0's 'epoch N/E ...' lines, without the launcher's [rank 0/W] prefix."""
    own = (line.split("] ", 1)[1] for line in log.splitlines() if line.startswith("[rank 0/") and "] " in line)
    return [line.strip() for line in own if line.startswith("epoch ")]


def launch(script, world_size: int, folder: Path, name: str, *args) -> Run | str:
    """Run a script on world_size gloo ranks under the probes: its Run, or the sentence that says why it failed."""
    run_dir, out = folder / name, folder / f"{name}.pt"
    try:
        result = run_ddp("dp_helpers.course.checkers.probe", str(Path(script).resolve()), "--epochs", EPOCHS, "--batch-size",
                         GLOBAL_BATCH // world_size, "--out", str(out), *args, world_size=world_size, backend="gloo",
                         out_dir=run_dir, timeout=LAUNCH_TIMEOUT_S, echo=False,
                         env={**ON_CPU, "DP_PROBE_BUCKETS": "1"})
    except DistributedRunError as exc:
        return failure_sentence(exc, read_probes(run_dir), world_size, run_dir)
    weights = torch.load(out, weights_only=True) if out.exists() else None
    return Run(weights, epoch_lines(result.log), read_probes(run_dir), str(out))


@functools.lru_cache(maxsize=1)
def reference() -> Run:
    """examples/train_ddp_real.py on one process with the global batch: what every run must end with and print."""
    with tempfile.TemporaryDirectory() as folder:
        run = launch(EXAMPLE, 1, Path(folder), "reference")
    if isinstance(run, str):
        raise RuntimeError(f"the reference run failed: {run}")
    return run


def call_lines(tree: ast.AST, name: str) -> list[int]:
    """The lines where a function or method of this name is called."""
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call)
            and getattr(n.func, "attr", getattr(n.func, "id", None)) == name]


def source_problem(text: str) -> str | None:
    """What the source alone shows: clipping the scaled gradients (fp16 runs on GPUs only in these scripts: read, not run)."""
    tree = ast.parse(text)
    clips, unscales = call_lines(tree, "clip_grad_norm_"), call_lines(tree, "unscale_")
    if clips and (not unscales or min(unscales) > min(clips)):
        return tr("clip_grad_norm_ comes before scaler.unscale_(optimizer): with fp16 it would clip the scaled "
                  "gradients, thousands of times too large; call scaler.unscale_(optimizer) first.")
    return None


def sync_problem(run: Run, text: str) -> str | None:
    """More (or fewer) gradient all-reduces than optimizer steps on rank 0: accumulation that syncs wrongly."""
    buckets, steps = len(run.count(0, "bucket")), len(run.count(0, "optimizer_step"))
    if buckets > steps:
        where = tr("no_sync() must wrap the forward as well as the backward: DDP decides in the forward whether the "
                   "backward all-reduces") if call_lines(ast.parse(text), "no_sync") else \
            tr("run every micro-batch but a step's last under model.no_sync()")
        return tr("DDP all-reduced the gradients {buckets} times for {steps} optimizer steps (one bucket each): every "
                  "micro-batch synchronised; {where}.", buckets=buckets, steps=steps, where=where)
    if buckets < steps:
        return tr("DDP all-reduced the gradients {buckets} times for {steps} optimizer steps: a step's last micro-batch "
                  "must run outside no_sync(), or the ranks step on gradients they never averaged.",
                  buckets=buckets, steps=steps)
    return None


def written_files(run: Run, rank: int) -> list[str]:
    """The files a rank torch.saved, --out aside (gather_object torch.saves into a BytesIO: not a file)."""
    return [e["path"] for e in run.count(rank, "save") if e.get("path") != run.out and not str(e["path"]).startswith("<")]


def checkpoint_problem(run: Run, checkpoint: str, world_size: int) -> str | None:
    """A checkpoint written by more than rank 0, not at all, or straight into place instead of renamed."""
    writers = [r for r in range(world_size) if written_files(run, r)]
    if writers and writers != [0]:
        return tr("rank {rank} wrote the checkpoint too: only rank 0 may write it (under `if rank == 0:`), or the "
                  "ranks overwrite each other's file.", rank=writers[-1])
    if not writers:
        return tr("nothing was written at --checkpoint {path}: rank 0 must torch.save the state there after every "
                  "epoch.", path=checkpoint)
    if any(e.get("path") == checkpoint for e in run.count(0, "save")):
        return tr("rank 0 wrote straight into {path}: a run killed mid-write leaves half a file; write a temporary "
                  "file and os.replace it onto {path}.", path=checkpoint)
    if not (run.count(0, "replace", dst=checkpoint) or run.count(0, "rename", dst=checkpoint)):
        return tr("rank 0 never renamed a file onto {path}: write a temporary file, then os.replace(tmp, {path}).",
                  path=checkpoint)
    return None


def resume_problem(run: Run, world_size: int) -> str | None:
    """A resumed run that started the epochs again or left the optimizer's state behind."""
    epochs = [e["epoch"] for e in run.count(0, "__iter__")]
    if epochs[:1] != [1]:
        return tr("stopped after epoch 1, the resumed run trained epochs {epochs}: load_checkpoint must return the "
                  "epoch the checkpoint saved (next_epoch), so that training goes on at epoch 2.",
                  epochs=[e + 1 for e in epochs])
    missing = [r for r in range(world_size) if not run.count(r, "load_state_dict")]
    if missing:
        return tr("on resume rank {rank} never loaded an optimizer state: optimizer.load_state_dict(...) on every "
                  "rank, or SGD's momentum starts again from zero.", rank=missing[0])
    return None


def result_problem(run: Run, ref: Run, world_size: int, resumed: bool) -> str | None:
    """Weights or printed scores that differ from one process on the global batch, with the likely cause."""
    what = tr("stopped after epoch 1 and resumed on {world_size} ranks", world_size=world_size) if resumed else \
        tr("on {world_size} ranks", world_size=world_size)
    if run.weights is None:
        return tr("{what}, nothing was saved at --out: keep main()'s torch.save of the model.", what=what)
    if not same(run.weights, ref.weights):
        gap = max((run.weights[k] - ref.weights[k]).abs().max().item() for k in ref.weights)
        return tr("{what}, the weights differ from one process on the batch of {batch} by up to {gap:.3g}: is each "
                  "loss divided by the group's number of samples, and are the optimizer and scaler restored?",
                  what=what, batch=GLOBAL_BATCH, gap=gap)
    expected = ref.lines[-len(run.lines):] if run.lines else ref.lines
    if [line.split("held-out")[1:] for line in run.lines] != [line.split("held-out")[1:] for line in expected]:
        return tr("{what}, the held-out scores are {got}, one process prints {expected}: score every held-out sample "
                  "once (rank r takes r, r + W, ...; a DistributedSampler pads with repeats) and all-reduce the sums "
                  "and the count.", what=what, got=" | ".join(line.split("  held-out ")[-1] for line in run.lines),
                  expected=" | ".join(line.split("  held-out ")[-1] for line in expected))
    return None


def check_real_job(path="my_real_job.py") -> Verdict:
    """Notebook 07's capstone: the learner's real-job script on 2 ranks (stopped and resumed) and 3, against one."""
    path = Path(path)
    early = file_problem(path, TEMPLATE, tr("the real-job skeleton")) or \
        source_problem(path.read_text(encoding="utf-8"))
    if early:
        return verdict(False, early)
    problem = launched_problem(path, log_folder("real_job"))
    if problem:
        return verdict(False, problem)
    discard(log_folder("real_job"))
    return verdict(True, tr("on 2 ranks (stopped after epoch 1 and resumed) and on 3, your script ends with the "
                            "weights and prints the scores of one process on the global batch of {batch}, with one "
                            "all-reduce per optimizer step and a checkpoint rank 0 alone writes and renames into "
                            "place.", batch=GLOBAL_BATCH))


def launched_problem(path: Path, folder: Path) -> str | None:
    """Run the three launches in turn and return the first problem any of them shows, or None."""
    text, checkpoint, ref = path.read_text(encoding="utf-8"), str(folder / "checkpoint.pt"), reference()
    first = launch(path, 2, folder, "stopped", "--checkpoint", checkpoint, "--stop-after", 1)
    if isinstance(first, str):
        return first
    problem = sync_problem(first, text) or checkpoint_problem(first, checkpoint, 2)
    if problem:
        return problem
    resumed = launch(path, 2, folder, "resumed", "--checkpoint", checkpoint)
    if isinstance(resumed, str):
        return resumed
    problem = resume_problem(resumed, 2) or result_problem(resumed, ref, 2, resumed=True)
    if problem:
        return problem
    three = launch(path, 3, folder, "three")
    return three if isinstance(three, str) else result_problem(three, ref, 3, resumed=False)
