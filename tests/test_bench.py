"""`python -m dp_helpers bench` writes valid JSON with the documented fields and its three figures (timings are never asserted)."""

import json
import subprocess
import sys

import pytest

from dp_helpers.bench import BenchConfig, derived, quick
from dp_helpers.env import gpu_count

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


def test_bench_quick_writes_the_documented_fields(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dp_helpers", "bench", "--quick", "--world-sizes", "1", "2",
                           "--no-overhead", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "bench.json").read_text())
    assert set(result) >= {"config", "machine", "throughput", "speedup", "ceiling_speedup", "efficiency",
                           "efficiency_vs_ceiling", "batch_sweep", "allreduce", "train_overhead",
                           "dataparallel_speedup", "dataparallel_kind", "gpu", "backend"}
    assert set(result["throughput"]) == {"single", "independent", "ddp", "dataparallel"}
    assert set(result["dataparallel_speedup"]) == {"2"} and result["backend"] in ("gloo", "nccl")
    assert result["dataparallel_kind"].startswith("CPU emulation" if result["backend"] == "gloo" else "real")
    assert ("skipped" in result["gpu"]) == (gpu_count() == 0)  # GPU timings skip with a reason, never silently
    assert all(v > 0 for v in result["throughput"]["single"].values())
    assert set(result["speedup"]) == {"2"} and result["machine"]["torch"]
    row = result["allreduce"][0]
    assert set(row) >= {"bytes", "all_reduce_s", "ring_s", "busbw_all_reduce_GBps", "busbw_ring_GBps", "ring_over_all_reduce"}
    assert [row["bytes"] for row in result["allreduce"]] == [65536, 1048576, 16777216]
    for name in ("speedup", "bandwidth", "efficiency_batch"):
        assert (tmp_path / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    assert "N=2: speed-up" in proc.stdout


def test_an_earlier_benchmark_is_not_overwritten(tmp_path):
    from dp_helpers.bench import run_bench

    (tmp_path / "bench.json").write_text("{}")
    with pytest.raises(ValueError, match="already holds a benchmark; choose a new folder"):
        run_bench(quick(BenchConfig([1, 2])), tmp_path)
    assert (tmp_path / "bench.json").read_text() == "{}"
