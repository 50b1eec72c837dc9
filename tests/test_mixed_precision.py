"""dp_helpers.tool.training's mixed-precision step: fp32 is exactly train_step; fp16 (with GradScaler) and bf16 stay close.

fp16/bf16 run here under CPU autocast to test the code path; their speed is measured on GPUs only (bench).
"""


import pytest
import torch

from dp_helpers.tool.models import build_model
from dp_helpers.tool.training import autocast, grad_scaler, precision_problem, train_steps

CPU = torch.device("cpu")


def trained(precision: str | None, steps: int = 3) -> dict:
    """An MLP after a few steps: train_step when precision is None, else mixed_precision_step."""
    torch.manual_seed(0)
    x, y = torch.randn(32, 8), torch.rand(32)
    return train_steps(build_model("mlp", 8, seed=1), x, y, steps, lr=0.5, precision=precision).state_dict()


def test_fp32_is_exactly_the_plain_step():
    torch.testing.assert_close(trained("fp32"), trained(None), rtol=0, atol=0)


@pytest.mark.parametrize("precision, tol", [("fp16", 2e-3), ("bf16", 2e-2)])
def test_low_precision_stays_close_and_differs(precision, tol):
    low, full = trained(precision), trained(None)
    torch.testing.assert_close(low, full, rtol=tol, atol=tol)  # significant bits: bf16 8, fp16 11, fp32 24
    assert any(not torch.equal(low[k], full[k]) for k in full)  # it really ran in another precision


def test_the_scaler_is_on_for_fp16_only():
    assert grad_scaler(CPU, "fp16").is_enabled()
    assert not grad_scaler(CPU, "bf16").is_enabled() and not grad_scaler(CPU, "fp32").is_enabled()
    with autocast(CPU, "bf16"):
        assert torch.ones(2, 2).matmul(torch.ones(2, 2)).dtype == torch.bfloat16
    with autocast(CPU, "fp32"):
        assert torch.ones(2, 2).matmul(torch.ones(2, 2)).dtype == torch.float32


def test_precision_problems_are_one_sentence():
    assert precision_problem(CPU, "fp16") is None and precision_problem(CPU, "bf16") is None
    assert precision_problem(CPU, "fp8") == "precision must be one of fp32, fp16, bf16, got 'fp8'."


@pytest.mark.slow
@pytest.mark.slow
def test_bench_worker_runs_ddp_with_fp16_and_the_scaler(pools):
    # GradScaler + autocast under DDP on 2 gloo ranks: the path the GPU benchmark takes, here on CPUs
    from dp_helpers.scripts import bench_worker

    rows = pools.get(2).run(bench_worker.measure, ["--mode", "train", "--ddp", "--precision", "fp16", "--batches", "16",
                                                   "--steps", "2", "--warmup", "1", "--hidden", "32", "--depth", "2"])
    assert len(rows) == 2 and all(r["train"][model]["16"] > 0 for r in rows for model in ("independent", "ddp"))
