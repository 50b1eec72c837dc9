"""`python -m dp_helpers train` as a user meets it: mistakes answered before anything starts, nothing left running.

Every refusal here happens in the parent, before a process starts or a folder is made (the quick tests forbid
starting one); the slow tests end real runs by a timeout, SIGINT and SIGTERM.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dp_helpers.tool.cli import main as cli_main
from dp_helpers.tool.models import build_model
from tests.conftest import survivors


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


def test_a_link_that_cannot_be_read_or_run_is_refused_in_one_line(capsys, tmp_path):
    assert "got 'fast'" in refused(capsys, "--link", "fast", "--out", str(tmp_path / "a"))
    assert not (tmp_path / "a").exists()


def test_an_empty_or_used_output_folder_is_refused(capsys, tmp_path, monkeypatch):
    assert "empty string" in refused(capsys, "--out", "")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    assert "exists and is not empty" in refused(capsys, "--out", ".")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "tmpdir"]  # nothing written


def test_confusing_inputs_are_one_sentence_before_anything_starts(capsys, tmp_path, monkeypatch):
    assert "below 2**63" in refused(capsys, "--seed", "99999999999999999999")
    (tmp_path / "afile").write_text("")
    assert "afile is a file, not a folder" in refused(capsys, "--checkpoint", str(tmp_path / "afile" / "ck.pt"))
    for value in ("abc", "0", "-1", "nan"):
        monkeypatch.setenv("DP_PG_TIMEOUT", value)
        assert f"DP_PG_TIMEOUT={value!r}" in refused(capsys, "--out", str(tmp_path / "r"))
    monkeypatch.delenv("DP_PG_TIMEOUT")
    assert cli_main(["bench", "--world-sizes", "2", "2"]) == 2
    assert "world_sizes lists 2 more than once" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_far_more_cpu_processes_than_cores_needs_a_flag(capsys, tmp_path):
    err = refused(capsys, "--world-size", "1000", "--samples", "100000", "--out", str(tmp_path / "r"))
    assert "1000 CPU processes" in err and "--oversubscribe" in err and not (tmp_path / "r").exists()


@pytest.mark.parametrize("argv, words", [
    (["--model", "bn", "--bn-sync", "syncbn"], "SyncBatchNorm refuses CPU tensors); use --bn-sync allreduce"),
    (["--strategy", "fsdp", "--sync", "manual"], "--strategy fsdp cannot be combined with --sync manual"),
    (["--strategy", "zero1", "--check-grads", "--checkpoint", "c.pt"], "with --check-grads or --checkpoint"),
    (["--bn-sync", "allreduce"], "only means something for model 'bn'"),
    (["--async-checkpoint"], "and there is no --checkpoint FILE: add one or drop --async-checkpoint"),
    (["--strategy", "fsdp", "--max-restarts", "1"], "restarts that resume are available with --strategy ddp"),
    (["--epochs", "3", "--stop-after", "1", "--fail-at", "3:1"], "--fail-at 3:1 would never fire: this run trains only "
                                                                 "epoch 1"),
])
def test_flags_that_cannot_work_here(capsys, tmp_path, argv, words):
    if torch.cuda.device_count() >= 2 and "syncbn" in argv:
        pytest.skip("with two GPUs SyncBatchNorm runs")
    assert words in refused(capsys, *argv, "--out", str(tmp_path / "r"))
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("inside", ["model.pt", "summary.json", "metrics/ck.pt"])
def test_a_checkpoint_among_the_run_folders_own_files_is_refused(capsys, tmp_path, inside):
    (tmp_path / "r" / "metrics").mkdir(parents=True)  # an empty run folder (metrics/ made by hand to reach the check)
    err = refused(capsys, "--checkpoint", str(tmp_path / "r" / inside), "--out", str(tmp_path / "r"))
    assert f"is the run folder's own {inside}" in err


def test_a_resumed_fault_in_an_epoch_already_trained_is_refused(capsys, tmp_path):
    three = checkpoint(tmp_path / "three.pt", epoch=3)
    assert "would never fire: this run trains only epochs 4 to 10" in refused(
        capsys, "--resume", three, "--fail-at", "2:1", "--out", str(tmp_path / "r"))


def test_resume_is_checked_before_anything_starts(capsys, tmp_path):
    out = str(tmp_path / "r")
    assert "is a folder; give the checkpoint file" in refused(capsys, "--resume", str(tmp_path), "--out", out)
    other = checkpoint(tmp_path / "mlp.pt", model="mlp")
    err = refused(capsys, "--resume", other, "--out", out)
    assert "another model's weights" in err and "--model and --dim it was trained with" in err
    three = checkpoint(tmp_path / "three.pt", epoch=3)
    assert "nothing would train" in refused(capsys, "--resume", three, "--stop-after", "2", "--out", out)
    done = checkpoint(tmp_path / "done.pt", epoch=10)
    assert "finished epoch 10 of --epochs 10" in refused(capsys, "--resume", done, "--out", out)
    fast = checkpoint(tmp_path / "fast.pt", optimizer={"param_groups": [{"lr": 0.01, "momentum": 0.9}]})
    err = refused(capsys, "--resume", fast, "--lr", "0.5", "--out", out)
    assert "was trained with --lr 0.01 --momentum 0.9, and resuming continues" in err and "(now: --lr 0.5 --momentum 0.0)" in err
    digits = checkpoint(tmp_path / "digits.pt", config={"data": "synthetic", "samples": 100, "use_no_sync": False})
    assert "--no-use-no-sync" in refused(capsys, "--resume", digits, "--out", out)
    seeded = checkpoint(tmp_path / "seeded.pt", seed=3)
    assert "was written with --seed 3; resume with the same (now: 0)" in refused(capsys, "--resume", seeded, "--out", out)
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_a_timeout_says_how_to_raise_it_and_keeps_the_folder(tmp_path, monkeypatch):
    marker = "cli-timeout-" + tmp_path.name
    monkeypatch.setenv("DP_TEST_ID", marker)
    proc = subprocess.run([sys.executable, "-m", "dp_helpers", "train", "--timeout", "1", "--out", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "raise --timeout" in proc.stderr and "Traceback" not in proc.stderr
    assert survivors(marker) == []  # within 5 s after the CLI returned
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
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())  # the record says how the run ended
    assert (summary["status"], summary["reason"]) == ("stopped", "interrupted (Ctrl-C)" if sig == signal.SIGINT
                                                      else "terminated (SIGTERM)")
    assert survivors(marker) == []


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize("gap", [0.02, 0.3])
def test_ctrl_c_twice_still_leaves_the_record(tmp_path, monkeypatch, gap):
    marker = "cli-twice-" + tmp_path.name
    monkeypatch.setenv("DP_TEST_ID", marker)
    cli = subprocess.Popen([sys.executable, "-m", "dp_helpers", "train", "--epochs", "400", "--out", str(tmp_path / "r")],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for(tmp_path / "r" / "metrics" / "rank0.jsonl")  # training: the second Ctrl-C lands while it stops
    cli.send_signal(signal.SIGINT)
    time.sleep(gap)
    cli.send_signal(signal.SIGINT)
    err = cli.communicate(timeout=60)[1]
    assert cli.returncode == 130 and err.strip().splitlines()[-1].startswith("interrupted:"), err
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert (summary["status"], summary["reason"]) == ("stopped", "interrupted (Ctrl-C)")
    assert survivors(marker) == []


def test_the_readme_lists_every_train_flag_as_help_says():
    from pathlib import Path

    from dp_helpers.tool.cli import flag_rows

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
    from dp_helpers.scripts.train import divergence
    from dp_helpers.tool.metrics import MetricsWriter

    with MetricsWriter(tmp_path, 0, 1) as w:
        w.log(epoch=0, step=0, loss=0.7, samples=10)
    assert divergence(tmp_path, 0.5) is None and divergence(tmp_path, 6.9) is None
    assert "diverging; lower --lr" in divergence(tmp_path, 31.0)
    assert "diverged; lower --lr" in divergence(tmp_path, float("nan"))


def test_run_ddp_is_importable_from_the_package_and_a_missing_script_is_a_file_not_found():
    import dp_helpers
    from dp_helpers import run_ddp
    from dp_helpers.tool.launch import run_ddp as the_same

    assert run_ddp is the_same
    with pytest.raises(FileNotFoundError, match="script not found"):
        dp_helpers.run_ddp("no_such_script.py", world_size=1)
    with pytest.raises(AttributeError):
        dp_helpers.no_such_thing  # noqa: B018


def test_checkpoint_and_out_paths_are_checked_before_anything_starts(capsys, tmp_path, monkeypatch):
    out = str(tmp_path / "r")
    assert "is a folder; give a file name in it" in refused(capsys, "--checkpoint", str(tmp_path), "--out", out)
    (tmp_path / "afile").write_text("")
    assert "is a file; give a folder" in refused(capsys, "--out", str(tmp_path / "afile"))
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == tmp_path else real_access(path, mode))
    assert "is not writable" in refused(capsys, "--checkpoint", str(tmp_path / "ck.pt"), "--out", out)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("command", ["train", "bench"])
def test_help_says_each_default_once(command, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit):
        cli_main([command, "--help"])
    text = capsys.readouterr().out
    assert "(default: None)" not in text and "(default: )" not in text
    flat = " ".join(text.split())  # argparse wraps lines
    for part in flat.split(" --")[1:]:
        assert part.count("(default") <= 1, part
    assert "(default: 10)" in flat if command == "train" else "(default: 1024)" in flat


def readme_table(text: str, header: str, nth: int = 0) -> list[str]:
    """The rows of the nth table under this header line."""
    start = [i for i in range(len(text)) if text.startswith(header, i)][nth]
    return text[start:].split("\n\n")[0].splitlines()[2:]


def test_the_readmes_list_every_bench_flag_and_every_run_ddp_parameter():
    import inspect

    from dp_helpers.tool.cli import flag_rows
    from dp_helpers.tool.launch import run_ddp

    repo = Path(__file__).resolve().parent.parent
    en, zh = ((repo / name).read_text() for name in ("README.md", "README.zh-CN.md"))
    assert readme_table(en, "| flag | default | meaning |", 1) == ["| " + " | ".join(row) + " |" for row in flag_rows("bench")]
    zh_rows = {tuple(c.strip() for c in row.split("|")[1:3]) for row in readme_table(zh, "| 参数 | 默认值 | 含义 |", 1)}
    assert {(flag, {"see meaning": "见含义"}.get(default, default)) for flag, default, _ in flag_rows("bench")} == zh_rows
    params = inspect.signature(run_ddp).parameters.values()
    want = {(f"`*{p.name}`" if p.kind is p.VAR_POSITIONAL else f"`{p.name}`",
             None if p.default is p.empty else f"`{p.default!r}`".replace("'", '"')) for p in params}
    for text, header in ((en, "| parameter | default | meaning |"), (zh, "| 参数 | 默认值 | 含义 |")):
        rows = readme_table(text, header, 0 if text is en else 2)
        got = {(cells[0], cells[1] if cells[1].startswith("`") else None)
               for cells in (tuple(c.strip() for c in row.split("|")[1:3]) for row in rows)}
        assert got == want, text[:20]
