"""Notebook 08's exercise 5: the learner's FSDP2 script, stopped on 2 gloo ranks, resumed on 3, against one device.

`start_fsdp_exercise` copies templates/my_fsdp.py: examples/train_fsdp.py with the bodies of `build_model`,
`save_checkpoint` and `load_checkpoint` taken out. `check_fsdp_script` runs the learner's file under torchrun with
the probes of probe.py (which write down each fully_shard, dcp.save and dcp.load) for 10 of 20 steps on 2
ranks, resumes it on 3 from the DCP checkpoint, and compares the final weights with
examples/train_fsdp_one_device.py on the same 24 windows a step. It names the first mistake in one sentence: a model
with real weights on every rank before fully_shard, a block without its own fully_shard or a root sharded before its
blocks, a checkpoint written straight into place, not renamed, or without the optimizer's state, a rank that never
saves or loads (DCP is a collective: the others hang, and the probes' short timeout names it), a resume that ends
elsewhere. The run is fp32 on CPUs: the MixedPrecisionPolicy's dtypes are not checked.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from dp_helpers.course.checkers.capstone import Run
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
)
from dp_helpers.tool.i18n import tr
from dp_helpers.tool.launch import DistributedRunError, run_ddp

TEMPLATE = Path(__file__).resolve().parents[1] / "templates" / "my_fsdp.py"  # dp_helpers/course/templates
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"  # the repository's examples/
TEXT = EXAMPLES / "data" / "sonnets.txt"  # the learner's file sits beside the notebook, not beside this text
STEPS, STOP, GLOBAL_BATCH, LAYERS = 20, 10, 24, 2  # 2 ranks x 12 windows, then 3 x 8; the template's 2 blocks
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}  # sharded sums add in another order than one device's


def start_fsdp_exercise(path="my_fsdp.py") -> None:
    """Notebook 08: copy the FSDP2 skeleton to `path` to edit (a file already there is kept: it may be your work)."""
    copy_template(TEMPLATE, Path(path), tr("the FSDP2 skeleton"), tr("write its three functions"), "check_fsdp_script")


@functools.lru_cache(maxsize=1)
def reference() -> dict:
    """examples/train_fsdp_one_device.py's final weights: one process, no process group, the same windows."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "one_device.pt"
        subprocess.run([sys.executable, str(EXAMPLES / "train_fsdp_one_device.py"), "--steps", str(STEPS),
                        "--batch-size", str(GLOBAL_BATCH), "--eval-every", str(STEPS), "--out", str(out)],
                       env={**os.environ, **ON_CPU, "OMP_NUM_THREADS": "1"}, capture_output=True, check=True)
        return torch.load(out, weights_only=True)


def launch(path: Path, world_size: int, folder: Path, name: str, *args) -> Run | str:
    """Run the script on world_size gloo ranks under the probes: its Run, or the sentence that says why it failed."""
    run_dir, out = folder / name, folder / f"{name}.pt"
    try:
        run_ddp("dp_helpers.course.checkers.probe", str(path.resolve()), "--steps", STEPS, "--batch-size",
                GLOBAL_BATCH // world_size, "--eval-every", STEPS, "--save-every", STOP, "--sample", 0,
                "--checkpoint", str(folder / "checkpoint"), "--text", str(TEXT), "--out", str(out), *args,
                world_size=world_size,
                backend="gloo", out_dir=run_dir, timeout=LAUNCH_TIMEOUT_S, echo=False,
                env={**ON_CPU, "DP_PROBE_FSDP": "1"})
    except DistributedRunError as exc:
        probes = read_probes(run_dir)
        stopped = Run(None, [], probes)
        unloaded = load_problem(stopped) if name == "resumed" else None  # garbage weights can end a run
        return order_problem(stopped) or dcp_gap(stopped, world_size) or unloaded or \
            failure_sentence(exc, probes, world_size, run_dir)
    weights = torch.load(out, weights_only=True) if out.exists() else None
    return Run(weights, [], read_probes(run_dir), str(out))


def order_problem(run: Run) -> str | None:
    """The root sharded before a block: its call took every parameter not already in a group, the blocks' too."""
    # any rank's record: the first rank to fail stops the others, which may not have reached the block's call yet
    orders = [[c["what"] for c in run.count(rank, "fully_shard")] for rank in run.probes]
    if any("CharLM" in calls and "Block" in calls[calls.index("CharLM"):] for calls in orders):
        return tr("the model itself was sharded before its blocks, so its group took the blocks' parameters too: "
                  "call fully_shard on each Block first, then on the model, last.")
    return None


def dcp_gap(run: Run, world_size: int) -> str | None:
    """A DCP call some ranks made and others did not: the ones inside it wait for the rest."""
    for event in ("dcp.save", "dcp.load"):
        inside = [r for r in range(world_size) if run.count(r, event)]
        if inside and len(inside) < world_size:
            return tr("rank {rank} never called {call} while rank {other} did: DCP is a collective in which every "
                      "rank writes or reads its own shards; call it on every rank, outside `if rank == 0:`.",
                      rank=min(set(range(world_size)) - set(inside)), call=event, other=inside[0])
    return None


def build_problem(run: Run) -> str | None:
    """fully_shard missing, on too few blocks, the root not last, or given a model that already had real weights."""
    calls = run.count(0, "fully_shard")
    if not calls:
        return tr("build_model never called fully_shard: shard each Block of model.blocks, then the model itself.")
    if calls[-1]["what"] != "CharLM" or sum(c["what"] == "Block" for c in calls) != LAYERS:
        return tr("fully_shard was called on {what}: each of the {layers} Blocks needs a call of its own (a group whose "
                  "weights are whole only for its forward and backward), then the model itself, last.",
                  what=", ".join(c["what"] for c in calls), layers=LAYERS)
    if not all(c["meta"] for c in calls):
        return tr("the model had real weights when fully_shard split it, so every rank first held the whole model: "
                  "build it under `with torch.device(\"meta\"):`, shard it, then model.to_empty(device=device).")
    return None


def checkpoint_problem(run: Run, folder: Path, world_size: int) -> str | None:
    """A rank that saved nothing, a save straight into step-N, no rename onto it, or no optimizer state in it."""
    target = folder / "checkpoint" / f"step-{STOP}"
    if not run.count(0, "dcp.save"):
        return tr("nothing was saved with dcp.save: save_checkpoint must call it, on every rank.")
    if dcp_gap(run, world_size):
        return dcp_gap(run, world_size)
    if Path(run.count(0, "dcp.save")[0]["id"]) == target:
        return tr("dcp.save wrote straight into {path}: a run killed mid-save leaves a folder that looks whole; save "
                  "into {path}.tmp, then rank 0 renames it with os.replace.", path=target)
    if not target.is_dir():
        return tr("after {steps} steps there is no {path}: rank 0 must rename the folder dcp.save wrote onto it "
                  "(os.replace).", steps=STOP, path=target)
    return optimizer_problem(target)


def optimizer_problem(target: Path) -> str | None:
    """A DCP checkpoint that holds no Adam moments: a resume would start AdamW's state from zero."""
    from torch.distributed.checkpoint import FileSystemReader

    names = FileSystemReader(str(target)).read_metadata().state_dict_metadata
    if not any("exp_avg" in name for name in names):
        return tr("the checkpoint holds no optimizer state (no exp_avg in {path}): save both halves of "
                  "get_state_dict(model, optimizer), or AdamW's moments start again from zero on resume.", path=target)
    return None


def load_problem(run: Run) -> str | None:
    """A resume whose rank 0 read no checkpoint: its weights are whatever to_empty left."""
    if not run.count(0, "dcp.load"):
        return tr("on resume rank 0 never called dcp.load: every rank reads the pieces of its own shards, whatever "
                  "the world size that wrote them.")
    return None


def resume_problem(run: Run, ref: dict, world_size: int) -> str | None:
    """A rank that loaded nothing, no final weights, or final weights that differ from one device's."""
    if load_problem(run):
        return load_problem(run)
    if dcp_gap(run, world_size):
        return dcp_gap(run, world_size)
    if run.weights is None:
        return tr("resumed on {world_size} ranks, nothing was saved at --out: keep main()'s save_full_weights.",
                  world_size=world_size)
    gap = max((run.weights[k] - ref[k]).abs().max().item() for k in ref)
    if not all(torch.allclose(run.weights[k], ref[k], **TOLERANCE) for k in ref):
        return tr("stopped after {stop} steps on 2 ranks and resumed on {world_size}, the weights differ from one "
                  "device by up to {gap:.3g}: does load_checkpoint fill the model's and the optimizer's shards "
                  "(get_state_dict, dcp.load, set_state_dict)?", stop=STOP, world_size=world_size, gap=gap)
    return None


def check_fsdp_script(path="my_fsdp.py") -> Verdict:
    """Notebook 08's exercise 5: the learner's FSDP2 script stopped on 2 ranks, resumed on 3, against one device."""
    path = Path(path)
    early = file_problem(path, TEMPLATE, tr("the FSDP2 skeleton"))
    if early:
        return verdict(False, early)
    folder = log_folder("fsdp_script")
    problem = launched_problem(path, folder)
    if problem:
        return verdict(False, problem)
    discard(folder)
    return verdict(True, tr("stopped after {stop} of {steps} steps on 2 ranks and resumed on 3, your script ends with "
                            "the weights of one device on the same {batch} windows a step: each block, then the "
                            "root, sharded on the meta device, and every rank saving and loading its own shards with "
                            "DCP, renamed into place.", stop=STOP, steps=STEPS, batch=GLOBAL_BATCH))


def launched_problem(path: Path, folder: Path) -> str | None:
    """Stop on 2 ranks, check the model and the checkpoint, resume on 3, compare: the first problem, or None."""
    ref = reference()
    first = launch(path, 2, folder, "stopped", "--stop-after", STOP)
    if isinstance(first, str):
        return first
    problem = build_problem(first) or checkpoint_problem(first, folder, 2)
    if problem:
        return problem
    resumed = launch(path, 3, folder, "resumed")
    return resumed if isinstance(resumed, str) else resume_problem(resumed, ref, 3)
