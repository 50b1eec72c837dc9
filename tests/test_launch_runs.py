"""run_ddp for real: live rank-prefixed output, crashes named by rank, timeouts, interrupts and killed kernels leave nothing."""

import signal
import subprocess
import sys
import time

import pytest

from dp_helpers.tool.launch import DistributedRunError, RunTimeoutError, run_ddp
from tests.conftest import pids_alive, wait_for_files

pytestmark = pytest.mark.slow

# A worker that ignores SIGINT and SIGTERM (as one stuck in native code would) and announces its pid.
STUBBORN = """
import os, pathlib, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
pathlib.Path(sys.argv[1], os.environ["RANK"] + ".pid").write_text(str(os.getpid()))
print("ready", flush=True)
while True:
    time.sleep(0.1)
"""

# the package's shape (worker: @record, and a failing rank exits at once): a script that destroys its group in a
# `finally` first lets rank 0 fail and torchrun SIGTERM rank 1 before it exits (seen under load: exit code -15)
CRASH = """
import torch, torch.distributed as dist
from dp_helpers.tool import dist as dph

def main(info):
    for step in range(10_000):
        if info.rank == 1 and step == 3:
            raise ValueError("boom on rank 1 at step 3")
        dist.all_reduce(torch.ones(1))  # rank 0 waits here for rank 1

dph.worker(main)
"""

# Started like a notebook kernel would: run_ddp in the main thread of its own Python process.
KERNEL = "import sys; from dp_helpers.tool.launch import run_ddp; run_ddp(sys.argv[1], sys.argv[2], world_size=2, out_dir=sys.argv[3])"


def test_live_prefixed_output_and_result(write_script, tmp_path, capsys):
    script = write_script("""
        import os
        from dp_helpers.tool.metrics import MetricsWriter
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        print(f"hello from {rank}", flush=True)
        with MetricsWriter(os.environ["DP_RUN_DIR"], rank, world) as w:
            w.log(epoch=0, step=0, loss=1.0 + rank, samples=2)
        """)
    result = run_ddp(script, world_size=2, out_dir=tmp_path / "run", timeout=120)
    out = capsys.readouterr().out
    assert "[rank 0/2] hello from 0" in out and "[rank 1/2] hello from 1" in out
    assert result.returncode == 0 and result.run_dir == (tmp_path / "run").resolve()
    assert result.wall_time > 0 and "hello from 1" in result.log and result.world_size == 2
    assert result.backend == "gloo" and result.summary is None
    assert [(r["rank"], r["loss"]) for r in result.metrics] == [(0, 1.0), (1, 2.0)]
    assert (result.run_dir / "console.log").read_text() == result.log


# rank 0 prints 'first', then waits until the test has seen that line and answers by creating a file
HANDSHAKE = """
import os, pathlib, sys, time
go = pathlib.Path(sys.argv[1])
if os.environ["RANK"] == "0":
    print("first", flush=True)
    for _ in range(600):
        if go.exists():
            break
        time.sleep(0.1)
    print("second" if go.exists() else "never answered", flush=True)
"""


def test_lines_arrive_while_the_run_is_going(write_script, tmp_path):
    go = tmp_path / "go"
    kernel = subprocess.Popen([sys.executable, "-u", "-c", KERNEL, str(write_script(HANDSHAKE)), str(go),
                               str(tmp_path / "run")], stdout=subprocess.PIPE, text=True)
    seen = []
    for line in kernel.stdout:
        seen.append(line.split("] ")[-1].strip())
        if seen[-1] == "first":
            go.touch()  # only possible if 'first' reached us while rank 0 still runs
    kernel.stdout.close()
    assert kernel.wait(timeout=60) == 0 and seen == ["first", "second"]


def test_a_line_written_in_parts_arrives_whole(write_script, tmp_path, capsys):
    # torchrun reads each rank's output every 0.1 s and prefixes what it read, half a line or not
    script = write_script("""
        import sys, time
        sys.stdout.write("half"); sys.stdout.flush(); time.sleep(0.5); print(" and the rest", flush=True)
        """)
    result = run_ddp(script, world_size=2, out_dir=tmp_path / "run", timeout=120)
    shown = capsys.readouterr().out.splitlines()
    for rank in (0, 1):
        assert f"[rank {rank}/2] half and the rest" in shown and f"[rank {rank}/2] half and the rest\n" in result.log


def test_crashing_rank_is_named_fast(write_script, tmp_path):
    script = write_script(CRASH)
    # a process-group timeout longer than the run's: the error must come from the crash, not from waiting
    with pytest.raises(DistributedRunError) as info:
        run_ddp(script, world_size=2, out_dir=tmp_path / "run", env={"DP_PG_TIMEOUT": "600"}, timeout=60)
    err = info.value
    assert not isinstance(err, RunTimeoutError)
    assert err.ranks[0] == 1 and err.exit_code == 1
    assert err.cause == "ValueError: boom on rank 1 at step 3"
    assert str(err).startswith("rank 1 failed with exit code 1: ValueError: boom on rank 1 at step 3")


@pytest.mark.long  # fault injection: the long tests (notebooks 06 and 07 run a hang and a killed rank by default)
def test_crash_without_record_is_still_named(write_script, tmp_path):
    script = write_script("import os\nif os.environ['RANK'] == '1':\n    raise KeyError('no record here')\n")
    with pytest.raises(DistributedRunError) as info:
        run_ddp(script, world_size=2, out_dir=tmp_path / "run", timeout=120)
    assert info.value.ranks[0] == 1 and "KeyError: 'no record here'" in str(info.value)


@pytest.mark.long  # fault injection: the long tests (notebooks 06 and 07 run a hang and a killed rank by default)
def test_hung_rank_fails_within_the_process_group_timeout(write_script, tmp_path):
    script = write_script(CRASH.replace('raise ValueError("boom on rank 1 at step 3")', "import time; time.sleep(600)"))
    with pytest.raises(DistributedRunError) as info:  # the group's 3 s, long before the run's 60 s
        run_ddp(script, world_size=2, out_dir=tmp_path / "run", env={"DP_PG_TIMEOUT": "3"}, timeout=60)
    assert not isinstance(info.value, RunTimeoutError)
    # the rank that reports is the one left waiting: the victim of the hung peer
    assert info.value.ranks[0] == 0 and "Timed out" in info.value.cause


@pytest.mark.long  # fault injection: the long tests
def test_a_rank_still_exiting_after_its_own_exception_keeps_the_blame(write_script, tmp_path):
    # rank 1 fails first but takes a second to exit (a thread to join); rank 0 then fails as its victim would
    script = write_script("""
        import os, threading, time
        if os.environ["RANK"] == "1":
            threading.Thread(target=time.sleep, args=(1.0,)).start()
            raise TimeoutError("Timed out waiting for the peer")
        time.sleep(0.3)
        raise RuntimeError("Connection closed by peer")
        """)
    with pytest.raises(DistributedRunError) as info:
        run_ddp(script, world_size=2, out_dir=tmp_path / "run", timeout=60)
    assert info.value.ranks == (1, 0) and "Timed out waiting for the peer" in info.value.cause


@pytest.mark.long  # fault injection: the long tests
def test_a_rank_that_starts_late_is_not_a_hang(write_script, tmp_path):
    script = write_script("""
        import os, time
        import torch, torch.distributed as dist
        from dp_helpers.tool import dist as dph
        if os.environ["RANK"] == "1":
            time.sleep(6)  # joins 6 s after rank 0: past the group's 3 s, inside the start-up's wait
        dph.worker(lambda info: dist.all_reduce(torch.ones(1)))
        """)
    result = run_ddp(script, world_size=2, out_dir=tmp_path / "run", env={"DP_PG_TIMEOUT": "3"}, timeout=90)
    assert result.returncode == 0  # and the collectives keep 3 s: test_hung_rank_fails_within_the_process_group_timeout


@pytest.mark.long
def test_timeout_kills_workers_that_ignore_signals(write_script, tmp_path):
    script, pid_dir = write_script(STUBBORN), tmp_path / "pids"
    pid_dir.mkdir()
    with pytest.raises(RunTimeoutError, match=r"run exceeded timeout=5s and was stopped\. 3 processes stopped; its out"
                                              r"put is above\nevery rank's full output: .*console\.log$"):
        run_ddp(script, pid_dir, world_size=2, out_dir=tmp_path / "run", timeout=5)
    pids = [int(p.read_text()) for p in pid_dir.glob("*.pid")]
    assert len(pids) == 2 and pids_alive(pids) == []


def start_kernel(script, pid_dir, out_dir):
    """A Python process running run_ddp in its main thread, like a notebook kernel; waits for both workers."""
    kernel = subprocess.Popen([sys.executable, "-c", KERNEL, str(script), str(pid_dir), str(out_dir)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    pids = [int(p.read_text()) for p in wait_for_files(pid_dir, 2)]
    import psutil

    tree = [p.pid for p in psutil.Process(kernel.pid).children(recursive=True)]
    return kernel, set(pids) | set(tree)


@pytest.mark.long  # fault injection: the long tests (notebooks 06 and 07 run a hang and a killed rank by default)
def test_interrupt_stops_the_whole_tree(write_script, tmp_path):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    kernel, pids = start_kernel(write_script(STUBBORN), pid_dir, tmp_path / "run")
    assert len(pids) >= 3  # torchrun and two workers
    kernel.send_signal(signal.SIGINT)  # the notebook's stop button
    _, err = kernel.communicate(timeout=30)
    assert "KeyboardInterrupt" in err
    assert pids_alive(pids) == []


@pytest.mark.long
def test_killed_kernel_takes_the_tree_with_it(write_script, tmp_path):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    kernel, pids = start_kernel(write_script(STUBBORN), pid_dir, tmp_path / "run")
    kernel.kill()  # no Python code runs in the kernel after this
    kernel.communicate(timeout=10)
    deadline = time.monotonic() + 20
    while pids_alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pids_alive(pids) == []


# A parent as busy as a Jupyter kernel: threads that import, allocate, log and hold locks while it starts
# processes. A pre-exec hook (Python code between fork and exec) can deadlock in such a child.
BUSY_PARENT = """
import json, logging, os, sys, threading, time
from dp_helpers.tool.launch.process import start
from dp_helpers.tool.launch import run_ddp
stop = threading.Event()
def busy(i):
    log = logging.getLogger(f"busy{i}")
    while not stop.is_set():
        __import__("email.mime.text"); json.dumps([list(range(100))] * 50); log.info("tick")
threads = [threading.Thread(target=busy, args=(i,), daemon=True) for i in range(4)]
[t.start() for t in threads]
for i in range(int(sys.argv[1])):
    proc = start([sys.executable, "-c", "print('child', end='')"], dict(os.environ))
    out, _ = proc.communicate(timeout=30)
    proc.stdout.close()
    assert proc.returncode == 0 and out == b"child", (i, proc.returncode, out)
run = run_ddp(sys.argv[2], world_size=2, out_dir=f"{sys.argv[3]}/run", echo=False, timeout=120)
assert "[rank 1/2] rank 1 of 2" in run.log
stop.set()
print("all started", flush=True)
"""


@pytest.mark.long
def test_launches_from_a_parent_with_busy_threads(write_script, tmp_path):
    script = write_script("import os\nprint('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])\n")
    proc = subprocess.run([sys.executable, "-c", BUSY_PARENT, "8", str(script), str(tmp_path)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0 and "all started" in proc.stdout, proc.stderr[-3000:]


def test_run_train_and_run_json(tmp_path, monkeypatch):
    from dp_helpers.tool.launch import run_train

    monkeypatch.chdir(tmp_path)
    run, weights = run_train(2, epochs=1, samples=8)  # a module target: dp_helpers.scripts.train
    assert run.summary["steps"] == 1 and set(weights) == {"fc.weight", "fc.bias"} and len(run.metrics) == 2
    assert (run.run_dir / "console.log").read_text() == run.log and "[rank 0/2] epoch 1/1" in run.log


def test_run_json_reads_what_rank_0_wrote(tmp_path, monkeypatch):
    from dp_helpers.tool.launch import runners

    def stand_in(script, *args, **kwargs):  # what a launch of collectives_demo leaves behind
        (tmp_path / "collectives.json").write_text('[{"all_gather": 1}, {"all_gather": 2}]')
        seen.append((script, args, kwargs["world_size"]))
        return runners.RunResult(0, tmp_path, 1.0, "", [], 2, "gloo")

    seen = []
    monkeypatch.setattr(runners, "run_ddp", stand_in)
    assert runners.run_json("collectives_demo", "collectives", "--x", world_size=2) == [{"all_gather": 1}, {"all_gather": 2}]
    assert seen == [("dp_helpers.scripts.collectives_demo", ("--x",), 2)]


# two local nodes == one node (weights, and each node's metrics in its own folder) is notebook 09's, run by this suite


@pytest.mark.long  # fault injection: the long tests (notebooks 06 and 07 run a hang and a killed rank by default)
def test_a_segfault_shows_the_ranks_own_last_lines(write_script, tmp_path):
    # a crash in native code leaves no Python exception: the rank's own output is the only clue
    script = write_script("""
        import faulthandler, os, signal, sys, time
        faulthandler.enable()
        if os.environ["RANK"] == "1":
            print("last words before the crash", flush=True)
            os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(30)
        """)
    with pytest.raises(DistributedRunError) as info:
        run_ddp(script, world_size=2, out_dir=tmp_path / "run", timeout=120, echo=False)
    message = str(info.value)
    assert info.value.ranks[0] == 1 and "exit code -11" in message
    own = message.split("rank 1's last lines:")[1].splitlines()[0]
    assert "last words before the crash" in own and "Segmentation fault" in own and len(message.splitlines()) <= 5


def test_a_forked_rank_runs_a_script_as_a_fresh_python_would(write_script, tmp_path):
    # on CPUs the ranks are forked from torchrun (--run-path --start-method fork): the script must not notice
    write_script("X = 'a sibling module'\n", name="sibling.py")
    script = write_script("""
        import atexit, signal, sys, torch
        import sibling  # found next to the script, as `python script.py` finds it
        atexit.register(print, "exit handler ran", flush=True)
        print(__name__, sys.argv[1:], sibling.X, signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
              signal.getsignal(signal.SIGINT) is signal.default_int_handler, flush=True)
        print("draw", torch.rand(1).item(), flush=True)  # unseeded: every fresh Python draws its own
        """)
    log = run_ddp(script, "--flag", "x", world_size=2, out_dir=tmp_path / "run", timeout=120, echo=False).log
    for rank in (0, 1):
        assert f"[rank {rank}/2] __main__ ['--flag', 'x'] a sibling module True True" in log
        assert f"[rank {rank}/2] exit handler ran" in log
    assert len({line.split()[-1] for line in log.splitlines() if " draw " in line}) == 2


@pytest.mark.long  # fault injection: the long tests (notebooks 06 and 07 run a hang and a killed rank by default)
def test_a_killed_rank_is_blamed_not_the_peer_that_lost_it(write_script, tmp_path):
    # forked workers: torchrun names the first failed rank it polls, and rank 0 dies within milliseconds of rank 1
    script = write_script("""
        import os, signal, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        for step in range(100):
            if dist.get_rank() == 1 and step == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            dist.all_reduce(torch.ones(1))
        """)
    with pytest.raises(DistributedRunError) as info:  # without the fix rank 0 was blamed in most runs here
        run_ddp(script, world_size=2, out_dir=tmp_path / "run", timeout=60, echo=False)
    assert str(info.value).startswith("rank 1 failed with exit code -9: killed by SIGKILL"), str(info.value)


def test_a_forked_rank_ends_as_a_fresh_python_would(write_script, tmp_path):
    # sys.exit(main()) with main returning None is a success (torchrun waited forever for a forked rank's return)
    done = write_script("import sys\ndef main():\n    print('ran', flush=True)\nsys.exit(main())\n", name="ok.py")
    assert "[rank 1/2] ran" in run_ddp(done, world_size=2, out_dir=tmp_path / "ok", timeout=60, echo=False).log
    # an exception's traceback is printed by the rank, from the script's own frame, as Python prints it
    boom = write_script("def f():\n    raise ValueError('boom')\nf()\n", name="boom.py")
    with pytest.raises(DistributedRunError) as info:
        run_ddp(boom, world_size=2, out_dir=tmp_path / "boom", timeout=60, echo=False)
    log = (info.value.run_dir / "console.log").read_text().splitlines()
    # the rank that fails first is stopped by no one; torchrun may stop the other before it prints (a race on load)
    told = [[line for line in log if line.startswith(f"[rank {r}/2]")] for r in (0, 1)]
    told = next(lines for lines in told if any("Traceback" in line for line in lines))
    prefix = told[0].split("]")[0] + "]"
    assert told[:2] == [f"{prefix} Traceback (most recent call last):", f'{prefix}   File "{boom}", line 3, in <module>']
    assert f"{prefix} ValueError: boom" in told
