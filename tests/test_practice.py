"""DDP in practice, for real: accumulation, BatchNorm statistics, checkpoints, Join, the classic mistakes, evaluation."""

import json
import time

import pytest
import torch

from dp_helpers.config import TrainConfig
from dp_helpers.launch import DistributedRunError, run_ddp, run_json, run_train
from dp_helpers.reference import train_reference

pytestmark = pytest.mark.slow


def train(out, world_size, **changes):
    """The train worker under run_ddp; returns (RunResult, final weights)."""
    return run_train(world_size, out_dir=out, timeout=300, **changes)


def case(tmp_path, name, world_size=2, timeout_env="5"):
    """One pitfall_runs case; returns rank 0's JSON."""
    return run_json("pitfall_runs", name, "--case", name, world_size=world_size, out_dir=tmp_path / name,
                    env={"DP_PG_TIMEOUT": timeout_env}, timeout=120)[0]


def test_no_sync_accumulation_equals_the_large_batch_and_saves_all_reduces(tmp_path):
    cfg = {"batch_size": 5, "grad_accum_steps": 2, "epochs": 3, "lr": 0.5}
    quiet, weights = train(tmp_path / "quiet", 2, **cfg)
    loud, loud_weights = train(tmp_path / "loud", 2, use_no_sync=False, **cfg)
    reference = train_reference(TrainConfig(batch_size=10, epochs=3, lr=0.5), world_size=2)  # global 2 x 5 x 2
    torch.testing.assert_close(weights, reference.state_dict)
    torch.testing.assert_close(loud_weights, reference.state_dict)
    steps = quiet.summary["steps"]
    assert steps == 15 and quiet.summary["allreduce_calls"] == steps  # one all-reduce per optimizer step
    assert loud.summary["allreduce_calls"] == 2 * steps  # one per micro-batch without no_sync


def test_batchnorm_statistics(tmp_path):
    reference = train_reference(TrainConfig(model="bn", epochs=3, lr=0.5), world_size=2)
    _, local = train(tmp_path / "local", 2, model="bn", epochs=3, lr=0.5)
    _, synced = train(tmp_path / "synced", 2, model="bn", bn_sync="allreduce", epochs=3, lr=0.5)
    torch.testing.assert_close(synced, reference.state_dict)  # global statistics by all-reduce == one process
    gap = max((local[k].float() - v.float()).abs().max().item() for k, v in reference.state_dict.items())
    assert gap > 1e-2  # per-rank statistics drift from the single-process model


def test_syncbn_is_refused_on_cpu(tmp_path):
    with pytest.raises(DistributedRunError, match="SyncBatchNorm refuses CPU tensors"):
        train(tmp_path / "run", 2, model="bn", bn_sync="syncbn", epochs=1)


def test_resume_equals_an_uninterrupted_run(tmp_path):
    cfg = {"epochs": 6, "momentum": 0.9, "lr": 0.1}
    _, whole = train(tmp_path / "whole", 2, **cfg)
    ckpt = str(tmp_path / "ckpt.pt")
    first, _ = train(tmp_path / "first", 2, checkpoint=ckpt, stop_after=3, **cfg)
    second, resumed = train(tmp_path / "second", 2, resume=ckpt, **cfg)
    assert first.summary["steps"] == 15 and second.summary["steps"] == 30 and len(second.summary["epoch_losses"]) == 3
    torch.testing.assert_close(resumed, whole)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("ckpt")) == ["ckpt.pt"]  # no .tmp left


FIXES = ("uneven-join", "rank0-fixed", "unused-params-fixed", "module-prefix")


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    """The cases that must run, all in one launch; each case's per-rank list by name."""
    out = tmp_path_factory.mktemp("fixed")
    run = run_ddp("dp_helpers.scripts.pitfall_runs", "--case", *FIXES, world_size=2, out_dir=out, timeout=120, echo=False)
    return {name: json.loads((run.run_dir / f"{name}.json").read_text()) for name in FIXES}


def test_uneven_inputs_time_out_and_join_fixes_them(tmp_path, fixed):
    start = time.monotonic()
    with pytest.raises(DistributedRunError, match="Timed out"):
        case(tmp_path, "uneven")
    assert time.monotonic() - start < 30
    zero, one = fixed["uneven-join"]
    assert (zero["batches"], one["batches"]) == (5, 3)  # with Join every rank finishes
    assert zero["weights"] == one["weights"]  # with one model
    torch.testing.assert_close(zero["weights"], zero["replay"])  # the one-process replay of Join's averaging


def test_collective_inside_rank_0_times_out_and_the_fix_runs(tmp_path, fixed):
    start = time.monotonic()
    with pytest.raises(DistributedRunError, match="Timed out"):
        case(tmp_path, "rank0-collective")
    assert time.monotonic() - start < 30
    assert [r["metric"] for r in fixed["rank0-fixed"]] == [1.0, 1.0]  # 0 + 1, on every rank


def test_unused_parameters_error_and_fix(tmp_path, fixed):
    with pytest.raises(DistributedRunError, match="Expected to have finished reduction in the prior iteration"):
        case(tmp_path, "unused-params")
    assert fixed["unused-params-fixed"][0]["batches"] == 3


def test_module_prefix(fixed):
    found = fixed["module-prefix"][0]
    assert found["wrapper_keys"] == ["module.fc.weight", "module.fc.bias"]
    assert 'Unexpected key(s) in state_dict: "module.fc.weight"' in found["error"]
    assert found["module_keys"] == ["fc.weight", "fc.bias"]


def test_padded_evaluation_is_skewed_and_exact_sums_are_not(tmp_path):
    from dp_helpers.data import make_synthetic
    from dp_helpers.models import build_model

    run = run_ddp("dp_helpers.scripts.evaluate", world_size=4, out_dir=tmp_path / "run", timeout=120, echo=False)
    result = json.loads((run.run_dir / "eval.json").read_text())[0]
    data, model = make_synthetic(10, 10, seed=0), build_model("linear", 10, seed=0)
    with torch.no_grad():
        p = model(data.data).squeeze(1)
    loss = torch.nn.functional.binary_cross_entropy(p, data.target).item()
    assert result["exact"]["samples"] == 10 and result["padded"]["samples"] == 12
    assert result["exact"]["loss"] == pytest.approx(loss, rel=1e-6)
    assert abs(result["padded"]["loss"] - loss) > 1e-3


def test_ddp_internals(tmp_path):
    exps = ("timeline", "buckets", "sweep", "memory", "fp16", "precision")
    run_ddp("dp_helpers.scripts.ddp_internals", "--experiment", *exps, "--caps", "1", "25", world_size=2,
            out_dir=tmp_path, timeout=300, echo=False)
    got = {exp: json.loads((tmp_path / f"{exp}.json").read_text())[0] for exp in exps}
    events = got["timeline"]
    first_allreduce = min(e["start"] for e in events if e["kind"] == "all-reduce")
    last_ready = max(e["start"] for e in events if e["kind"] == "gradient ready")
    assert first_allreduce < last_ready  # communication starts while the backward is still computing
    buckets = {r["setting"]: r["bucket_bytes_per_step"] for r in got["buckets"]}
    total = sum(buckets["default"][0])
    assert all(len(b[0]) == 1 for name, b in buckets.items() if name != "find_unused_parameters")  # step 0: one bucket
    assert buckets["default"][1][0] <= 1.1 * 2**20 and len(buckets["default"][1]) == 2  # rebuilt: a small first bucket
    assert buckets["bucket_cap_mb=25"][1] == [total] and buckets["bucket_cap_mb=1"][1] == buckets["bucket_cap_mb=0.25"][1]
    assert len(buckets["find_unused_parameters"][0]) > 1 and buckets["find_unused_parameters"][0] == buckets["find_unused_parameters"][2]
    assert [r["allreduces_per_step"] for r in got["sweep"]] == [2.0, 6.0, 1.0]  # default, 1 MiB, 25 MiB
    plain, view = got["memory"]
    assert plain["bytes_held"] == 2 * plain["parameter_bytes"] and view["bytes_held"] == view["parameter_bytes"]
    assert got["fp16"]["fp16"]["bytes"] * 2 == got["fp16"]["fp32"]["bytes"]
    prec = got["precision"]
    assert prec["autocast bf16"]["bytes"] == prec["fp32"]["bytes"] == 2 * prec["autocast bf16 + fp16_compress_hook"]["bytes"]
    assert prec["autocast bf16"]["grad_dtype"] == "torch.float32"


def test_fixed_port_in_use_message():
    from dp_helpers.pitfalls import fixed_port_in_use

    assert "EADDRINUSE" in fixed_port_in_use()
