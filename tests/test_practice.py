"""DDP in practice, for real: accumulation, BatchNorm statistics, the wrapper's state_dict keys (Join and a collective on rank 0 only: notebook 06)."""

import pytest
import torch

from dp_helpers.scripts import ddp_internals, pitfall_runs
from dp_helpers.tool.config import TrainConfig
from dp_helpers.tool.reference import train_reference
from tests.ranks import RankError
from tests.test_train import train_rank

pytestmark = pytest.mark.slow


def train(pools, out, world_size, **changes):
    """The train job's train() on world_size ranks of a pool; returns (summary, final weights)."""
    summary = pools.get(world_size).run(train_rank, TrainConfig(**changes), run_dir=out)[0]
    return summary, torch.load(out / "model.pt", map_location="cpu", weights_only=True)


def run_case(info, name: str):
    """One pitfall case on this rank."""
    return pitfall_runs.CASES[name](info)


def test_no_sync_accumulation_equals_the_large_batch_and_saves_all_reduces(tmp_path, pools):
    cfg = {"batch_size": 5, "grad_accum_steps": 2, "epochs": 3, "lr": 0.5}
    quiet, weights = train(pools, tmp_path / "quiet", 2, **cfg)
    loud, loud_weights = train(pools, tmp_path / "loud", 2, use_no_sync=False, **cfg)
    reference = train_reference(TrainConfig(batch_size=10, epochs=3, lr=0.5), world_size=2)  # global 2 x 5 x 2
    torch.testing.assert_close(weights, reference.state_dict)
    torch.testing.assert_close(loud_weights, reference.state_dict)
    steps = quiet["steps"]
    assert steps == 15 and quiet["allreduce_calls"] == steps  # one all-reduce per optimizer step
    assert loud["allreduce_calls"] == 2 * steps  # one per micro-batch without no_sync


def test_batchnorm_statistics(tmp_path, pools):
    reference = train_reference(TrainConfig(model="bn", epochs=3, lr=0.5), world_size=2)
    _, local = train(pools, tmp_path / "local", 2, model="bn", epochs=3, lr=0.5)
    _, synced = train(pools, tmp_path / "synced", 2, model="bn", bn_sync="allreduce", epochs=3, lr=0.5)
    torch.testing.assert_close(synced, reference.state_dict)  # global statistics by all-reduce == one process
    gap = max((local[k].float() - v.float()).abs().max().item() for k, v in reference.state_dict.items())
    assert gap > 1e-2  # per-rank statistics drift from the single-process model


def test_syncbn_is_refused_on_cpu(tmp_path, pools):
    with pytest.raises(RankError, match="SyncBatchNorm refuses CPU tensors"):
        train(pools, tmp_path / "run", 2, model="bn", bn_sync="syncbn", epochs=1)


# resume == an uninterrupted run (history, unwrapped keys, no .tmp left) is notebook 07's section 1, run by this suite


def test_module_prefix(pools):
    found = pools.get(2).run(run_case, "module-prefix")[0]  # rank 0's
    assert found["wrapper_keys"] == ["module.fc.weight", "module.fc.bias"]
    assert 'Unexpected key(s) in state_dict: "module.fc.weight"' in found["error"]
    assert found["module_keys"] == ["fc.weight", "fc.bias"]


def run_experiments(info, argv: list[str]) -> dict:
    """ddp_internals' experiments on this rank, by name."""
    args = ddp_internals.parse_args(argv)
    return {name: ddp_internals.EXPERIMENTS[name](info, args) for name in args.experiment}


def test_ddp_internals(pools):
    exps = ("buckets", "memory", "fp16", "precision")
    got = pools.get(2).run(run_experiments, ["--experiment", *exps])[0]
    buckets = {r["setting"]: r["bucket_bytes_per_step"] for r in got["buckets"]}
    total = sum(buckets["default"][0])
    assert all(len(b[0]) == 1 for name, b in buckets.items() if name != "find_unused_parameters")  # step 0: one bucket
    assert buckets["default"][1][0] <= 1.1 * 2**20 and len(buckets["default"][1]) == 2  # rebuilt: a small first bucket
    assert buckets["bucket_cap_mb=25"][1] == [total] and buckets["bucket_cap_mb=1"][1] == buckets["bucket_cap_mb=0.25"][1]
    assert len(buckets["find_unused_parameters"][0]) > 1 and buckets["find_unused_parameters"][0] == buckets["find_unused_parameters"][2]
    plain, view = got["memory"]
    assert plain["bytes_held"] == 2 * plain["parameter_bytes"] and view["bytes_held"] == view["parameter_bytes"]
    assert got["fp16"]["fp16"]["bytes"] * 2 == got["fp16"]["fp32"]["bytes"]
    prec = got["precision"]
    assert prec["autocast bf16"]["bytes"] == prec["fp32"]["bytes"] == 2 * prec["autocast bf16 + fp16_compress_hook"]["bytes"]
    assert prec["autocast bf16"]["grad_dtype"] == "torch.float32"


def test_fixed_port_in_use_message():
    from dp_helpers.course.pitfalls import fixed_port_in_use

    message = fixed_port_in_use()
    assert "EADDRINUSE" in message or "Address already in use" in message  # torch's wording changed over versions
