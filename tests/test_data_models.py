"""dp_helpers.tool.data and dp_helpers.tool.models: synthetic data that can be learnt, the sampler arithmetic, seeded models."""

import itertools
import math
import re

import pytest
import torch

from dp_helpers.tool.data import SimpleDataset, make_loader, make_synthetic
from dp_helpers.tool.models import MLP, SimpleModel, build_model
from dp_helpers.tool.sampler import shard_plan


def test_synthetic_is_seeded_and_learnable():
    a, b = make_synthetic(200, 5, seed=1), make_synthetic(200, 5, seed=1)
    torch.testing.assert_close(a.data, b.data)
    assert not torch.equal(make_synthetic(200, 5, seed=2).data, a.data)
    # labels follow the features: least squares on the features explains them far better than chance
    x = torch.cat([a.data, torch.ones(200, 1)], dim=1)
    w = torch.linalg.lstsq(x, a.target.unsqueeze(1)).solution
    accuracy = ((x @ w > 0.5).float().squeeze(1) == a.target).float().mean()
    assert accuracy > 0.8
    assert 0.2 < a.target.mean() < 0.8


def test_dataset_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="3 rows but target has 2"):
        SimpleDataset(torch.zeros(3, 2), torch.zeros(2))


@pytest.mark.parametrize("samples, world_size, batch_size", list(itertools.product([7, 10, 30, 100], [1, 2, 3, 4], [1, 3, 5])))
def test_shard_plan_matches_the_real_sampler(samples, world_size, batch_size):
    plan = shard_plan(samples, world_size, batch_size)
    ds = make_synthetic(samples, 2, seed=0)
    for rank in range(world_size):
        loader, sampler = make_loader(ds, batch_size, rank, world_size, seed=0)
        sizes = [len(x) for x, _ in loader]
        assert len(sampler) == plan.per_rank and len(sizes) == plan.steps_per_epoch
        assert sizes[-1] == plan.last_batch
    assert plan.padded == plan.per_rank * world_size - samples
    assert plan.equivalent_to_large_batch == (samples % world_size == 0)


def test_ranks_batches_union_is_the_global_batch():
    """The identity DDP == large batch rests on: at step k the ranks together hold perm[k*W*B:(k+1)*W*B]."""
    ds, world_size, batch_size = make_synthetic(48, 2, seed=0), 4, 3
    for epoch in range(3):
        single, s_sampler = make_loader(ds, world_size * batch_size, 0, 1, seed=5)
        s_sampler.set_epoch(epoch)
        per_rank = []
        for rank in range(world_size):
            _, sampler = make_loader(ds, batch_size, rank, world_size, seed=5)
            sampler.set_epoch(epoch)
            idx = list(sampler)
            per_rank.append([idx[i:i + batch_size] for i in range(0, len(idx), batch_size)])
        perm = list(s_sampler)
        for k in range(len(per_rank[0])):
            union = sorted(i for rank in range(world_size) for i in per_rank[rank][k])
            assert union == sorted(perm[k * world_size * batch_size:(k + 1) * world_size * batch_size])


def test_explain_names_what_differs():
    assert "identical" in shard_plan(100, 2, 10).explain()
    assert "short" in shard_plan(30, 2, 4).explain() and shard_plan(30, 2, 4).equivalent_to_large_batch
    text = shard_plan(30, 4, 5).explain()
    assert text.startswith("not identical") and "repeats 2 sample(s)" in text


def simulated_steps(samples: int, world_size: int, batch_size: int, k: int) -> list[list[list[int]]]:
    """Each optimizer step's micro-batches, each the sample indices every rank took: DistributedSampler's arithmetic."""
    per_rank = math.ceil(samples / world_size)
    padded = (list(range(samples)) * world_size)[:per_rank * world_size]  # it repeats from the start, as often as needed
    shards = [padded[r::world_size] for r in range(world_size)]
    micro = [[i for shard in shards for i in shard[m:m + batch_size]] for m in range(0, per_rank, batch_size)]
    return [micro[s:s + k] for s in range(0, len(micro), k)]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_every_explanation_is_true_of_the_numbers_it_names(world_size):
    for samples, batch_size, k in itertools.product([1, 2, 5, 7, 12, 30, 100], [1, 3, 4, 10], [1, 2, 3, 100]):
        plan, steps = shard_plan(samples, world_size, batch_size, k), simulated_steps(samples, world_size, batch_size, k)
        text, counts = plan.explain(), [sum(map(len, step)) for step in steps]
        where = (samples, world_size, batch_size, k, text)
        flat = [i for step in steps for m in step for i in m]
        assert plan.equivalent_to_large_batch == (len(flat) == samples == len(set(flat))), where
        assert text.startswith("identical" if plan.equivalent_to_large_batch else "not identical"), where
        if m := re.search(r"(\d+) samples split into (\d+) whole global batch", text):
            assert int(m[1]) == samples == int(m[2]) * plan.global_batch and set(counts) == {plan.global_batch}, where
        if m := re.search(r"the remaining (\d+) sample", text):
            one_process_last = samples - (len(steps) - 1) * plan.global_batch
            assert int(m[1]) == counts[-1] == one_process_last and counts[:-1] == [plan.global_batch] * (len(steps) - 1), where
        if m := re.search(r"accumulates only (\d+) of (\d+) micro-batches", text):
            assert (int(m[1]), int(m[2])) == (len(steps[-1]), k) and int(m[1]) < k, where
        if m := re.search(r"last batch is short \((\d+) sample", text):
            assert len(steps[-1]) == 1 and int(m[1]) * world_size == counts[-1] < world_size * batch_size, where
        if m := re.search(r"repeats (\d+) sample.* counts them (twice|more than once)", text):
            repeats = max(flat.count(i) for i in set(flat))
            assert int(m[1]) == len(flat) - samples > 0 and (repeats == 2) == (m[2] == "twice"), where


def test_build_model_is_seeded_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a = build_model("linear", 4, seed=7)
    assert torch.equal(torch.rand(1), expected_next)  # building a model did not consume the global RNG
    b = build_model("linear", 4, seed=7)
    torch.testing.assert_close(a.state_dict(), b.state_dict())
    assert not torch.equal(build_model("linear", 4, seed=8).fc.weight, a.fc.weight)
    assert isinstance(a, SimpleModel) and isinstance(build_model("mlp", 4, seed=0), MLP)


def test_models_output_probabilities():
    for name in ("linear", "mlp"):
        out = build_model(name, 6, seed=0)(torch.randn(5, 6))
        assert out.shape == (5, 1) and bool(((out > 0) & (out < 1)).all())
    with pytest.raises(ValueError, match="model must be one of linear, mlp, bn, cnn, got 'resnet'"):
        build_model("resnet", 6, seed=0)


def test_the_digits_cnn_gives_ten_logits_whatever_dim_says():
    logits = build_model("cnn", 6, seed=0)(torch.rand(5, 1, 8, 8))
    assert logits.shape == (5, 10)
    torch.testing.assert_close(build_model("cnn", 99, seed=3).state_dict(), build_model("cnn", 6, seed=3).state_dict())


@pytest.mark.parametrize("batch_size, k, steps, last_group, identical, words", [
    (10, 3, 2, 2, True, "the remaining 40 samples, and so does this run's last optimizer step: it accumulates only 2 of 3"),
    (8, 2, 4, 1, True, "each rank's last batch is short (2 samples)"),  # the short micro-batch steps alone
    (8, 3, 3, 1, True, "identical to one process with batch 48"),
    (8, 4, 2, 3, True, "accumulates 3 micro-batches (2 full ones of 8 samples and one of 2), each weighted by its size"),
])
def test_accumulation_changes_the_plan(batch_size, k, steps, last_group, identical, words):
    plan = shard_plan(100, 2, batch_size, k)
    assert (plan.optimizer_steps, plan.last_group, plan.global_batch) == (steps, last_group, 2 * batch_size * k)
    assert plan.equivalent_to_large_batch == identical and words in plan.explain()
