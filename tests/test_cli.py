"""`python -m dp_helpers train` as a user meets it: mistakes answered before anything starts, nothing left running.

Every refusal here happens in the parent, before a process starts or a folder is made (the quick tests forbid
starting one); the slow tests end real runs by a timeout, SIGINT and SIGTERM.
"""

import json
import signal
import subprocess
import sys
import time

import pytest
import torch

from dp_helpers.__main__ import main as cli_main
from dp_helpers.models import build_model
from tests.conftest import started_by


def refused(capsys, *argv) -> str:
    """Run the CLI in this process; it must exit 2 with one line on stderr, which is returned."""
    assert cli_main(["train", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


def checkpoint(path, model="linear", dim=10, epoch=1, **extra):
    """A checkpoint as scripts/train.py writes it."""
    torch.save({"model": build_model(model, dim, 0).state_dict(), "optimizer": {}, "epoch": epoch, "step": 5,
                **extra}, path)
    return str(path)


def test_an_empty_or_used_output_folder_is_refused(capsys, tmp_path, monkeypatch):
    assert "empty string" in refused(capsys, "--out", "")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    assert "exists and is not empty" in refused(capsys, "--out", ".")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "tmpdir"]  # nothing written


def test_far_more_cpu_processes_than_cores_needs_a_flag(capsys, tmp_path):
    err = refused(capsys, "--world-size", "1000", "--samples", "100000", "--out", str(tmp_path / "r"))
    assert "1000 CPU processes" in err and "--oversubscribe" in err and not (tmp_path / "r").exists()


@pytest.mark.parametrize("argv, words", [
    (["--model", "bn", "--bn-sync", "syncbn"], "SyncBatchNorm refuses CPU tensors); use --bn-sync allreduce"),
    (["--strategy", "fsdp", "--sync", "manual"], "--strategy fsdp cannot be combined with --sync manual"),
    (["--strategy", "zero1", "--check-grads", "--checkpoint", "c.pt"], "with --check-grads or --checkpoint"),
    (["--bn-sync", "allreduce"], "only means something for model 'bn'"),
])
def test_flags_that_cannot_work_here(capsys, tmp_path, argv, words):
    if torch.cuda.device_count() >= 2 and "syncbn" in argv:
        pytest.skip("with two GPUs SyncBatchNorm runs")
    assert words in refused(capsys, *argv, "--out", str(tmp_path / "r"))
    assert not (tmp_path / "r").exists()


def test_resume_is_checked_before_anything_starts(capsys, tmp_path):
    out = str(tmp_path / "r")
    assert "is a folder; give the checkpoint file" in refused(capsys, "--resume", str(tmp_path), "--out", out)
    other = checkpoint(tmp_path / "mlp.pt", model="mlp")
    err = refused(capsys, "--resume", other, "--out", out)
    assert "another model's weights" in err and "--model and --dim it was trained with" in err
    done = checkpoint(tmp_path / "done.pt", epoch=10)
    assert "finished epoch 10 of --epochs 10" in refused(capsys, "--resume", done, "--out", out)
    four = checkpoint(tmp_path / "four.pt", world_size=4, batch_size=10)
    assert "written by world size 4 x batch 10" in refused(capsys, "--resume", four, "--world-size", "2", "--out", out)
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_a_timeout_says_how_to_raise_it_and_keeps_the_folder(tmp_path, monkeypatch):
    marker = "cli-timeout-" + tmp_path.name
    monkeypatch.setenv("DP_TEST_ID", marker)
    proc = subprocess.run([sys.executable, "-m", "dp_helpers", "train", "--timeout", "1", "--out", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "raise --timeout" in proc.stderr and "Traceback" not in proc.stderr
    time.sleep(5)
    assert started_by(marker) == []  # 5 s after the CLI returned
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["reason"] == "--timeout 1 s"


def wait_for(path, timeout: float = 60) -> None:
    """Until path exists."""
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.exists()


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_no_process_outlives_a_stopped_cli(tmp_path, monkeypatch, sig, code):
    # a world size well above the cores, stopped while torchrun is still starting its workers
    marker = "cli-stop-" + tmp_path.name
    monkeypatch.setenv("DP_TEST_ID", marker)
    cli = subprocess.Popen([sys.executable, "-m", "dp_helpers", "train", "--world-size", "12", "--oversubscribe",
                            "--out", str(tmp_path / "r")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for(tmp_path / "r" / "console.log")
    time.sleep(1.0)
    cli.send_signal(sig)
    err = cli.communicate(timeout=60)[1]
    assert cli.returncode == code and "no process it started is left running" in err
    time.sleep(5)
    assert started_by(marker) == []


def test_the_readme_lists_every_train_flag_as_help_says():
    from pathlib import Path

    from dp_helpers.__main__ import flag_rows

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    table = readme[readme.index("| flag | default | meaning |"):].split("\n\n")[0].splitlines()[2:]
    assert table == ["| " + " | ".join(row) + " |" for row in flag_rows()]  # regenerate the table from flag_rows()


def test_help_names_every_command_and_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        cli_main(["--help"])
    top = capsys.readouterr().out
    assert all(name in top for name in ("train", "doctor", "bench"))
    with pytest.raises(SystemExit):
        cli_main(["train", "--help"])
    assert "(default: 10)" in capsys.readouterr().out


def test_a_diverging_loss_gets_a_warning(tmp_path):
    from dp_helpers.metrics import MetricsWriter
    from dp_helpers.scripts.train import divergence

    with MetricsWriter(tmp_path, 0, 1) as w:
        w.log(epoch=0, step=0, loss=0.7, samples=10)
    assert divergence(tmp_path, 0.5) is None and divergence(tmp_path, 6.9) is None
    assert "diverging; lower --lr" in divergence(tmp_path, 31.0)
    assert "diverged; lower --lr" in divergence(tmp_path, float("nan"))
