"""GPU paths: nccl training and device placement. Skipped, with the reason, on machines without the GPUs."""

import pytest
import torch

from dp_helpers import env
from dp_helpers.config import TrainConfig
from dp_helpers.launch import run_ddp
from dp_helpers.reference import train_reference

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
    from dp_helpers.bench import BenchConfig, gpu_section

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
