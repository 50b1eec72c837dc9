"""run_ddp and the train CLI refuse bad input with one sentence, before any process starts."""

import functools
import math
import subprocess
import sys
from pathlib import Path

import pytest

from dp_helpers.tool import launch, request
from dp_helpers.tool.cli import main as cli_main
from dp_helpers.tool.launch import command
from dp_helpers.tool.request import UsageError


@pytest.fixture
def no_spawn(monkeypatch):
    """Any attempt to start a process fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("a process was started")
    monkeypatch.setattr(subprocess, "Popen", refuse)


@pytest.fixture
def script(write_script):
    return write_script("print('hi')\n")


CASES = [
    ({"world_size": 0}, ValueError, "world_size must be >= 1, got 0."),
    ({"world_size": -2}, ValueError, "world_size must be >= 1, got -2."),
    ({"world_size": 2.0}, UsageError, "world_size must be an int, got 2.0 (float)."),
    ({"world_size": True}, UsageError, "world_size must be an int, got True (bool)."),
    ({"world_size": "2"}, UsageError, "world_size must be an int, got '2' (str)."),
    ({"backend": "mpi"}, ValueError, "backend must be one of auto, gloo, nccl, got 'mpi'."),
    ({"timeout": 0}, ValueError, "timeout must be a finite number > 0, got 0."),
    ({"timeout": -5}, ValueError, "timeout must be a finite number > 0, got -5."),
    ({"timeout": math.inf}, ValueError, "timeout must be a finite number > 0, got inf."),
    ({"timeout": "60"}, UsageError, "timeout must be a number, got '60' (str)."),
    ({"env": {"A": 1}}, UsageError, "env must be a mapping of str to str."),
    ({"nnodes": 0}, ValueError, "nnodes must be >= 1, got 0."),
    ({"nnodes": 2, "node_rank": 2, "world_size": 4, "rdzv_endpoint": "h:1"}, ValueError,
     "node_rank must be < nnodes=2, got 2."),
    ({"nnodes": 2, "world_size": 3, "rdzv_endpoint": "h:1"}, ValueError,
     "world_size=3 must be a multiple of nnodes=2 (same processes per node)."),
    ({"nnodes": 2, "world_size": 4}, ValueError,
     "several nodes need rdzv_endpoint='host:port' of node 0, got None."),
    ({"progress": 0}, ValueError, "progress must be >= 1, got 0."),
]


@pytest.mark.parametrize("kwargs, error, message", CASES)
def test_bad_arguments(no_spawn, script, tmp_path, kwargs, error, message):
    with pytest.raises(error) as info:
        launch.run_ddp(script, out_dir=tmp_path / "run", **kwargs)
    assert str(info.value) == message


def fake_machine(monkeypatch, n_gpus, has_nccl):
    """Make run_ddp see n_gpus GPUs and a torch with or without NCCL."""
    monkeypatch.setattr(request, "resolve_backend", functools.partial(request.resolve_backend, n_gpus=n_gpus,
                                                                      has_nccl=has_nccl))


def test_nccl_without_nccl(no_spawn, script, tmp_path, monkeypatch):
    fake_machine(monkeypatch, n_gpus=0, has_nccl=False)
    with pytest.raises(ValueError) as info:
        launch.run_ddp(script, world_size=2, backend="nccl", out_dir=tmp_path / "run")
    assert str(info.value) == "backend 'nccl' is not built into this torch (a CPU build?); use backend 'gloo'."


def test_nccl_needs_a_gpu_per_process(no_spawn, script, tmp_path, monkeypatch):
    fake_machine(monkeypatch, n_gpus=1, has_nccl=True)
    with pytest.raises(ValueError) as info:
        launch.run_ddp(script, world_size=2, backend="nccl", out_dir=tmp_path / "run")
    assert str(info.value) == ("backend 'nccl' needs one GPU per process: 2 processes per node but 1 GPU(s) "
                               "visible; lower the world size or use backend 'gloo'.")


def test_missing_script(no_spawn, tmp_path):
    with pytest.raises(UsageError, match="script not found: .*missing.py"):
        launch.run_ddp(tmp_path / "missing.py", out_dir=tmp_path / "run")


def test_script_not_a_py_file(no_spawn, tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=r"script must be a \.py file, got .*notes.txt"):
        launch.run_ddp(tmp_path / "notes.txt", out_dir=tmp_path / "run")
    with pytest.raises(ValueError, match=r"script must be a \.py file"):
        launch.run_ddp(tmp_path, out_dir=tmp_path / "run")


def test_unknown_module(no_spawn, tmp_path):
    with pytest.raises(UsageError, match="no script file or importable module named 'dp_helpers.nope'"):
        launch.run_ddp("dp_helpers.nope", out_dir=tmp_path / "run")


def test_bad_script_argument(no_spawn, script, tmp_path):
    with pytest.raises(UsageError, match=r"script arguments must be str, int, float or Path, got \[1\]"):
        launch.run_ddp(script, [1], out_dir=tmp_path / "run")


def test_unwritable_output_folder(no_spawn, script, tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"output folder .*file/run is not writable"):
        launch.run_ddp(script, out_dir=tmp_path / "file" / "run")


def test_output_folder_with_a_run_is_not_overwritten(no_spawn, script, tmp_path):
    (tmp_path / "run" / "metrics").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"output folder .*run already holds a run; choose a new folder"):
        launch.run_ddp(script, out_dir=tmp_path / "run")


@pytest.mark.parametrize("argv, message", [
    (["--batch-size", "0"], "error: batch_size must be >= 1, got 0."),
    (["--world-size", "0"], "error: world_size must be >= 1, got 0."),
    (["--samples", "3", "--world-size", "4"], "error: samples=3 is fewer than world_size=4"),
    (["--lr", "nan"], "error: lr must be a finite number > 0, got nan."),
    (["--epochs", "0"], "error: epochs must be >= 1, got 0."),
    (["--timeout", "-1"], "error: timeout must be a finite number > 0, got -1.0."),
])
def test_cli_prints_the_sentence_and_exits_non_zero(no_spawn, tmp_path, capsys, argv, message):
    assert cli_main(["train", "--out", str(tmp_path / "run"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_cli_error_has_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dp_helpers", "train", "--backend", "nccl", "--world-size", "64",
                           "--out", str(tmp_path / "r")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: backend 'nccl'") and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_default_run_folder_is_named_after_the_script(tmp_path, monkeypatch, script):
    monkeypatch.chdir(tmp_path)
    module_plan = command.plan_launch("dp_helpers.scripts.train", (), 2, "gloo", None, 60, 1, 0, None, None, None)
    file_plan = command.plan_launch(script, (), 2, "gloo", None, 60, 1, 0, None, None, None)
    assert module_plan.run_dir.parent == tmp_path / "runs" and module_plan.run_dir.name.split("-")[2] == "train"
    assert file_plan.run_dir.name.split("-")[2] == "worker"


def test_ranks_are_forked_from_torchrun_on_cpus_only(script, tmp_path, monkeypatch):
    fork = ["--run-path", "--start-method", "fork"]
    target = [str(Path(script).resolve())]
    gloo = command.torchrun_command(target, (), Path("r"), 2, 1, None, fork=True)
    nccl = command.torchrun_command(target, (), Path("r"), 2, 1, None)
    assert gloo[gloo.index("--run-path"):gloo.index(target[0])] == fork and "--run-path" not in nccl
    assert "--run-path" in command.plan_launch(script, (), 2, "gloo", tmp_path / "run", 60, 1, 0, None, None, None).command
    monkeypatch.setattr(command, "gpu_count", lambda: 1)  # gloo ranks on a GPU machine may use CUDA: never forked
    assert "--run-path" not in command.plan_launch(script, (), 2, "gloo", tmp_path / "r2", 60, 1, 0, None, None, None).command
