"""dp_helpers.tool.dist: alone a script is a group of one, a one-process group comes up and goes down, orphans exit, worker() exits cleanly."""

import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed as dist

from dp_helpers.tool import dist as dph
from tests.conftest import pids_alive, wait_for_files


def test_setup_alone_is_a_group_of_one_with_its_own_run_folder(monkeypatch, tmp_path):
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "DP_RUN_DIR", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    info = dph.setup(backend="gloo", timeout_s=5)
    try:
        assert (info.rank, info.world_size, dist.get_world_size()) == (0, 1, 1)
        assert info.run_dir.is_dir() and info.run_dir.parent.resolve() == (tmp_path / "runs").resolve()
    finally:
        dph.teardown()


def test_half_a_torchrun_environment_is_refused(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(SystemExit, match=r"WORLD_SIZE not set while RANK"):  # one sentence, no traceback
        dph.setup()


def test_a_stale_torchrun_environment_is_refused_at_once(monkeypatch):
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    with pytest.raises(SystemExit, match=r"torchrun did not start this process .* unset RANK, LOCAL_RANK"):
        dph.setup()


def test_one_process_group_up_and_down(monkeypatch, tmp_path):
    monkeypatch.setenv("DP_RUN_DIR", str(tmp_path / "run"))  # not a folder under the checkout's runs/
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "0")  # rank 0's store binds any free port
    info = dph.setup(backend="gloo", timeout_s=5)
    try:
        assert (info.rank, info.local_rank, info.world_size, info.is_main) == (0, 0, 1, True)
        assert info.device == torch.device("cpu") and info.backend == "gloo" and info.tag() == "[rank 0/1]"
        t = torch.ones(3)
        dist.all_reduce(t)
        torch.testing.assert_close(t, torch.ones(3))
    finally:
        dph.teardown()
    assert not dist.is_initialized()
    dph.teardown()  # a second call is harmless


@pytest.mark.slow
def test_orphaned_worker_exits(tmp_path):
    """A worker whose launcher is SIGKILLed stops by itself instead of training on."""
    child = textwrap.dedent(f"""
        import os, pathlib, time
        from dp_helpers.tool.dist import exit_when_orphaned
        exit_when_orphaned(poll_s=0.1)
        pathlib.Path({str(tmp_path)!r}, "w.pid").write_text(str(os.getpid()))
        time.sleep(60)
        """)
    parent = subprocess.Popen([sys.executable, "-c",
                               f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(60)"])
    pid = int(wait_for_files(tmp_path, 1)[0].read_text())
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while pids_alive([pid]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pids_alive([pid]) == []


@pytest.mark.slow
@pytest.mark.parametrize("body, code, words", [
    ("print('done', info.world_size, info.run_dir.name, end='')", 0, "done 1 mine"),  # unflushed output arrives
    ("raise ValueError('boom')", 1, "ValueError: boom"),  # a failure is never turned into success
    ("m = dph.wrap_ddp(__import__('torch').nn.Linear(2, 1), info); raise ValueError('boom')", 1,
     "ValueError: boom"),  # with a DDP model alive: exit code 1, never an abort at shutdown
])
def test_worker_runs_main_alone_and_passes_failures_on(body, code, words, tmp_path):
    script = (f"from dp_helpers.tool import dist as dph\ndef main(info):\n    {body}\n"
              f"dph.worker(main, backend='gloo', run_dir={str(tmp_path / 'mine')!r})\nprint('never')")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")})
    assert proc.returncode == code and words in proc.stdout + proc.stderr and "never" not in proc.stdout


def test_an_environment_left_by_an_ended_torchrun_is_refused_at_once(monkeypatch):
    with socket.socket() as s:  # a port nothing listens on once this block closes it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    stale = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
             "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_USE_AGENT_STORE": "True"}  # as copied from a torchrun worker
    for key, value in stale.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(dph, "exit_when_orphaned", lambda: None)  # no watchdog thread left in the test process
    start = time.monotonic()
    with pytest.raises(SystemExit, match=rf"rendezvous store at 127.0.0.1:{port} does not answer .* left over"):
        dph.setup(backend="gloo", timeout_s=30)
    assert time.monotonic() - start < 10 and not dist.is_initialized()
