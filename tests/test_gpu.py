"""GPU paths: nccl training, SyncBatchNorm, mixed precision, gloo on a GPU. Skipped, with the reason, without GPUs.

`bash tests/gpu_check.sh` runs every GPU check (these and the real DataParallel primitives) with one line each.
"""

import pytest
import torch

from dp_helpers.tool import env
from dp_helpers.tool.config import TrainConfig
from dp_helpers.tool.launch import run_ddp
from dp_helpers.tool.models import build_model
from dp_helpers.tool.reference import train_reference
from dp_helpers.tool.training import precision_problem, train_steps

N_GPUS = env.gpu_count()
needs_gpu = pytest.mark.skipif(N_GPUS < 1 or not env.nccl_available(),
                               reason=f"needs a CUDA GPU and NCCL; found {N_GPUS} GPU(s), nccl={env.nccl_available()}")
pytestmark = [pytest.mark.gpu, needs_gpu]


def test_nccl_training_matches_the_reference(tmp_path):
    world_size = min(N_GPUS, 2)
    cfg = TrainConfig(epochs=3, batch_size=20 // world_size)
    result = run_ddp("dp_helpers.scripts.train", *cfg.as_args(), world_size=world_size, backend="nccl",
                     out_dir=tmp_path / "run", timeout=300, echo=False)
    assert result.summary["backend"] == "nccl" and result.summary["device"].startswith("cuda")
    weights = torch.load(result.run_dir / "model.pt", map_location="cpu", weights_only=True)
    reference = train_reference(cfg, world_size=world_size)
    # GPU kernels reduce in another order than the CPU reference: a looser tolerance
    torch.testing.assert_close(weights, reference.state_dict, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(N_GPUS < 2, reason=f"SyncBatchNorm across ranks needs >= 2 GPUs; found {N_GPUS}")
def test_syncbn_matches_the_reference(tmp_path):
    cfg = TrainConfig(model="bn", bn_sync="syncbn", epochs=3, lr=0.5)
    result = run_ddp("dp_helpers.scripts.train", *cfg.as_args(), world_size=2, backend="nccl",
                     out_dir=tmp_path / "run", timeout=300, echo=False)
    weights = torch.load(result.run_dir / "model.pt", map_location="cpu", weights_only=True)
    reference = train_reference(TrainConfig(model="bn", epochs=3, lr=0.5), world_size=2)
    torch.testing.assert_close(weights, reference.state_dict, rtol=1e-4, atol=1e-5)


def test_bench_gpu_section_times_every_precision(tmp_path):
    from dp_helpers.tool.bench import BenchConfig, gpu_section

    cfg = BenchConfig([1], batches=[64], default_batch=64, steps=2, rounds=1, warmup=1, hidden=64, depth=2)
    out = gpu_section(cfg, tmp_path, lambda n=1: None)
    assert out["single"]["fp32"] > 0 and out["single"]["fp16"] > 0  # fp16: autocast + GradScaler on nccl
    bf16 = out["single"]["bf16"]
    assert (isinstance(bf16, float) and bf16 > 0) or "bfloat16" in bf16["skipped"]
    assert out["speedup_over_fp32"]["fp32"] == 1.0


@pytest.mark.skipif(N_GPUS < 2, reason=f"real nn.DataParallel across GPUs needs >= 2; found {N_GPUS}")
def test_bench_times_real_dataparallel(tmp_path):
    result = run_ddp("dp_helpers.scripts.bench_worker", "--mode", "dataparallel", "--devices", "2", "--batches", "32",
                     "--steps", "2", "--warmup", "1", world_size=1, backend="nccl", out_dir=tmp_path / "run",
                     echo=False, timeout=300)
    assert (result.run_dir / "bench.json").exists()


def test_syncbn_on_one_rank_matches_the_reference(tmp_path):
    # one rank: SyncBatchNorm's statistics are the batch's own, so it must equal one process exactly
    cfg = TrainConfig(model="bn", bn_sync="syncbn", epochs=2, lr=0.5, batch_size=20)
    result = run_ddp("dp_helpers.scripts.train", *cfg.as_args(), world_size=1, backend="nccl",
                     out_dir=tmp_path / "run", timeout=300, echo=False)
    weights = torch.load(result.run_dir / "model.pt", map_location="cpu", weights_only=True)
    reference = train_reference(TrainConfig(model="bn", epochs=2, lr=0.5, batch_size=20))
    torch.testing.assert_close(weights, reference.state_dict, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("precision, tol", [("fp16", 2e-3), ("bf16", 2e-2)])
def test_autocast_and_grad_scaler_on_a_gpu(precision, tol):
    device = env.gpu_device(0)
    problem = precision_problem(device, precision)
    if problem:
        pytest.skip(problem)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 8, generator=gen).to(device), torch.rand(64, generator=gen).to(device)
    low = train_steps(build_model("mlp", 8, seed=1).to(device), x, y, 3, lr=0.5, precision=precision)
    full = train_steps(build_model("mlp", 8, seed=1).to(device), x, y, 3, lr=0.5)
    torch.testing.assert_close(low.state_dict(), full.state_dict(), rtol=tol, atol=tol)


def test_two_processes_share_one_gpu_on_gloo(write_script, tmp_path):
    script = write_script("""
        import torch, torch.distributed as dist
        from dp_helpers.tool import dist as dph
        from dp_helpers.tool.env import gpu_device

        def main(info):
            t = torch.full((3,), float(info.rank + 1), device=gpu_device(0))  # both ranks on GPU 0
            dist.all_reduce(t)  # gloo copies through host memory
            assert t.device.type == "cuda" and t.tolist() == [3.0, 3.0, 3.0], t
            dph.print0(info, "shared GPU ok")

        dph.worker(main, backend="gloo")
        """)
    result = run_ddp(script, world_size=2, backend="gloo", out_dir=tmp_path / "run", timeout=300, echo=False)
    assert "[rank 0/2] shared GPU ok" in result.log
