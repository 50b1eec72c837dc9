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
