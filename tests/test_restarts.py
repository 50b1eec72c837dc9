"""A dead rank is not a lost job: --fail-at kills one rank, torchrun restarts the group, the job resumes from its
last snapshot and ends bitwise where an uninterrupted run ends (without restarts, notebook 07 shows the error naming
the dead rank and the whole snapshot). Snapshots and metrics are written so that a crash never leaves half a file."""

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from dp_helpers.tool.files import write_atomic
from dp_helpers.tool.launch import run_train
from dp_helpers.tool.metrics import mark_superseded, read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.long]

# the synthetic task, 5 steps per epoch on 2 ranks: the mechanism costs seconds; notebook 07 does the same on digits
JOB = {"lr": 0.1, "momentum": 0.9, "epochs": 3}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, pools):
    """The same job without a fault, in a rank pool (the same train() as under torchrun): the weights to match, bit for bit."""
    from tests.test_train import launch_train

    run = launch_train(pools, tmp_path_factory.mktemp("whole") / "run", 2, **JOB)
    return run, torch.load(run.run_dir / "model.pt", weights_only=True)


# a rank killed mid-epoch, restarted, bitwise equal to an uninterrupted run, its redone records marked and counted
# once; and without restarts, the error naming the dead rank, the whole snapshot, the failed record: notebook 07's
# section 3, run by this suite (on digits, through run_train, the CLI's own launcher call)


def test_a_rank_lost_before_the_first_snapshot_starts_the_job_again(tmp_path, uninterrupted):
    run, weights = run_train(2, out_dir=tmp_path / "run", checkpoint=str(tmp_path / "snapshot.pt"), fail_at="1:1",
                             max_restarts=1, **JOB)
    assert "no snapshot of this run yet: starting again from the beginning" in run.log
    assert all(torch.equal(weights[k], v) for k, v in uninterrupted[1].items())
    assert run.summary["resumed"] == [{"attempt": 1, "resumed_at_epoch": 1, "resumed_at_step": 0}]


def test_a_group_restarted_from_an_async_snapshot_ends_bitwise_as_the_uninterrupted_run(tmp_path, uninterrupted):
    run, weights = run_train(2, out_dir=tmp_path / "run", checkpoint=str(tmp_path / "snapshot.pt"), fail_at="2:1",
                             max_restarts=1, async_checkpoint=True, **JOB)
    # epoch 1's snapshot, unless its thread was still writing when rank 1 died: then no snapshot of this run yet
    assert run.summary["resumed"] in ([{"attempt": 1, "resumed_at_epoch": 2, "resumed_at_step": 5}],
                                      [{"attempt": 1, "resumed_at_epoch": 1, "resumed_at_step": 0}])
    assert all(torch.equal(weights[k], v) for k, v in uninterrupted[1].items())


def test_a_crash_while_writing_leaves_the_last_good_file(tmp_path):
    (tmp_path / "d").mkdir()
    target = tmp_path / "d" / "snapshot.pt"
    target.write_bytes(b"the last good snapshot")
    code = ("import os, signal, sys; from dp_helpers.tool.files import write_atomic\n"
            "def half(tmp):\n    tmp.write_bytes(b'half a new'); os.kill(os.getpid(), signal.SIGKILL)\n"
            "write_atomic(sys.argv[1], half)")
    proc = subprocess.run([sys.executable, "-c", code, str(target)], timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert target.read_bytes() == b"the last good snapshot"
    with pytest.raises(ValueError):
        write_atomic(target, lambda tmp: (tmp.write_bytes(b"half"), int("x")))
    assert target.read_bytes() == b"the last good snapshot"
    assert len(os.listdir(target.parent)) == 2  # and the killed writer's temporary file; the failed one removed its own


def test_marking_keeps_every_record_and_drops_only_a_cut_line(tmp_path):
    path = tmp_path / "rank0.jsonl"
    rows = [{"rank": 0, "world_size": 1, "epoch": 0, "step": s, "loss": 1.0, "samples": 1, "time": 0} for s in range(4)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"rank": 0, "st')
    assert mark_superseded(path, from_step=2, attempt=1) == 2
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r.get("superseded") for r in records] == [None, None, 1, 1]
    assert [r["step"] for r in read_metrics(path)] == [0, 1]
