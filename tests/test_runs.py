"""Run folders, atomic writes and the record of a run that did not finish."""

import dataclasses
import json
from pathlib import Path

import pytest

from dp_helpers.config import TrainConfig
from dp_helpers.runs import file_stamp, record_ending, write_atomic, write_text_atomic


def test_a_failed_write_keeps_its_own_error_when_the_clean_up_fails_too(tmp_path, monkeypatch):
    def full_disk(tmp):
        raise OSError(28, "No space left on device")

    def read_only(self, missing_ok=False):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(Path, "unlink", read_only)
    with pytest.raises(OSError, match="No space left on device"):
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
