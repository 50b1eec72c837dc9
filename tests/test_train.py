"""The train job for real: the CLI's run folder and rank-0 output, and DDP == one process with the global batch.

The CLI runs through torchrun; the equivalence runs call the same train() in a rank pool (tests/ranks.py).
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dp_helpers.scripts import train as train_script
from dp_helpers.tool.cli import main
from dp_helpers.tool.config import TrainConfig
from dp_helpers.tool.reference import train_reference
from dp_helpers.tool.request import progress_steps, validate
from dp_helpers.tool.sampler import shard_plan

pytestmark = pytest.mark.slow


def train_rank(info, cfg: TrainConfig) -> dict:
    """What scripts/train.py does on each rank once the group is up."""
    validate(cfg, info.world_size)
    return train_script.train(cfg, info)


class PoolRun:
    """A training run made in a rank pool: its folder, summary and final weights."""

    def __init__(self, pools, out, world_size: int, **changes):
        self.run_dir = out
        self.summary = pools.get(world_size).run(train_rank, TrainConfig(**changes), run_dir=out)[0]


def launch_train(pools, out, world_size, **cfg_changes) -> PoolRun:
    """The train job on world_size ranks of a pool."""
    return PoolRun(pools, out, world_size, **cfg_changes)


def final_weights(run_dir):
    return torch.load(run_dir / "model.pt", map_location="cpu", weights_only=True)


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """`python -m dp_helpers train` with the defaults, as a user types it."""
    out = tmp_path_factory.mktemp("cli") / "run"
    proc = subprocess.run([sys.executable, "-m", "dp_helpers", "train", "--world-size", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out, proc


def test_cli_writes_the_run_folder(cli_run):
    out, proc = cli_run
    assert {p.name for p in out.iterdir()} >= {"metrics", "summary.json", "model.pt", "loss.png", "logs"}
    assert sorted(p.name for p in (out / "metrics").iterdir()) == ["rank0.jsonl", "rank1.jsonl"]
    assert (out / "loss.png").read_bytes()[:4] == b"\x89PNG"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["backend"] == "gloo" and summary["steps"] == 50
    assert summary["config"] == TrainConfig().as_dict() and summary["equivalent_to_large_batch"]
    assert summary["final_loss"] < 0.95 * summary["epoch_losses"][0]  # the labels are learnable
    assert summary["status"] == "finished"
    log = (out / "console.log").read_text()
    assert "[rank 0/2] epoch 10/10" in log and log.rstrip().endswith(f"run folder: {out}")  # the CLI's own lines too


def test_cli_prints_one_line_per_epoch_from_rank_0(cli_run):
    _, proc = cli_run
    epoch_lines = [ln for ln in proc.stdout.splitlines() if " epoch " in ln]
    assert len(epoch_lines) == 10
    assert all(ln.startswith("[rank 0/2] epoch ") for ln in epoch_lines)
    assert epoch_lines[-1].startswith("[rank 0/2] epoch 10/10  loss=")
    assert "final loss" in proc.stdout and "run folder:" in proc.stdout
    assert "starting 2 processes" in proc.stderr and "train: 100% (50/50 steps)" in proc.stderr  # off a terminal:
    assert "\r" not in proc.stderr  # a line per quarter, no bar redrawn into a log


@pytest.fixture(scope="module")
def large_batch_run(tmp_path_factory, pools):
    """World size 1 with the global batch 20: the run every W x B run must match."""
    return launch_train(pools, tmp_path_factory.mktemp("w1") / "run", 1, batch_size=20)


@pytest.fixture(scope="module")
def sharded_reference(tmp_path_factory, pools):
    """One process with the global batch 20, SGD with momentum, the MLP: what every sharded run must end with."""
    return launch_train(pools, tmp_path_factory.mktemp("alone") / "run", 1, batch_size=20, momentum=0.9, model="mlp",
                        epochs=3)


@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero3", "fsdp"])
def test_sharded_strategies_keep_the_invariant_and_record_bytes(tmp_path, pools, sharded_reference, strategy):
    run = launch_train(pools, tmp_path / "run", 2, batch_size=10, strategy=strategy, momentum=0.9, model="mlp", epochs=3)
    alone = sharded_reference
    torch.testing.assert_close(final_weights(run.run_dir), final_weights(alone.run_dir))  # full weights in model.pt
    held, whole = run.summary["held_bytes"], alone.summary["held_bytes"][0]
    assert len(held) == 2 and all(h["optimizer state"] < whole["optimizer state"] for h in held)  # the state is split
    sharded = [h["parameters"] < whole["parameters"] for h in held]
    assert sharded == ([True, True] if strategy in ("fsdp", "zero3") else [False, False])  # stage 3 shards them too
    if strategy in ("zero1", "fsdp"):
        assert held == readme_held_bytes(strategy)  # the README's numbers are this run's


def readme_held_bytes(strategy: str) -> list[dict]:
    """The bytes per rank the README shows for this run: fsdp's as JSON, zero1's in a sentence."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    if strategy == "fsdp":
        shown = readme.split('summary.json "held_bytes": ', 1)[1].split("\n```", 1)[0]
        return json.loads(" ".join(shown.split()))
    numbers = re.search(r"same run holds ([\d,]+) bytes of parameters on each rank and ([\d,]+) / ([\d,]+) bytes\s+of "
                        r"state", readme).groups()
    params, *state = (int(n.replace(",", "")) for n in numbers)
    return [{"parameters": params, "gradients": params, "optimizer state": s} for s in state]


def test_digits_keep_the_invariant_and_reach_90_percent_with_the_defaults(tmp_path, pools):
    digits = {"data": "digits", "epochs": 2}  # --model cnn --lr 0.05 --momentum 0.9 are digits' defaults
    assert (TrainConfig(**digits).model, TrainConfig(**digits).lr, TrainConfig(**digits).momentum) == ("cnn", 0.05, 0.9)
    run = launch_train(pools, tmp_path / "run", 2, batch_size=10, **digits)  # notebook 07 runs it under torchrun
    reference = train_reference(TrainConfig(batch_size=10, **digits), world_size=2)  # one process, batch 20
    torch.testing.assert_close(final_weights(run.run_dir), reference.state_dict)
    accuracy = run.summary["held_out_accuracy"]
    assert len(accuracy) == 2 and accuracy[-1] >= 0.9 and run.summary["final_accuracy"] == accuracy[-1]
    assert abs(accuracy[-1] - reference.held_out_accuracy[-1]) <= 1 / 297  # at most one image's tie flips


def score_rank(info, world_size: int) -> dict:
    """The held-out scores of an untrained cnn, each rank scoring its stride."""
    from dp_helpers.tool.models import build_model
    from dp_helpers.tool.tasks import held_out_scores, held_out_set

    return held_out_scores(build_model("cnn", 1, seed=0), held_out_set(TrainConfig(data="digits", model="cnn")),
                           world_size, info.rank)


@pytest.mark.parametrize("world_size", [2, 4])
def test_held_out_scores_count_every_image_once(pools, world_size):
    spread, whole = pools.get(world_size).run(score_rank, world_size)[0], score_rank(SimpleNamespace(rank=0), 1)
    assert spread["samples"] == whole["samples"] == 297  # 297 = 149 + 148 on 2 ranks: no padding
    assert spread["accuracy"] == whole["accuracy"]
    assert abs(spread["loss"] - whole["loss"]) < 1e-6  # float32 sums in another order


@pytest.mark.parametrize("world_size", [2, 4])
def test_world_size_w_equals_one_process_with_the_global_batch(tmp_path, pools, large_batch_run, cli_run, world_size):
    if world_size == 2:
        run_dir = cli_run[0]
    else:
        run_dir = launch_train(pools, tmp_path / "run", 4, batch_size=5).run_dir
    torch.testing.assert_close(final_weights(run_dir), final_weights(large_batch_run.run_dir))
    reference = train_reference(TrainConfig(batch_size=20 // world_size), world_size=world_size)
    torch.testing.assert_close(final_weights(run_dir), reference.state_dict)


def without_time(records):
    return [{k: v for k, v in r.items() if k != "time"} for r in records]


def test_same_seed_same_metrics_bitwise(tmp_path, pools, cli_run):
    again = launch_train(pools, tmp_path / "again", 2)  # in a pool: the same code as under torchrun
    first = [json.loads(ln) for ln in (cli_run[0] / "metrics" / "rank1.jsonl").read_text().splitlines()]
    second = [json.loads(ln) for ln in (again.run_dir / "metrics" / "rank1.jsonl").read_text().splitlines()]
    assert without_time(first) == without_time(second) and len(first) == 50
    assert torch.equal(final_weights(cli_run[0])["fc.weight"], final_weights(again.run_dir)["fc.weight"])


def test_short_last_batch_keeps_equivalence(tmp_path, pools):
    run = launch_train(pools, tmp_path / "run", 2, samples=30, batch_size=4, epochs=3)
    assert run.summary["equivalent_to_large_batch"] and "short" in run.summary["equivalence"]
    reference = train_reference(TrainConfig(samples=30, batch_size=4, epochs=3), world_size=2)
    torch.testing.assert_close(final_weights(run.run_dir), reference.state_dict)


def test_sampler_padding_breaks_equivalence(tmp_path, pools):
    cfg = {"samples": 30, "batch_size": 5, "epochs": 5, "lr": 0.5}
    run = launch_train(pools, tmp_path / "run", 4, **cfg)
    assert not run.summary["equivalent_to_large_batch"]
    assert "repeats 2 sample(s)" in run.summary["equivalence"] and run.summary["padded_samples_per_epoch"] == 2
    reference = train_reference(TrainConfig(**cfg), world_size=4)
    diff = max((final_weights(run.run_dir)[k] - v).abs().max().item() for k, v in reference.state_dict.items())
    assert diff > 1e-3  # far outside assert_close's float32 tolerance: the duplicates changed the training


def test_hand_written_all_reduce_equals_ddp_and_one_process(tmp_path, pools, cli_run):
    """Averaging gradients with all_reduce after backward (no DDP wrapper) == DDP == one process with the global batch."""
    manual = launch_train(pools, tmp_path / "manual", 2, sync="manual", check_grads=True)
    assert manual.summary["sync"] == "manual"
    # one all-reduce per gradient tensor and step (the linear model: weight and bias), counted as DDP's buckets are
    assert manual.summary["allreduce_calls"] == 2 * manual.summary["steps"] and manual.summary["allreduce_bytes"] > 0
    torch.testing.assert_close(final_weights(manual.run_dir), final_weights(cli_run[0]))
    torch.testing.assert_close(final_weights(manual.run_dir), train_reference(TrainConfig(batch_size=20)).state_dict)


@pytest.mark.parametrize("k", [3, 4])
def test_accumulation_equals_the_large_batch_with_a_short_last_micro_batch(tmp_path, pools, k):
    # 50 samples per rank in micro-batches of 8: 6 full and one of 2; k=3 leaves the short one alone in the last
    # step, k=4 accumulates it with two full ones: weighted by size (2/18, not 1/3), it still equals the large batch
    cfg = {"batch_size": 8, "grad_accum_steps": k, "epochs": 2, "lr": 0.5}
    run = launch_train(pools, tmp_path / "run", 2, **cfg)
    assert run.summary["equivalent_to_large_batch"] and run.summary["global_batch_size"] == 16 * k
    reference = train_reference(TrainConfig(batch_size=8 * k, epochs=2, lr=0.5), world_size=2)
    torch.testing.assert_close(final_weights(run.run_dir), reference.state_dict)


@pytest.mark.long
def test_resume_checks_its_file_and_sizes_the_bar(tmp_path, pools, capsys):
    cli = [sys.executable, "-m", "dp_helpers", "train", "--epochs", "3"]
    ckpt = tmp_path / "ckpt.pt"
    assert progress_steps(TrainConfig(epochs=3, stop_after=1), 2) == 5  # 1 epoch of 5 steps, not 15
    launch_train(pools, tmp_path / "a", 2, epochs=3, checkpoint=str(ckpt), stop_after=1)
    again = subprocess.run([*cli, "--resume", str(ckpt), "--out", str(tmp_path / "b")],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "10/10" in again.stderr  # the 2 epochs left
    (tmp_path / "junk.pt").write_text("not a checkpoint")
    for path, words in ((tmp_path / "missing.pt", "no such checkpoint file"),
                        (tmp_path / "junk.pt", "is not a checkpoint written by --checkpoint")):
        # refused before anything starts: the CLI's main() in this process says the same as the command would
        code = main([*cli[3:], "--resume", str(path), "--out", str(tmp_path / "c")])
        err = capsys.readouterr().err
        assert code == 2 and words in err and "Traceback" not in err
    assert not (tmp_path / "c").exists()


def test_the_script_runs_alone_as_one_process(tmp_path):
    """`python dp_helpers/scripts/train.py` without torchrun: a group of one, the same as one process with that batch."""
    script = train_script.__file__
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "DP_RUN_DIR")}
    proc = subprocess.run([sys.executable, script, "--epochs", "2", "--batch-size", "20", "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "epoch 2/2" in proc.stdout and f"run folder: {tmp_path / 'run'}" in proc.stdout
    reference = train_reference(TrainConfig(epochs=2, batch_size=20))
    torch.testing.assert_close(final_weights(tmp_path / "run"), reference.state_dict)


@pytest.mark.parametrize("error, status, reason", [
    (KeyboardInterrupt(), "stopped", "interrupted (Ctrl-C)"),
    (OSError(28, "No space left on device"), "failed", "OSError: [Errno 28] No space left on device")])
def test_the_script_run_alone_records_how_it_ended(tmp_path, monkeypatch, error, status, reason):
    for key in ("RANK", "DP_RUN_DIR"):
        monkeypatch.delenv(key, raising=False)
    info = SimpleNamespace(world_size=1, run_dir=tmp_path)
    with pytest.raises(type(error)), train_script.ending_recorded_alone(TrainConfig(), info):
        raise error
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["status"], summary["reason"], summary["checkpoint"]) == (status, reason, None)


def test_under_a_launcher_the_script_leaves_the_record_to_it(tmp_path, monkeypatch):
    monkeypatch.setenv("DP_RUN_DIR", str(tmp_path))  # run_ddp records the ending: it knows which rank failed first
    with pytest.raises(KeyboardInterrupt), train_script.ending_recorded_alone(TrainConfig(), SimpleNamespace(
            world_size=1, run_dir=tmp_path)):
        raise KeyboardInterrupt
    assert not (tmp_path / "summary.json").exists()


@pytest.mark.parametrize("bn_sync, world_size, identical", [("none", 2, False), ("allreduce", 2, True), ("none", 1, True)])
def test_the_summary_says_when_per_rank_batchnorm_breaks_the_equivalence(bn_sync, world_size, identical):
    cfg = TrainConfig(model="bn", bn_sync=bn_sync)
    said = train_script.equivalence(cfg, shard_plan(cfg.samples, world_size, cfg.batch_size), {})
    assert said["equivalent_to_large_batch"] == identical
    assert ("its own shard's statistics" in said["equivalence"]) != identical


def test_a_run_resumed_from_an_async_snapshot_equals_one_process(tmp_path, pools):
    cfg = {"model": "mlp", "momentum": 0.9, "epochs": 2}
    stopped = launch_train(pools, tmp_path / "async", 2, checkpoint=str(tmp_path / "ck.pt"), async_checkpoint=True,
                           stop_after=1, **cfg)
    assert stopped.summary["checkpoint_saves"] == 1 and torch.load(tmp_path / "ck.pt", weights_only=True)["step"] == 5
    resumed = launch_train(pools, tmp_path / "resumed", 2, resume=str(tmp_path / "ck.pt"), **cfg)
    torch.testing.assert_close(final_weights(resumed.run_dir), train_reference(TrainConfig(batch_size=20, **cfg)).state_dict)


def test_an_async_snapshot_is_written_while_training_goes_on_and_its_error_is_raised(tmp_path, monkeypatch):
    released, written = __import__("threading").Event(), []

    def slow_write(path, write):
        assert released.wait(30)  # the disk answers only when the test says so
        write(Path(path))
        written.append(path)

    monkeypatch.setattr(train_script, "write_atomic", slow_write)
    snapshots, info = train_script.Snapshots(str(tmp_path / "ck.pt"), background=True), SimpleNamespace(is_main=True)
    weights = torch.ones(3)
    snapshots.save(lambda: {"w": weights}, info)  # returns with the write still waiting for the disk
    weights.add_(1)  # training changes the weights in place: the snapshot keeps the copy it took
    assert written == [] and snapshots.saves == 1
    released.set()
    snapshots.close()
    assert written and torch.equal(torch.load(tmp_path / "ck.pt", weights_only=True)["w"], torch.ones(3))
    broken = train_script.Snapshots(str(tmp_path / "no such folder" / "ck.pt"), background=True)
    broken.save(lambda: {"w": weights}, info)
    with pytest.raises(RuntimeError, match="does not exist"):  # the thread's error reaches the training loop at close (or the next save)
        broken.close()
