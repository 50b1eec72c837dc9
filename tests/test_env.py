"""dp_helpers.tool.env: the launch choice and the doctor report; the backend checks of request.py."""

import pytest

from dp_helpers.tool import env, request


@pytest.mark.parametrize("gpus, nccl, expected", [
    (0, False, ("gloo", 2)), (1, True, ("gloo", 2)), (2, True, ("nccl", 2)),
    (8, True, ("nccl", 8)), (2, False, ("gloo", 2)),
])
def test_choose_launch(gpus, nccl, expected):
    backend, world_size, reason = env.choose_launch(gpus, nccl)
    assert (backend, world_size) == expected
    assert reason and str(gpus if gpus else "no GPU") in reason


def test_resolve_backend_auto():
    assert request.resolve_backend("auto", 2, n_gpus=0, has_nccl=False) == "gloo"
    assert request.resolve_backend("auto", 2, n_gpus=2, has_nccl=True) == "nccl"
    assert request.resolve_backend("auto", 4, n_gpus=2, has_nccl=True) == "gloo"  # more ranks than GPUs
    assert request.resolve_backend("auto", 4, n_gpus=2, has_nccl=True, local_world_size=2) == "nccl"


@pytest.mark.parametrize("backend, gpus, nccl, words", [
    ("mpi", 0, False, "backend must be one of auto, gloo, nccl, got 'mpi'"),
    ("Gloo", 0, False, "got 'Gloo'"),
    ("nccl", 0, False, "not built into this torch"),
    ("nccl", 1, True, "2 processes per node but 1 GPU(s) visible"),
])
def test_resolve_backend_refuses(backend, gpus, nccl, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        request.resolve_backend(backend, 2, n_gpus=gpus, has_nccl=nccl)


def test_report_on_this_machine():
    rep = env.report()
    assert rep.cpu_cores >= 1 and rep.gpu_count == len(rep.gpu_names)
    assert (rep.backend, rep.world_size, rep.reason) == env.choose_launch(rep.gpu_count, rep.nccl_available)
    assert rep.cuda_initialized is False  # asking about GPUs must not initialise CUDA
    text = env.format_report(rep)
    for label in ("cpu cores", "gpus", "platform", "cuda initialised here", "train would use", "why"):
        assert label in text
    assert set(rep.as_dict()) >= {"cpu_cores", "gpu_count", "platform", "backend", "world_size", "reason"}


@pytest.mark.parametrize("var, expected", [("KAGGLE_KERNEL_RUN_TYPE", "kaggle"), ("COLAB_RELEASE_TAG", "colab")])
def test_detect_platform(monkeypatch, var, expected):
    for key in ("KAGGLE_KERNEL_RUN_TYPE", "COLAB_RELEASE_TAG"):
        monkeypatch.delenv(key, raising=False)
    assert env.detect_platform() == "local"
    monkeypatch.setenv(var, "x")
    assert env.detect_platform() == expected


def test_seed_everything_repeats():
    import torch

    from dp_helpers.tool.training import seed_everything

    seed_everything(3)
    a = torch.rand(3)
    seed_everything(3)
    torch.testing.assert_close(torch.rand(3), a)


def test_doctor_command_prints_the_report(capsys):
    from dp_helpers.tool.cli import main

    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    rep = env.report()
    assert f"backend={rep.backend} world_size={rep.world_size}" in out and rep.reason in out


def test_device_follows_the_backend():
    import torch

    assert env.device_for("nccl", 1) == torch.device("cuda", 1)
    assert env.device_for("gloo", 1) == torch.device("cpu")


@pytest.mark.parametrize("value, threads", [(None, 1), ("3", 3), ("4,2", 4), ("0", 1), ("many", 1)])
def test_worker_threads_follow_omp_num_threads(monkeypatch, value, threads):
    if value is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert env.worker_threads() == threads


def test_launched_workers_of_every_world_size_get_the_reference_threads(monkeypatch, tmp_path):
    from dp_helpers.tool.launch.command import child_env

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    for world_size in (1, 2, 4):  # one thread each, whatever the cores: W = 1 and W = 2 sum alike
        assert child_env(tmp_path, world_size, "gloo", None)["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert child_env(tmp_path, 2, "gloo", None)["OMP_NUM_THREADS"] == str(env.worker_threads()) == "3"


def test_worker_numerics_computes_with_the_workers_threads_and_restores(monkeypatch):
    import torch

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with env.worker_numerics():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
