"""examples/: what a take-home script cannot run, it refuses in one sentence of its own.

A bad argument or --text is refused before anything starts (before the torchrun check: these tests
run the scripts bare); a checkpoint that cannot be loaded is named with what is wrong with it; a
loss that turns NaN or inf stops the run with the rank named; a resume with nothing left to train says so
and exits 0. A checkpoint goes to a temporary file of the writing process's own, synced, renamed;
a failed save leaves no temporary file behind.
"""

import os
import re
import runpy
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from tests.conftest import REPO

EXAMPLES = REPO / "examples"
FRAME = f'File "{EXAMPLES}'  # a traceback through one of the scripts has a frame in it
WHOLE, FINITE = "is not a whole number >= 1", "is not a finite number > 0"
NO_FOLDER = ["--out", "missing/model.pt"], "argument --out: there is no folder"

REFUSED = {  # script: [(its arguments, what stderr's last line says after "<script>: error: ")]
    "train_one_device.py": [
        (["--batch-size", "0"], f"argument --batch-size: '0' {WHOLE}"),
        (["--lr", "nan"], f"argument --lr: 'nan' {FINITE}"),
        NO_FOLDER,
    ],
    "train_ddp.py": [
        (["--epochs", "-2"], f"argument --epochs: '-2' {WHOLE}"),
        (["--batch-size", "0"], f"argument --batch-size: '0' {WHOLE}"),
        (["--lr", "inf"], f"argument --lr: 'inf' {FINITE}"),
        (["--timeout", "0"], f"argument --timeout: '0' {FINITE}"),
        NO_FOLDER,
    ],
    "train_ddp_real.py": [
        (["--grad-accum-steps", "0"], f"argument --grad-accum-steps: '0' {WHOLE}"),
        (["--grad-accum-steps", "-1"], f"argument --grad-accum-steps: '-1' {WHOLE}"),
        (["--lr", "nan"], f"argument --lr: 'nan' {FINITE}"),
        (["--max-grad-norm", "nan"], f"argument --max-grad-norm: 'nan' {FINITE}"),
        (["--batch-size", "0"], f"argument --batch-size: '0' {WHOLE}"),
        (["--stop-after", "0"], f"argument --stop-after: '0' {WHOLE}"),
        (["--checkpoint", "."], "argument --checkpoint: . is a folder, not a file name"),
        NO_FOLDER,
    ],
    "train_fsdp.py": [
        (["--grad-accum-steps", "0"], f"argument --grad-accum-steps: '0' {WHOLE}"),
        (["--lr", "nan"], f"argument --lr: 'nan' {FINITE}"),
        (["--max-grad-norm", "-1"], f"argument --max-grad-norm: '-1' {FINITE}"),
        (["--batch-size", "0"], f"argument --batch-size: '0' {WHOLE}"),
        (["--save-every", "0"], f"argument --save-every: '0' {WHOLE}"),
        (["--dim", "30"], "argument --dim: 30 is not a multiple of the model's 4 heads"),
        (["--checkpoint", "a_file"], "argument --checkpoint: a_file is a file, not a folder"),
        NO_FOLDER,
    ],
    "train_fsdp_one_device.py": [
        (["--steps", "0"], f"argument --steps: '0' {WHOLE}"),
        (["--lr", "nan"], f"argument --lr: 'nan' {FINITE}"),
        (["--dim", "6"], "argument --dim: 6 is not a multiple of the model's 4 heads"),
    ],
    "checkpoint_async.py": [
        (["--steps", "0"], f"argument --steps: '0' {WHOLE}"),
        (["--batch-size", "0"], f"argument --batch-size: '0' {WHOLE}"),
        (["--slow-disk", "nan"], "argument --slow-disk: 'nan' is not a finite number >= 0"),
        (["--timeout", "0"], "argument --timeout: must be more than 0 seconds"),
        (["--checkpoint", "a_file"], "argument --checkpoint: a_file is a file, not a folder"),
        NO_FOLDER,
    ],
    "train_elastic.py": [
        (["--global-batch-size", "0"], f"argument --global-batch-size: '0' {WHOLE}"),
        (["--lr", "nan"], f"argument --lr: 'nan' {FINITE}"),
        (["--step-seconds", "-1"], "argument --step-seconds: -1.0 is not a finite number >= 0"),
        (["--checkpoint", "missing/e.pt"], "argument --checkpoint: there is no folder"),
    ],
}
CASES = [(name, args, said) for name, cases in REFUSED.items() for args, said in cases]


def run_bare(monkeypatch, tmp_path, name: str, *args: str) -> SystemExit:
    """Run an example in this process as `python name args` would (no torchrun); how it exited."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LOCAL_RANK", raising=False)  # a check after the torchrun one is not reached
    monkeypatch.syspath_prepend(str(EXAMPLES))  # train_fsdp_one_device.py imports train_fsdp.py
    monkeypatch.setattr(sys, "argv", [name, *args])
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(EXAMPLES / name), run_name="__main__")
    return stop.value


@pytest.mark.parametrize(("name", "args", "said"), CASES,
                         ids=[f"{name} {' '.join(args)}" for name, args, _ in CASES])
def test_a_bad_argument_is_refused_in_one_line_before_anything_starts(name, args, said, tmp_path,
                                                                       monkeypatch, capsys):
    (tmp_path / "a_file").touch()
    stop = run_bare(monkeypatch, tmp_path, name, *args)
    last = capsys.readouterr().err.splitlines()[-1]  # argparse prints its usage, then the one line
    assert stop.code == 2 and last.startswith(f"{name}: error: {said}"), last


@pytest.mark.parametrize(("text", "said"), [
    (None, "cannot read --text the.txt as UTF-8 text: [Errno 2] No such file or directory"),
    ("ab", "--text the.txt has 2 characters: too few, its first 90% and the rest must each hold "
           "more than --context 64"),
    (b"\x80 not UTF-8", "cannot read --text the.txt as UTF-8 text: 'utf-8' codec can't decode"),
])
@pytest.mark.parametrize("name", ["train_fsdp.py", "train_fsdp_one_device.py"])
def test_a_text_it_cannot_learn_from_is_refused_before_anything_starts(name, text, said, tmp_path,
                                                                       monkeypatch):
    if isinstance(text, str):
        (tmp_path / "the.txt").write_text(text, encoding="utf-8")
    elif text is not None:
        (tmp_path / "the.txt").write_bytes(text)
    stop = run_bare(monkeypatch, tmp_path, name, "--text", "the.txt")
    assert str(stop.code).startswith(said) and "\n" not in str(stop.code), stop.code


@pytest.mark.parametrize(("name", "args", "said"), [
    ("train_one_device.py", ["--lr", "1e30"], "loss is nan at step 2 of epoch 1: lower --lr?"),
    ("train_fsdp_one_device.py", ["--lr", "1e30", "--steps", "5"],
     "loss is nan at step 2: lower --lr?"),
])
def test_on_one_device_a_loss_that_turns_nan_stops_the_run(name, args, said, tmp_path, monkeypatch,
                                                           capsys):
    stop = run_bare(monkeypatch, tmp_path, name, *args)
    assert stop.code == 1 and capsys.readouterr().err.splitlines()[-1] == said
    assert not list(tmp_path.glob("*.pt"))  # and nothing saved


@pytest.mark.slow  # a process: python itself, not torchrun
def test_a_bad_argument_on_the_command_line_exits_2_with_one_line_and_no_traceback(tmp_path):
    command = [sys.executable, str(EXAMPLES / "train_ddp_real.py"), "--grad-accum-steps", "0"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr and not done.stdout
    assert done.stderr.splitlines()[-1] == \
        "train_ddp_real.py: error: argument --grad-accum-steps: '0' is not a whole number >= 1"


# --- checkpoints read and written: the scripts' functions, with a stand-in for torch.distributed


def stand_in_dist() -> SimpleNamespace:
    """What the checkpoint functions ask of torch.distributed: one process, no process group."""
    return SimpleNamespace(get_rank=lambda: 0, get_world_size=lambda: 1, barrier=lambda: None,
                           gather_object=lambda obj, out, dst: out.__setitem__(0, obj),
                           broadcast_object_list=lambda objects, src: None)


def real_job(monkeypatch):
    """train_ddp_real.py's functions; a model with a .module, as DDP has; optimizer; scaler."""
    job = runpy.run_path(str(EXAMPLES / "train_ddp_real.py"))
    monkeypatch.setitem(job["save_checkpoint"].__globals__, "dist", stand_in_dist())
    model = SimpleNamespace(module=job["make_model"](0))
    optimizer = torch.optim.SGD(model.module.parameters(), lr=0.05, momentum=0.9)
    return job, model, optimizer, torch.amp.GradScaler("cpu", enabled=False)


def test_the_real_job_names_what_is_wrong_with_a_checkpoint_it_cannot_load(tmp_path, monkeypatch):
    job, model, optimizer, scaler = real_job(monkeypatch)
    job["save_checkpoint"](str(tmp_path / "good.pt"), model, optimizer, scaler, 2, 0)
    whole = (tmp_path / "good.pt").read_bytes()
    (tmp_path / "empty.pt").write_bytes(b"")
    (tmp_path / "cut.pt").write_bytes(whole[:len(whole) // 2])
    torch.save(model.module.state_dict(), tmp_path / "weights.pt")  # an --out file
    other = torch.load(tmp_path / "good.pt", weights_only=True)
    other["model"] = torch.nn.Linear(20, 1).state_dict()
    torch.save(other, tmp_path / "other.pt")
    unreadable = "is empty, cut short or not torch.save's."
    said = {"empty.pt": unreadable, "cut.pt": unreadable,
            "weights.pt": "is not a checkpoint of this script (KeyError: 'model').",
            "other.pt": "is another model's, optimizer's or --precision's."}
    cpu = torch.device("cpu")
    for name, sentence in said.items():
        with pytest.raises(SystemExit) as stop:
            job["load_checkpoint"](str(tmp_path / name), model, optimizer, scaler, 0, cpu)
        assert stop.value.code == f"[rank 0] cannot resume: {tmp_path / name} {sentence}"
    assert job["load_checkpoint"](str(tmp_path / "good.pt"), model, optimizer, scaler, 0, cpu) == 2
    faster = torch.optim.SGD(model.module.parameters(), lr=0.5, momentum=0.9)  # --lr 0.5 on resume
    with pytest.raises(SystemExit) as stop:
        job["load_checkpoint"](str(tmp_path / "good.pt"), model, faster, scaler, 0, cpu)
    assert stop.value.code == (f"[rank 0] cannot resume: {tmp_path / 'good.pt'} was trained with --lr 0.05; resume "
                               "with it, or start a new --checkpoint.")


def writes(monkeypatch) -> list[tuple]:
    """From here on, each os.fsync (the path synced: Linux's /proc) and os.replace, in order."""
    done, fsync, replace = [], os.fsync, os.replace

    def fsynced(fd):
        done.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def replaced(src, dst):
        done.append(("replace", str(src), str(dst)))
        replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsynced)
    monkeypatch.setattr(os, "replace", replaced)
    return done


def failing_rename(monkeypatch) -> None:
    """Make os.replace fail, as a full disk would."""
    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)


linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")


@linux
def test_the_real_job_syncs_a_file_of_its_own_then_renames_it_and_leaves_none_if_it_fails(
        tmp_path, monkeypatch):
    job, model, optimizer, scaler = real_job(monkeypatch)
    folder = tmp_path / "run"
    folder.mkdir()
    done, path = writes(monkeypatch), folder / "ck.pt"
    job["save_checkpoint"](str(path), model, optimizer, scaler, 1, 0)
    tmp = f"{path}.tmp{os.getpid()}"  # this process's own: another run given this path has another
    assert done == [("fsync", tmp), ("replace", tmp, str(path)), ("fsync", str(folder))], done
    failing_rename(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        job["save_checkpoint"](str(path), model, optimizer, scaler, 2, 0)
    assert [p.name for p in folder.iterdir()] == ["ck.pt"]  # the old snapshot, no temporary file
    assert torch.load(path, weights_only=True)["epoch"] == 1


@linux
def test_the_elastic_and_async_scripts_save_the_same_way(tmp_path, monkeypatch):
    elastic = runpy.run_path(str(EXAMPLES / "train_elastic.py"))
    model = SimpleNamespace(module=elastic["make_model"]())
    optimizer = torch.optim.SGD(model.module.parameters(), lr=0.02, momentum=0.9)
    folder = tmp_path / "run"
    folder.mkdir()
    done, path = writes(monkeypatch), folder / "elastic.pt"
    elastic["save"](model, optimizer, 3, path)
    tmp = f"{path}.tmp{os.getpid()}"
    assert done == [("fsync", tmp), ("replace", tmp, str(path)), ("fsync", str(folder))], done

    job = runpy.run_path(str(EXAMPLES / "checkpoint_async.py"))
    args = SimpleNamespace(checkpoint=str(folder / "ck"), mode="rank0", slow_disk=0.0)
    saver = job["Saver"](args, 0)  # the mode where rank 0 writes alone, with torch.save
    model = SimpleNamespace(module=job["make_model"]())
    optimizer = torch.optim.Adam(model.module.parameters(), lr=1e-3)
    done.clear()
    saver.save_on_rank0(model, optimizer, 5)
    tmp, final = folder / "ck" / f"step-5.tmp{os.getpid()}", folder / "ck" / "step-5.pt"
    assert done == [("fsync", str(tmp)), ("replace", str(tmp), str(final)),
                    ("fsync", str(folder / "ck"))], done

    failing_rename(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        elastic["save"](model, optimizer, 4, path)
    with pytest.raises(OSError, match="No space left"):
        saver.save_on_rank0(model, optimizer, 10)
    assert sorted(p.name for p in folder.rglob("*") if p.is_file()) == ["elastic.pt", "step-5.pt"]


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # DCP on one process: fine here
def test_the_fsdp_script_saves_into_a_folder_of_its_own_and_leaves_none_if_it_fails(tmp_path,
                                                                                     monkeypatch):
    fsdp = runpy.run_path(str(EXAMPLES / "train_fsdp.py"))
    save = fsdp["save_checkpoint"]
    monkeypatch.setitem(save.__globals__, "dist", stand_in_dist())
    model = fsdp["CharLM"](10, 8, dim=8, layers=1)  # plain modules: DCP saves them on one process
    optimizer = torch.optim.AdamW(model.parameters())
    replaced, folder = [], tmp_path / "ck"
    monkeypatch.setattr(os, "replace", lambda src, dst: (replaced.append(src), os.rename(src, dst)))
    save(str(folder), model, optimizer, 3, 0)
    save(str(folder), model, optimizer, 6, 0)
    assert replaced == [f"{folder / name}.tmp{os.getpid()}" for name in ("step-3", "step-6")]
    (folder / "step-9.tmp123").mkdir()  # another run's save in progress: not this run's to remove
    monkeypatch.setitem(save.__globals__, "dcp", SimpleNamespace(save=lambda *a, **k: 1 / 0))
    with pytest.raises(ZeroDivisionError):
        save(str(folder), model, optimizer, 9, 0)
    assert sorted(p.name for p in folder.iterdir()) == ["step-6", "step-9.tmp123"]


def test_the_elastic_and_async_scripts_name_what_is_wrong_with_a_checkpoint(tmp_path, monkeypatch):
    elastic = runpy.run_path(str(EXAMPLES / "train_elastic.py"))
    monkeypatch.setitem(elastic["resume"].__globals__, "dist", stand_in_dist())
    model = SimpleNamespace(module=elastic["make_model"]())
    optimizer = torch.optim.SGD(model.module.parameters(), lr=0.02, momentum=0.9)
    (tmp_path / "empty.pt").write_bytes(b"")
    torch.save({"model": model.module.state_dict()}, tmp_path / "half.pt")
    for name, said in (("empty.pt", "EOFError: it ends early"),
                       ("half.pt", "KeyError: 'optimizer'")):
        with pytest.raises(SystemExit) as stop:
            elastic["resume"](model, optimizer, tmp_path / name)
        assert stop.value.code == \
            f"[rank 0] cannot resume from {tmp_path / name}, damaged or not this script's: {said}"

    job = runpy.run_path(str(EXAMPLES / "checkpoint_async.py"))
    monkeypatch.setitem(job["resume"].__globals__, "dist", stand_in_dist())
    model = SimpleNamespace(module=job["make_model"]())
    optimizer = torch.optim.Adam(model.module.parameters(), lr=1e-3)
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "step-5.pt").write_bytes(b"")
    with pytest.raises(SystemExit) as stop:
        job["resume"](model, optimizer, tmp_path / "ck")
    assert stop.value.code == f"[rank 0] cannot resume from {tmp_path / 'ck' / 'step-5.pt'}, " \
                              "damaged or another model's: EOFError: it ends early"


# --- under torchrun: every rank stops at once; a damaged checkpoint; a resume with nothing left


def torchrun(tmp_path, nproc: int, name: str, *args: str) -> subprocess.CompletedProcess:
    """An example under bare torchrun on nproc gloo processes, in tmp_path."""
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", str(nproc), str(EXAMPLES / name), *args], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=180)


def said_alone(done: subprocess.CompletedProcess, sentence: str, ranks: int = 1) -> bool:
    """A failed run whose stderr holds the sentence (from up to `ranks` ranks, each naming itself)
    and torchrun's own traceback, no other (torchrun may stop a rank before it has said it)."""
    said = re.findall(r"^\[rank \d+\] " + re.escape(sentence) + "$", done.stderr, flags=re.M)
    return done.returncode != 0 and 1 <= len(said) <= ranks and \
        done.stderr.count("Traceback") == 1 and FRAME not in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("name", "args", "said"), [
    ("train_ddp.py", [], "loss is nan at step 2 of epoch 1: lower --lr?"),
    ("train_ddp_real.py", [], "loss is nan at step 2 of epoch 1: lower --lr?"),
    ("train_fsdp.py", ["--sample", "0"], "loss is nan at step 2: lower --lr?"),
    ("train_elastic.py", [], "loss is inf at step 2: lower --lr?"),
])
def test_a_loss_that_turns_nan_stops_every_rank_with_the_rank_named(name, args, said, tmp_path):
    # every rank would wait 600 s for a missing peer: one left behind would outlast the 180 s above
    done = torchrun(tmp_path, 2, name, "--lr", "1e30", "--timeout", "600", *args)
    # each rank whose loss turned NaN says it (torchrun may stop one before it has), then torchrun stops all
    assert said_alone(done, said, ranks=2), done.stderr[-3000:]
    assert not (tmp_path / "model.pt").exists()


@pytest.mark.slow
def test_the_real_job_names_a_damaged_checkpoint_and_says_when_nothing_is_left(tmp_path,
                                                                                monkeypatch):
    job, model, optimizer, scaler = real_job(monkeypatch)
    job["save_checkpoint"](str(tmp_path / "done.pt"), model, optimizer, scaler, 3, 0)  # 3 of 3
    whole = (tmp_path / "done.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(whole[:len(whole) // 3])
    cut = torchrun(tmp_path, 1, "train_ddp_real.py", "--epochs", "3", "--checkpoint", "cut.pt")
    assert said_alone(cut, "cannot resume: cut.pt is empty, cut short or not torch.save's.")
    done = torchrun(tmp_path, 1, "train_ddp_real.py", "--epochs", "3", "--checkpoint", "done.pt")
    assert done.returncode == 0 and FRAME not in done.stderr, done.stderr[-3000:]
    assert done.stdout == \
        "nothing left to train: done.pt already holds 3 epochs and --epochs is 3\n"


@pytest.mark.slow
def test_the_fsdp_script_names_a_damaged_dcp_folder_and_says_when_nothing_is_left(tmp_path):
    args = ("--save-every", "2", "--eval-every", "2", "--sample", "0", "--checkpoint", "ck")
    assert torchrun(tmp_path, 2, "train_fsdp.py", "--steps", "2", *args).returncode == 0
    again = torchrun(tmp_path, 2, "train_fsdp.py", "--steps", "2", *args)
    assert again.returncode == 0 and FRAME not in again.stderr, again.stderr[-3000:]
    assert again.stdout.splitlines()[0] == \
        "nothing left to train: ck/step-2 already holds 2 steps and --steps is 2"
    said = "cannot resume from ck/step-2, a damaged DCP checkpoint or another model's: "
    for lost in ("__1_0.distcp", ".metadata"):  # one rank's shards, then the index
        (tmp_path / "ck" / "step-2" / lost).unlink()
        done = torchrun(tmp_path, 2, "train_fsdp.py", "--steps", "4", *args)
        sentence = f"FileNotFoundError: [Errno 2] No such file or directory: 'ck/step-2/{lost}'"
        assert said_alone(done, said + sentence, ranks=2), done.stderr[-3000:]
