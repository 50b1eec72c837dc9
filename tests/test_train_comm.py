"""train's ways to communicate less (--comm), its hybrid sharding (--strategy hsdp) and --resume at another world size.

Each runs the same train() as scripts/train.py in a rank pool (tests/ranks.py), on the configurations the README names.
"""

import pytest
import torch

from dp_helpers.scratch.communicating_less.compression import powersgd_values
from dp_helpers.tool.config import POWERSGD_START, TrainConfig
from dp_helpers.tool.models import build_model
from dp_helpers.tool.reference import train_reference
from tests.test_train import final_weights, launch_train

pytestmark = pytest.mark.slow

MLP = {"model": "mlp", "epochs": 4}  # 5 steps per epoch at 2 x 10 of 100 samples: 20 steps
STEPS = 20


def values_per_step(model: str = "mlp") -> int:
    """What DDP's all-reduce sends per step: every parameter once."""
    return sum(p.numel() for p in build_model(model, 10, 0).parameters())


def test_fp16_halves_the_bytes_and_stays_close_to_ddp(tmp_path, pools):
    run = launch_train(pools, tmp_path / "run", 2, comm="fp16", **MLP)
    assert run.summary["allreduce_bytes"] == STEPS * values_per_step() * 2  # 2 bytes a value, one bucket a step
    reference = train_reference(TrainConfig(batch_size=20, **MLP))
    torch.testing.assert_close(final_weights(run.run_dir), reference.state_dict, rtol=0, atol=2e-3)
    assert not run.summary["equivalent_to_large_batch"] and "rounded to fp16" in run.summary["equivalence"]


def test_powersgd_sends_the_formula(tmp_path, pools):
    run = launch_train(pools, tmp_path / "run", 2, comm="powersgd", powersgd_rank=2, **MLP)
    shapes = [p.shape for p in build_model("mlp", 10, 0).parameters()]
    compressed = powersgd_values(shapes, 2)
    assert compressed < values_per_step() / 5  # the two weight matrices shrink from 4,736 values to 296
    full = POWERSGD_START * values_per_step()  # the first steps go uncompressed
    assert run.summary["allreduce_bytes"] == 4 * (full + (STEPS - POWERSGD_START) * compressed)
    assert run.summary["final_loss"] < run.summary["epoch_losses"][0] and "low-rank" in run.summary["equivalence"]
    assert run.summary["powersgd_compressed_matrices"] == 2 * (STEPS - POWERSGD_START)  # two weight matrices a step


@pytest.mark.parametrize("epochs, rank", [(2, 1), (4, 1000)])  # 10 steps: all warm-up; rank 1000: no matrix shrinks
def test_powersgd_that_compressed_nothing_says_so_and_is_ddp(tmp_path, pools, epochs, rank):
    run = launch_train(pools, tmp_path / "run", 2, comm="powersgd", powersgd_rank=rank, model="mlp", epochs=epochs)
    reference = train_reference(TrainConfig(batch_size=20, model="mlp", epochs=epochs))
    torch.testing.assert_close(final_weights(run.run_dir), reference.state_dict)
    assert run.summary["powersgd_compressed_matrices"] == 0 and run.summary["equivalent_to_large_batch"]
    assert "PowerSGD compressed no gradient" in run.summary["equivalence"]
    assert run.summary["allreduce_bytes"] == 4 * 5 * epochs * values_per_step()  # DDP's bytes


def test_local_sgd_with_period_1_is_ddp(tmp_path, pools):
    run = launch_train(pools, tmp_path / "run", 2, comm="local-sgd", period=1, momentum=0.9, **MLP)
    reference = train_reference(TrainConfig(batch_size=20, momentum=0.9, **MLP))  # momentum is linear: still DDP
    torch.testing.assert_close(final_weights(run.run_dir), reference.state_dict)
    assert run.summary["equivalent_to_large_batch"]
    assert run.summary["allreduce_bytes"] == STEPS * values_per_step() * 4 and run.summary["allreduce_calls"] == STEPS


@pytest.mark.parametrize("comm, period, calls", [("local-sgd", 3, 8), ("diloco", 3, 7)])
def test_local_methods_meet_once_per_period_and_end_agreed(tmp_path, pools, comm, period, calls):
    run = launch_train(pools, tmp_path / "run", 2, comm=comm, period=period, **MLP)
    # local SGD averages after steps 0, 3, ..., 18 (7) and once more after 19; DiLoCo after steps 3, ..., 18 (6) + 1
    assert run.summary["allreduce_calls"] == calls
    assert run.summary["allreduce_bytes"] == calls * values_per_step() * 4
    ranks = pools.get(2).run(weights_of_rank, str(run.run_dir))
    assert not run.summary["equivalent_to_large_batch"] and ranks[0] == ranks[1] is True


def weights_of_rank(info, run_dir: str) -> bool:
    """Whether model.pt (rank 0's weights) is what this rank's model ends with: the last meeting agreed them."""
    import torch.distributed as dist

    mine = torch.load(f"{run_dir}/model.pt", weights_only=True)
    flat = torch.cat([v.reshape(-1) for v in mine.values()])
    gathered = [torch.empty_like(flat) for _ in range(info.world_size)]
    dist.all_gather(gathered, flat)
    return all(torch.equal(g, gathered[0]) for g in gathered)


def test_hsdp_on_four_ranks_equals_one_process_and_halves_what_each_holds(tmp_path, pools):
    cfg = {"model": "mlp", "momentum": 0.9, "epochs": 3}
    run = launch_train(pools, tmp_path / "run", 4, batch_size=5, strategy="hsdp", **cfg)
    alone = train_reference(TrainConfig(batch_size=20, **cfg))
    torch.testing.assert_close(final_weights(run.run_dir), alone.state_dict)
    whole = 4 * values_per_step()
    held = [h["parameters"] for h in run.summary["held_bytes"]]
    assert len(held) == 4 and all(whole / 2 <= h < whole / 2 + 4 * 64 for h in held)  # a half each, dim-0 rows padded


def test_resume_at_another_world_size(tmp_path, pools):
    cfg = {"model": "mlp", "momentum": 0.9, "epochs": 3}
    ckpt = str(tmp_path / "ck.pt")
    launch_train(pools, tmp_path / "two", 2, batch_size=10, checkpoint=ckpt, stop_after=1, **cfg)
    one = launch_train(pools, tmp_path / "one", 1, batch_size=20, resume=ckpt, **cfg)  # the same global batch
    torch.testing.assert_close(final_weights(one.run_dir), train_reference(TrainConfig(batch_size=20, **cfg)).state_dict)
    assert one.summary["equivalent_to_large_batch"] and one.summary["resumed_from"][0]["world_size"] == 2
    four = launch_train(pools, tmp_path / "four", 4, batch_size=10, resume=ckpt, **cfg)  # global batch 40, not 20
    assert not four.summary["equivalent_to_large_batch"]
    assert "first 1 epoch(s) trained with global batch 20" in four.summary["equivalence"]
