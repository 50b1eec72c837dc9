"""examples/: the scripts a learner takes home are plain PyTorch, run under bare torchrun, and equal one device."""

import ast
import json
import os
import runpy
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO

EXAMPLES = REPO / "examples"


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_nothing_comes_from_the_course(name):
    tree = ast.parse((EXAMPLES / name).read_text())
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    plain = {"argparse", "contextlib", "gc", "json", "math", "os", "pathlib", "shutil", "sys", "datetime", "time", "torch"}
    plain |= {p.stem for p in EXAMPLES.glob("*.py")}  # one example may take another's model and data
    assert modules and all(m.split(".")[0] in plain for m in modules), modules


@pytest.mark.parametrize("name", ["train_ddp.py", "train_ddp_real.py", "train_fsdp.py", "checkpoint_async.py", "train_elastic.py"])
def test_without_torchrun_it_says_how_to_start_it(monkeypatch, name):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setattr(sys, "argv", [name])
    with pytest.raises(SystemExit, match=f"start me with torchrun: torchrun --standalone --nproc-per-node 2 {name}"):
        runpy.run_path(str(EXAMPLES / name), run_name="__main__")


def test_on_a_torch_without_public_fully_shard_the_fsdp_script_says_which_it_needs(monkeypatch):
    import torch.distributed.fsdp as fsdp
    monkeypatch.delattr(fsdp, "fully_shard")  # as on torch < 2.6, where it lived in torch.distributed._composable
    with pytest.raises(SystemExit, match=r"train_fsdp.py needs torch >= 2.6 .*this is torch "):
        runpy.run_path(str(EXAMPLES / "train_fsdp.py"), run_name="__main__")


@pytest.mark.long  # an equivalence run of the examples (notebooks 00, 07 and 08 run them through the launcher)
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


def torchrun(tmp_path, nproc: int, *args: str) -> subprocess.CompletedProcess:
    """examples/train_ddp_real.py under bare torchrun on nproc gloo processes, in tmp_path."""
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")  # one thread each: the same sums
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
                           str(EXAMPLES / "train_ddp_real.py"), "--epochs", "3", *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.long
@pytest.mark.slow
def test_the_real_job_script_equals_one_process_and_resumes_where_it_stopped(tmp_path):
    one = torchrun(tmp_path, 1, "--batch-size", "48", "--out", "one.pt")  # the global batch of 3 x 16
    three = torchrun(tmp_path, 3, "--out", "three.pt")
    torchrun(tmp_path, 2, "--batch-size", "24", "--checkpoint", "ck.pt", "--stop-after", "1")
    resumed = torchrun(tmp_path, 2, "--batch-size", "24", "--checkpoint", "ck.pt", "--out", "resumed.pt")
    reference = torch.load(tmp_path / "one.pt")
    for name in ("three.pt", "resumed.pt"):  # 3 ranks x 16, and 2 ranks x 24 stopped after epoch 1 and resumed
        torch.testing.assert_close(torch.load(tmp_path / name), reference, rtol=1e-5, atol=1e-6)
    assert "resumed from ck.pt at epoch 2" in resumed.stdout and len(resumed.stdout.splitlines()) == 3
    assert [ln.split("  held-out")[0] for ln in three.stdout.splitlines()] == \
        [ln.split("  held-out")[0] for ln in one.stdout.splitlines()]  # train losses printed alike, once
    assert float(one.stdout.split("accuracy ")[-1].rstrip("%\n")) > 80 and not list(tmp_path.glob("*.tmp*"))


@pytest.mark.long
@pytest.mark.slow
def test_the_real_job_script_trains_in_bf16_close_to_fp32(tmp_path):
    torchrun(tmp_path, 2, "--batch-size", "24", "--out", "fp32.pt")
    torchrun(tmp_path, 2, "--batch-size", "24", "--precision", "bf16", "--out", "bf16.pt")
    torch.testing.assert_close(torch.load(tmp_path / "bf16.pt"), torch.load(tmp_path / "fp32.pt"), rtol=0.1, atol=0.05)


def fsdp_run(tmp_path, nproc: int, *args: str) -> subprocess.CompletedProcess:
    """examples/train_fsdp.py under bare torchrun on nproc gloo processes, in tmp_path, 12 steps of 24 windows."""
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
                           str(EXAMPLES / "train_fsdp.py"), "--steps", "12", "--eval-every", "12", "--sample", "0",
                           *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def one_device_lm(tmp_path) -> tuple[dict, float]:
    """The reference, examples/train_fsdp_one_device.py: 12 steps of 24 windows; its weights and held-out loss."""
    done = subprocess.run([sys.executable, str(EXAMPLES / "train_fsdp_one_device.py"), "--steps", "12", "--batch-size",
                           "24", "--eval-every", "12", "--out", "one.pt"], env=dict(os.environ, OMP_NUM_THREADS="1"),
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(tmp_path / "one.pt"), held_out_loss(done.stdout)


def held_out_loss(stdout: str) -> float:
    """The last held-out loss a run printed."""
    return float(stdout.split("held-out loss ")[-1].split()[0])


@pytest.mark.long
@pytest.mark.slow
def test_the_fsdp_script_equals_one_device_stopped_and_resumed_at_another_world_size(tmp_path):
    fsdp_run(tmp_path, 2, "--batch-size", "6", "--grad-accum-steps", "2", "--checkpoint", "ck", "--stop-after", "6",
             "--save-every", "3")
    assert [p.name for p in (tmp_path / "ck").iterdir()] == ["step-6"]  # the older snapshot dropped, no .tmp left
    resumed = fsdp_run(tmp_path, 3, "--batch-size", "4", "--grad-accum-steps", "2", "--checkpoint", "ck",
                       "--out", "resumed.pt")  # 3 x 4 x 2 = the same 24 windows per step
    weights, held_out = one_device_lm(tmp_path)
    torch.testing.assert_close(torch.load(tmp_path / "resumed.pt"), weights, rtol=1e-4, atol=1e-5)
    assert resumed.stdout.splitlines()[0] == "resumed from ck/step-6 at step 7 on 3 ranks"
    # 8 held-out windows on 3 ranks: one rank scores a stand-in it does not count, and the mean is exact
    assert held_out_loss(resumed.stdout) == pytest.approx(held_out, abs=1e-4)
    assert held_out < 3.3  # from about 4.0 (55 characters, uniform) in 12 steps


@pytest.mark.long
@pytest.mark.slow
def test_the_fsdp_script_as_hsdp_equals_one_device_and_bf16_stays_close(tmp_path):
    fsdp_run(tmp_path, 4, "--batch-size", "6", "--replicas", "2", "--out", "hsdp.pt")  # 2 replicas x 2 shards
    fsdp_run(tmp_path, 2, "--batch-size", "12", "--precision", "bf16", "--out", "bf16.pt")
    weights, _ = one_device_lm(tmp_path)
    torch.testing.assert_close(torch.load(tmp_path / "hsdp.pt"), weights, rtol=1e-4, atol=1e-5)
    bf16 = torch.load(tmp_path / "bf16.pt")
    assert all(t.dtype == torch.float32 for t in bf16.values())  # bf16 computes; the shards and steps stay fp32
    torch.testing.assert_close(bf16, weights, rtol=0.1, atol=0.02)


def test_the_fsdp_script_resumes_from_complete_snapshots_only(tmp_path):
    latest = runpy.run_path(str(EXAMPLES / "train_fsdp.py"))["latest_checkpoint"]
    assert latest(str(tmp_path)) == (None, 0)
    for name in ("step-9", "step-10", "step-11.tmp"):  # step 11 was being written when the run stopped
        (tmp_path / name).mkdir()
    assert latest(str(tmp_path)) == (tmp_path / "step-10", 10)



def checkpointing(tmp_path, *args: str, fails: bool = False) -> subprocess.CompletedProcess:
    """examples/checkpoint_async.py under bare torchrun on 2 gloo processes, in tmp_path; its JSON line read back."""
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(EXAMPLES / "checkpoint_async.py"), "--steps", "20", *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode != 0) == fails, done.stderr[-3000:]
    done.report = None if fails else json.loads(done.stdout.splitlines()[-1])
    return done


@pytest.mark.long
@pytest.mark.slow
def test_an_async_checkpoint_stalls_less_and_resumes_as_a_synchronous_one(tmp_path):
    stalled = {}
    for mode in ("sync", "async"):  # one save at step 10 to a disk 0.5 s slow, then a resume to step 20
        first = checkpointing(tmp_path, "--mode", mode, "--checkpoint", mode, "--save-every", "10", "--stop-after",
                              "10", "--slow-disk", "0.5")
        stalled[mode] = max(first.report["stalled_s"])
        resumed = checkpointing(tmp_path, "--mode", mode, "--checkpoint", mode, "--save-every", "10", "--out",
                                f"{mode}.pt")
        assert resumed.stdout.startswith("resumed at step 11") and resumed.report["steps"] == 10
    checkpointing(tmp_path, "--save-every", "100", "--out", "uninterrupted.pt")
    weights = torch.load(tmp_path / "uninterrupted.pt")
    for mode in ("sync", "async"):  # Adam's moments came back too: bit for bit the run that never stopped
        torch.testing.assert_close(torch.load(tmp_path / f"{mode}.pt"), weights, rtol=0, atol=0)
    assert stalled["sync"] >= 0.5 and stalled["async"] < 0.5 * stalled["sync"], stalled


@pytest.mark.long
@pytest.mark.slow
def test_rank0_saving_alone_times_the_others_out_and_an_async_save_does_not(tmp_path):
    slow = ("--save-every", "10", "--slow-disk", "4", "--timeout", "2")  # a save twice as long as the group waits
    failed = checkpointing(tmp_path, "--mode", "rank0", "--checkpoint", "r0", *slow, fails=True)
    assert "Timed out" in failed.stderr and "[rank1]" in failed.stderr
    assert checkpointing(tmp_path, "--mode", "async", "--checkpoint", "as", *slow).report["steps"] == 20


def test_a_checkpoint_counts_once_it_is_complete(tmp_path):
    latest = runpy.run_path(str(EXAMPLES / "checkpoint_async.py"))["latest"]
    assert latest(tmp_path) == (None, 0)
    for name in ("step-5", "step-10", "step-15"):
        (tmp_path / name).mkdir()
    (tmp_path / "step-10" / ".metadata").touch()  # DCP writes it last: step 5 and 15 were being written
    (tmp_path / "step-12.tmp").touch()
    assert latest(tmp_path) == (tmp_path / "step-10", 10)
    (tmp_path / "step-12.tmp").rename(tmp_path / "step-12.pt")
    assert latest(tmp_path) == (tmp_path / "step-12.pt", 12)


# On a CUDA GPU (tests/gpu_check.sh): one rank per GPU on nccl, and fp16 with its GradScaler, which the scripts run
# on GPUs only. Two ranks on one GPU are not tried: each script then falls back to CPU ranks on gloo, tested above.
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def on_a_gpu(test):
    """Mark a test as a GPU check: skipped, with the reason, on a machine without a CUDA GPU."""
    for mark in (pytest.mark.gpu, pytest.mark.slow,
                 pytest.mark.skipif(GPUS < 1, reason=f"runs the examples on a CUDA GPU; found {GPUS}")):
        test = mark(test)
    return test


def gpu_run(tmp_path, script: str, nproc: int | None, *args: str) -> str:
    """An example on the GPU, under bare torchrun with nproc ranks (plain Python when None); what it printed."""
    launch = [] if nproc is None else ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    done = subprocess.run([sys.executable, *launch, str(EXAMPLES / script), *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def on_cuda(path) -> dict:
    """A saved state_dict, asserted to have been saved from a GPU (so the run trained there)."""
    state = torch.load(path)
    assert all(t.device.type == "cuda" for t in state.values()), {k: t.device for k, t in state.items()}
    return state


@on_a_gpu
def test_on_a_gpu_ddp_on_nccl_equals_one_device(tmp_path):
    gpu_run(tmp_path, "train_ddp.py", 1, "--epochs", "2", "--batch-size", "32", "--out", "ddp.pt")
    gpu_run(tmp_path, "train_one_device.py", None, "--epochs", "2", "--batch-size", "32", "--out", "one.pt")
    torch.testing.assert_close(on_cuda(tmp_path / "ddp.pt"), on_cuda(tmp_path / "one.pt"), rtol=1e-5, atol=1e-6)


@on_a_gpu
def test_on_a_gpu_the_real_job_in_every_precision_resumes_where_it_stopped(tmp_path):
    gpu_run(tmp_path, "train_ddp_real.py", 1, "--batch-size", "32", "--epochs", "3", "--out", "fp32.pt")
    fp32 = on_cuda(tmp_path / "fp32.pt")
    for precision in ("bf16", "fp16"):
        out = gpu_run(tmp_path, "train_ddp_real.py", 1, "--batch-size", "32", "--epochs", "3", "--precision",
                      precision, "--out", f"{precision}.pt")
        torch.testing.assert_close(on_cuda(tmp_path / f"{precision}.pt"), fp32, rtol=0.1, atol=0.05)
        assert float(out.split("accuracy ")[-1].rstrip("%\n")) > 80, out
    ck = ("--batch-size", "32", "--epochs", "3", "--precision", "fp16", "--checkpoint", "ck.pt")
    gpu_run(tmp_path, "train_ddp_real.py", 1, *ck, "--stop-after", "1")
    out = gpu_run(tmp_path, "train_ddp_real.py", 1, *ck, "--out", "resumed.pt")  # the GradScaler's state too
    assert "resumed from ck.pt at epoch 2" in out
    torch.testing.assert_close(on_cuda(tmp_path / "resumed.pt"), on_cuda(tmp_path / "fp16.pt"), rtol=1e-5, atol=1e-6)


@on_a_gpu
def test_on_a_gpu_fsdp_equals_one_device_and_resumes_in_bf16(tmp_path):
    steps = ("--steps", "12", "--eval-every", "12", "--sample", "0", "--batch-size", "24")
    gpu_run(tmp_path, "train_fsdp.py", 1, *steps, "--out", "fsdp.pt")  # fp32 on the GPU, against the CPU reference
    weights, _ = one_device_lm(tmp_path)
    torch.testing.assert_close(torch.load(tmp_path / "fsdp.pt"), weights, rtol=1e-3, atol=1e-4)
    gpu_run(tmp_path, "train_fsdp.py", 1, *steps, "--precision", "bf16", "--out", "bf16.pt")
    gpu_run(tmp_path, "train_fsdp.py", 1, *steps, "--precision", "bf16", "--checkpoint", "ck", "--save-every", "6",
            "--stop-after", "6")
    out = gpu_run(tmp_path, "train_fsdp.py", 1, *steps, "--precision", "bf16", "--checkpoint", "ck", "--out", "re.pt")
    assert out.splitlines()[0] == "resumed from ck/step-6 at step 7 on 1 ranks"
    torch.testing.assert_close(torch.load(tmp_path / "re.pt"), torch.load(tmp_path / "bf16.pt"), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.load(tmp_path / "bf16.pt"), weights, rtol=0.1, atol=0.02)
