"""examples/: the scripts a learner takes home are plain PyTorch, run under bare torchrun, and equal one device."""

import ast
import os
import runpy
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO

EXAMPLES = REPO / "examples"


@pytest.mark.parametrize("name", ["train_ddp.py", "train_one_device.py"])
def test_nothing_comes_from_the_course(name):
    tree = ast.parse((EXAMPLES / name).read_text())
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert modules and all(m.split(".")[0] in {"argparse", "gc", "os", "sys", "datetime", "torch"} for m in modules), modules


def test_without_torchrun_it_says_how_to_start_it(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setattr(sys, "argv", ["train_ddp.py"])
    with pytest.raises(SystemExit, match="start me with torchrun: torchrun --standalone --nproc-per-node 2"):
        runpy.run_path(str(EXAMPLES / "train_ddp.py"), run_name="__main__")


@pytest.mark.slow
def test_under_bare_torchrun_two_ranks_equal_one_device(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")  # one thread each: the same sums
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(EXAMPLES / "train_ddp.py"), "--epochs", "2", "--out", str(tmp_path / "ddp.pt")],
                         env=env, capture_output=True, text=True, timeout=120)
    one = subprocess.run([sys.executable, str(EXAMPLES / "train_one_device.py"), "--epochs", "2", "--batch-size", "32",
                          "--out", str(tmp_path / "one.pt")], env=env, capture_output=True, text=True, timeout=120)
    assert ddp.returncode == 0 and one.returncode == 0, ddp.stderr[-2000:] + one.stderr[-2000:]
    torch.testing.assert_close(torch.load(tmp_path / "ddp.pt"), torch.load(tmp_path / "one.pt"))
    assert ddp.stdout.splitlines() == one.stdout.splitlines()  # the same epoch lines, printed once
