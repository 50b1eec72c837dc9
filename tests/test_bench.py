"""`python -m dp_helpers bench` writes valid JSON with the documented fields and its three figures (timings are never asserted)."""

import json
import subprocess

import pytest

from dp_helpers.tool.bench import BenchConfig, derived, quick
from dp_helpers.tool.env import gpu_count, nccl_available
from dp_helpers.tool.request import UsageError

pytestmark = pytest.mark.slow


def test_derived_ratios():
    tp = {"single": {64: 100.0}, "independent": {2: {64: 190.0}}, "ddp": {2: {64: 171.0}}, "dataparallel": {2: {64: 120.0}}}
    d = derived(tp, 64)
    assert d["speedup"] == {2: 1.71} and d["ceiling_speedup"] == {2: 1.9} and d["dataparallel_speedup"] == {2: 1.2}
    assert d["efficiency"][2] == pytest.approx(0.855) and d["efficiency_vs_ceiling"][2] == pytest.approx(0.9)
    assert d["batch_sweep"] == [{"batch": 64, "single": 100.0, "ddp_2": 171.0, "independent_2": 190.0,
                                 "efficiency_vs_ceiling_2": pytest.approx(0.9), "dataparallel_2": 120.0}]


def test_quick_config_is_smaller():
    full, fast = BenchConfig([1, 2]), quick(BenchConfig([1, 2]))
    assert fast.steps < full.steps and len(fast.sizes_mib) < len(full.sizes_mib) and fast.world_sizes == [1, 2]


def test_bench_quick_writes_the_documented_fields(tmp_path, monkeypatch, pools, capsys):
    # the bench worker's measurements run in rank pools instead of one torchrun launch each (notebook 09
    # runs the real --quick benchmark); a tiny model: this test checks the fields, not the speed
    import dp_helpers.tool.bench as bench
    from dp_helpers.scripts import bench_worker
    from dp_helpers.tool.cli import main

    launched = []

    def in_pool(world_size, *args, out, backend, link=None):
        assert link is None  # no --link: the launches run over loopback
        argv = [str(a) for a in args]
        launched.append((world_size, bench_worker.parse_args(argv).mode))
        return pools.get(world_size).run(bench_worker.measure, argv)

    monkeypatch.setattr(bench, "launch_worker", in_pool)
    code = main(["bench", "--quick", "--world-sizes", "1", "2", "--no-overhead", "--hidden", "32", "--depth", "2",
                 "--batches", "16", "64", "--out", str(tmp_path / "b")])
    proc = subprocess.CompletedProcess([], code, *capsys.readouterr())
    assert proc.returncode == 0, proc.stderr[-2000:]
    # one launch per world size: each pays seconds of start-up
    assert launched == [(1, ["train", "dataparallel"]), (2, ["train", "allreduce", "comm"])]
    result = json.loads((tmp_path / "b" / "bench.json").read_text())
    assert set(result) >= {"config", "machine", "throughput", "speedup", "ceiling_speedup", "efficiency",
                           "efficiency_vs_ceiling", "batch_sweep", "allreduce", "train_overhead",
                           "dataparallel_speedup", "dataparallel_kind", "gpu", "backend"}
    assert set(result["throughput"]) == {"single", "independent", "ddp", "dataparallel"}
    assert set(result["dataparallel_speedup"]) == {"2"} and result["backend"] in ("gloo", "nccl")
    assert result["dataparallel_kind"].startswith("CPU emulation" if result["backend"] == "gloo" else "real")
    # GPU timings skip with a reason, never silently
    assert ("skipped" in result["gpu"]) == (gpu_count() == 0 or not nccl_available())
    assert all(v > 0 for v in result["throughput"]["single"].values())
    assert set(result["speedup"]) == {"2"} and result["machine"]["torch"]
    row = result["allreduce"][0]
    assert set(row) >= {"bytes", "all_reduce_s", "ring_s", "busbw_all_reduce_GBps", "busbw_ring_GBps", "ring_over_all_reduce"}
    assert [row["bytes"] for row in result["allreduce"]] == [65536, 1048576, 16777216]
    comm = result["communication"]  # train's --comm methods side by side, on the largest world size
    assert comm["world_size"] == 2 and set(comm["methods"]) == {"allreduce", "fp16", "powersgd", "local-sgd", "diloco"}
    ratios = {m: r["bytes_vs_allreduce"] for m, r in comm["methods"].items()}
    assert ratios["allreduce"] == 1 and ratios["fp16"] == 0.5 and 0 < ratios["powersgd"] < 0.5
    assert all(r["step_s"] > 0 and r["time_vs_allreduce"] > 0 for r in comm["methods"].values())
    assert "--comm fp16: 50.0% of allreduce's bytes per step" in proc.stdout
    for name in ("speedup", "bandwidth", "efficiency_batch"):
        assert (tmp_path / "b" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    assert "N=2: speed-up" in proc.stdout


def test_an_earlier_benchmark_is_not_overwritten(tmp_path):
    from dp_helpers.tool.bench import run_bench

    (tmp_path / "bench.json").write_text("{}")
    with pytest.raises(ValueError, match="already holds a benchmark; choose a new folder"):
        run_bench(quick(BenchConfig([1, 2])), tmp_path)
    assert (tmp_path / "bench.json").read_text() == "{}"


@pytest.mark.parametrize("change, words", [
    ({"world_sizes": [1]}, "compare nothing: give at least one world size >= 2"),
    ({"world_sizes": [1, 3]}, "world size 3 needs 3 cores or GPUs, but this machine has 2"),
    ({"world_sizes": []}, "world_sizes must be a non-empty list"),
    ({"batches": [0]}, "batches must be >= 1, got 0"),
    ({"default_batch": 100}, "default_batch 100 must be one of the batches"),
    ({"hidden": 0}, "hidden must be >= 1"),
    ({"sizes_mib": [0]}, "sizes_mib must be positive message sizes"),
    ({"precisions": ["fp8"]}, "precisions must be among fp32, fp16, bf16"),
])
def test_bad_benchmarks_are_refused_in_one_sentence(change, words):
    from dataclasses import replace

    from dp_helpers.tool.bench import validate_bench

    with pytest.raises(UsageError, match=words):
        validate_bench(replace(BenchConfig([1, 2]), **change), capacity=2)


def test_cli_flags_reach_the_config(monkeypatch, tmp_path):
    import dp_helpers.tool.bench
    from dp_helpers.tool.cli import main

    seen = {}
    monkeypatch.setattr(dp_helpers.tool.bench, "run_bench", lambda cfg, out, backend: seen.update(cfg=cfg) or
                        {"speedup": {}, "out_dir": str(tmp_path)})
    assert main(["bench", "--quick", "--world-sizes", "1", "2", "--batches", "128", "32", "--hidden", "256",
                 "--depth", "2", "--no-comm"]) == 0
    cfg = seen["cfg"]
    assert (cfg.batches, cfg.default_batch, cfg.hidden, cfg.depth, cfg.steps) == ([32, 128], 128, 256, 2, 4)
    assert not cfg.comm_check and cfg.overhead_check and cfg.link is None
    assert main(["bench", "--quick", "--link", "1gbit,1ms"]) == 0 and seen["cfg"].link == "1gbit,1ms"


def test_an_emulated_link_reaches_every_multi_process_launch_and_a_bad_one_is_refused(monkeypatch, tmp_path, capsys):
    import dp_helpers.tool.bench as bench
    from dp_helpers.tool.cli import main

    seen = []
    monkeypatch.setattr(bench, "launch_worker", lambda w, *args, out, backend, link=None: seen.append((w, link)) or [])
    bench.n_processes(BenchConfig([1, 2], link="2mbit,50us"), 2, tmp_path, "gloo", largest=True)
    assert seen == [(2, "2mbit,50us")]
    assert main(["bench", "--link", "fast", "--out", str(tmp_path / "b")]) == 2
    assert "fast" in capsys.readouterr().err and not (tmp_path / "b").exists()


def test_cli_refuses_before_anything_runs(tmp_path, capsys):
    from dp_helpers.tool.cli import main

    assert main(["bench", "--world-sizes", "1", "--out", str(tmp_path / "b")]) == 2
    assert "give at least one world size >= 2" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


@pytest.mark.skipif(nccl_available(), reason="needs a torch without NCCL, where backend 'nccl' is refused")
def test_a_refused_backend_leaves_no_folder(tmp_path, capsys):
    from dp_helpers.tool.cli import main

    assert main(["bench", "--backend", "nccl", "--out", str(tmp_path / "b")]) == 2
    assert "backend 'nccl' is not built into this torch" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_gpu_section_bookkeeping_with_a_stand_in_worker(monkeypatch, tmp_path):
    # the GPU runs themselves need GPUs (tests/test_gpu.py); what is recorded from them is checked here
    import dp_helpers.tool.bench as bench
    import dp_helpers.tool.env as env

    monkeypatch.setattr(env, "gpu_count", lambda: 2)
    monkeypatch.setattr(env, "nccl_available", lambda: True)
    monkeypatch.setattr(env, "gpu_names", lambda n: ("GPU A",) * n)
    monkeypatch.setattr(bench, "precision_problem", lambda device, p: "no native bfloat16." if p == "bf16" else None)
    rates, launches = {"fp32": 100.0, "fp16": 250.0}, []

    def stand_in(world_size, *args, out, backend):
        precision = args[args.index("--precision") + 1]
        launches.append((world_size, precision, backend))
        return [{"train": {"independent": {"1024": rates[precision]}, "ddp": {"1024": 0.9 * rates[precision]}}}] * world_size

    monkeypatch.setattr(bench, "launch_worker", stand_in)
    ticks = []
    out = bench.gpu_section(BenchConfig([1, 2]), tmp_path, lambda n=1: ticks.append(n))
    assert out["single"] == {"fp32": 100.0, "fp16": 250.0, "bf16": {"skipped": "no native bfloat16."}}
    assert out["ddp"]["fp16"] == pytest.approx(450.0) and out["ddp"]["bf16"] == {"skipped": "no native bfloat16."}
    assert out["speedup_over_fp32"] == {"fp32": 1.0, "fp16": 2.5} and out["gpus"] == ["GPU A", "GPU A"]
    assert launches == [(1, "fp32", "nccl"), (2, "fp32", "nccl"), (1, "fp16", "nccl"), (2, "fp16", "nccl")]
    assert sum(ticks) == 6  # two runs per precision, a skipped one included, so the bar ends full
