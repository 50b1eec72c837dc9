"""Run folders and atomic writes: a failed write reports its own error."""

from pathlib import Path

import pytest

from dp_helpers.runs import write_atomic


def test_a_failed_write_keeps_its_own_error_when_the_clean_up_fails_too(tmp_path, monkeypatch):
    def full_disk(tmp):
        raise OSError(28, "No space left on device")

    def read_only(self, missing_ok=False):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(Path, "unlink", read_only)
    with pytest.raises(OSError, match="No space left on device"):
        write_atomic(tmp_path / "ck.pt", full_disk)
