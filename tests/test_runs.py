"""Run folders, atomic writes and the record of a run that did not finish."""

import dataclasses
import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dp_helpers.tool.config import TrainConfig
from dp_helpers.tool.files import remove_partials, write_atomic, write_text_atomic
from dp_helpers.tool.request import UsageError
from dp_helpers.tool.runs import checkpoint_lock, file_stamp, record_ending


def test_a_failed_write_keeps_its_own_error_when_the_clean_up_fails_too(tmp_path, monkeypatch):
    def full_disk(tmp):
        raise OSError(28, "No space left on device")

    def read_only(self, missing_ok=False):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(Path, "unlink", read_only)
    with pytest.raises(OSError, match="the disk is full: ck.pt could not be written"):
        write_atomic(tmp_path / "ck.pt", full_disk)


def ending(run_dir: Path, cfg, before) -> dict:
    """The summary.json record_ending writes for a failed run."""
    run_dir.mkdir()
    record_ending(run_dir, cfg, "rank 1 failed", "failed", before, failed_ranks=[1])
    return json.loads((run_dir / "summary.json").read_text())


def test_a_failed_run_names_only_a_checkpoint_it_wrote_or_resumed_from(tmp_path):
    old = tmp_path / "ck.pt"
    old.write_bytes(b"an earlier run's snapshot")
    cfg = TrainConfig(checkpoint=str(old))
    before = file_stamp(old)
    assert ending(tmp_path / "a", cfg, before)["checkpoint"] is None  # untouched: not this run's
    write_text_atomic(old, "this run's epoch 1")  # written whole, then renamed: a new file
    assert ending(tmp_path / "b", cfg, before)["checkpoint"] == str(old)
    resumed = dataclasses.replace(cfg, resume=str(old))
    assert ending(tmp_path / "c", resumed, file_stamp(old))["checkpoint"] == str(old)  # what it resumed from, unchanged
    assert ending(tmp_path / "d", dataclasses.replace(cfg, checkpoint=str(tmp_path / "none.pt")), None)["checkpoint"] \
        is None


def logged(run_dir: Path, rank: int, rows: list[tuple], tail: str = "") -> None:
    """metrics/rank{rank}.jsonl with one record per (epoch, step, loss, samples[, superseded]), then `tail`."""
    lines = [json.dumps({"rank": rank, "world_size": 2, "epoch": e, "step": s, "loss": loss, "samples": n, "time": 0,
                         **({"superseded": more[0]} if more else {})}) + "\n" for e, s, loss, n, *more in rows]
    (run_dir / "metrics").mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics" / f"rank{rank}.jsonl").write_text("".join(lines) + tail)


def test_a_stopped_run_records_world_size_backend_each_finished_epochs_loss_and_no_comparison(tmp_path):
    cfg = TrainConfig(samples=40)  # 2 ranks x batch 10: 2 steps per epoch
    for rank in (0, 1):  # epochs 1 and 2 whole; epoch 3 begun; a restart's redone step; a line cut by the kill
        logged(tmp_path, rank, [(0, 0, 1.0 + rank, 10), (0, 1, 0.5, 10), (1, 2, 9.0, 10, 1), (1, 2, 0.25, 10),
                                (1, 3, 0.75, 6 + rank), (2, 4, 0.1, 10)], tail='{"rank": 0, "ep')
    record_ending(tmp_path, cfg, "terminated (SIGTERM)", "stopped", None, 2, "gloo")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["status"], summary["world_size"], summary["backend"]) == ("stopped", 2, "gloo")
    second = (0.25 * 10 + 0.75 * 6 + 0.25 * 10 + 0.75 * 7) / 33  # sample-weighted over both ranks
    assert summary["epoch_losses"] == [(1.0 * 10 + 0.5 * 10 + 2.0 * 10 + 0.5 * 10) / 40, second]
    assert summary["equivalent_to_large_batch"] is None
    assert summary["equivalence"] == ("not compared: the run stopped after 2 of 10 epochs and left no final weights; "
                                      "its configuration: identical to one process with batch 20: 40 samples split "
                                      "into 2 whole global batches.")


def test_a_stopped_resumed_run_counts_the_epochs_it_resumed_after(tmp_path):
    cfg = TrainConfig(resume="ck.pt", batch_size=5)
    logged(tmp_path, 0, [(3, 30, 0.5, 5)] * 10)
    logged(tmp_path, 1, [(3, 30, 0.5, 5)] * 10)
    start = {"epoch_losses": [0.9, 0.8, 0.7], "resumed_from": [
        {"world_size": 2, "batch_size": 10, "grad_accum_steps": 1, "global_batch_size": 20, "epoch": 3}]}
    record_ending(tmp_path, cfg, "interrupted (Ctrl-C)", "stopped", None, 2, "gloo", start)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["epoch_losses"] == [0.9, 0.8, 0.7, 0.5]
    assert summary["equivalence"].endswith("not identical to one process with batch 10: its first 3 epoch(s) trained "
                                           "with global batch 20.")


def test_the_history_a_resumed_run_starts_from_has_its_change_of_layout():
    from dp_helpers.tool.launch.runners import start_history

    resumed = {"history": {"epoch_losses": [0.9]}, "epoch": 1, "world_size": 2, "batch_size": 10, "grad_accum_steps": 1}
    assert start_history(resumed, TrainConfig(batch_size=20), 1) == {"epoch_losses": [0.9], "resumed_from": [
        {"world_size": 2, "batch_size": 10, "grad_accum_steps": 1, "global_batch_size": 20, "epoch": 1}]}
    assert start_history(resumed, TrainConfig(), 2) == {"epoch_losses": [0.9]} == resumed["history"]
    assert start_history(None, TrainConfig(), 2) == {}


def test_a_checkpoint_in_use_by_a_live_run_is_refused_before_anything_starts(tmp_path, capsys):
    from dp_helpers.tool.cli import main

    ckpt = tmp_path / "ck.pt"
    with checkpoint_lock(ckpt):  # a run that is still going holds it
        with pytest.raises(UsageError, match="in use by another run that is still going"):
            with checkpoint_lock(ckpt):
                pass
        assert main(["train", "--checkpoint", str(ckpt), "--out", str(tmp_path / "second")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: checkpoint") and err.count("\n") == 1 and not (tmp_path / "second").exists()
    assert not (tmp_path / "ck.pt.lock").exists()  # the lock goes with the run that held it
    with checkpoint_lock(ckpt):  # and the next run takes it
        pass


def test_a_write_that_fills_the_disk_says_so_and_leaves_no_partial_file(tmp_path):
    def fill(tmp):
        tmp.write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    (tmp_path / "ck.pt").write_bytes(b"the last snapshot")
    with pytest.raises(OSError, match="the disk is full: ck.pt could not be written") as caught:
        write_atomic(tmp_path / "ck.pt", fill)
    assert caught.value.errno == errno.ENOSPC and [p.name for p in tmp_path.glob("ck.pt*")] == ["ck.pt"]
    assert (tmp_path / "ck.pt").read_bytes() == b"the last snapshot"


def test_partials_of_killed_writers_are_removed_and_a_live_writers_kept(tmp_path):
    dead = 2**22 + 1  # above Linux's largest pid: no process has it
    for pid in (dead, os.getpid()):
        (tmp_path / f"ck.pt.tmp{pid}").write_bytes(b"half")
    remove_partials(tmp_path / "ck.pt", None)
    assert [p.name for p in tmp_path.glob("ck.pt*")] == [f"ck.pt.tmp{os.getpid()}"]  # this process may still be writing


@pytest.fixture
def nearly_full_disk(tmp_path):
    """A 256 KiB file system with about 48 KiB free (a tmpfs; skips, saying why, where mounting is not allowed)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if made.returncode:
        pytest.skip(f"cannot mount a small file system here to fill: {made.stderr.strip() or made.returncode}")
    try:
        (mount / "filler").write_bytes(bytes(208 * 1024))
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


@pytest.mark.long
@pytest.mark.slow
def test_a_full_disk_is_named_in_one_sentence_and_the_record_says_failed(nearly_full_disk, tmp_path):
    cli = subprocess.run([sys.executable, "-m", "dp_helpers", "train", "--epochs", "2", "--out",
                          str(nearly_full_disk / "run")], capture_output=True, text=True, timeout=300)
    last = cli.stderr.strip().splitlines()[-1]
    assert cli.returncode == 1 and last.startswith("error: the disk is full: loss.png could not be written"), cli.stderr
    assert "Traceback" not in cli.stderr
    summary = json.loads((nearly_full_disk / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["reason"].startswith("the disk is full")
    assert not list((nearly_full_disk / "run").glob("*.tmp*"))


@pytest.mark.slow
def test_a_bare_run_of_the_script_takes_the_checkpoint_lock_too(tmp_path):
    script = Path(__file__).resolve().parents[1] / "dp_helpers" / "scripts" / "train.py"
    with checkpoint_lock(tmp_path / "ck.pt"):
        bare = subprocess.run([sys.executable, str(script), "--checkpoint", str(tmp_path / "ck.pt"), "--epochs", "1",
                               "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert bare.returncode == 2 and bare.stderr.strip().startswith("error: checkpoint"), bare.stderr
    assert len(bare.stderr.strip().splitlines()) == 1 and not (tmp_path / "ck.pt").exists()
