"""dp_helpers.tool.config, training and reference: validation sentences, flag round trips, the reference learns."""

import math

import pytest
import torch

from dp_helpers.tool.config import TrainConfig, config_from_args, worker_parser
from dp_helpers.tool.data import load_digits_split
from dp_helpers.tool.reference import train_reference
from dp_helpers.tool.request import DIGITS_HELD_OUT, DIGITS_TRAIN, UsageError, fault, validate


@pytest.mark.parametrize("change, error, words", [
    ({"epochs": 0}, ValueError, "epochs must be >= 1, got 0."),
    ({"batch_size": 0}, ValueError, "batch_size must be >= 1, got 0."),
    ({"batch_size": 2.5}, UsageError, "batch_size must be an int, got 2.5 (float)."),
    ({"samples": True}, UsageError, "samples must be an int, got True (bool)."),
    ({"dim": -3}, ValueError, "dim must be >= 1, got -3."),
    ({"seed": -1}, ValueError, "seed must be >= 0, got -1."),
    ({"lr": 0.0}, ValueError, "lr must be a finite number > 0, got 0.0."),
    ({"lr": math.nan}, ValueError, "lr must be a finite number > 0, got nan."),
    ({"lr": "0.1"}, UsageError, "lr must be a number, got '0.1' (str)."),
    ({"check_grads": "yes"}, UsageError, "check_grads must be True or False, got 'yes' (str)."),
    ({"checkpoint": None}, UsageError, "checkpoint must be a string, got None (NoneType)."),
    ({"model": "resnet"}, ValueError, "model must be one of linear, mlp, bn, cnn, got 'resnet'."),
    ({"data": "mnist"}, ValueError, "data must be one of synthetic, digits, got 'mnist'."),
    ({"data": "digits"}, UsageError, "--data digits and --model linear do not fit: digits needs --model cnn (10 "
     "classes, cross-entropy) and cnn needs --data digits (8x8 images); the other models take synthetic data."),
    ({"model": "cnn"}, UsageError, "--data synthetic and --model cnn do not fit: digits needs --model cnn (10 "
     "classes, cross-entropy) and cnn needs --data digits (8x8 images); the other models take synthetic data."),
    ({"data": "digits", "model": "cnn", "samples": 50}, UsageError, "--samples describes the synthetic data; digits "
     "has its own fixed split (1500 training and 297 held-out 8x8 images): drop --samples."),
    ({"fail_at": "2"}, UsageError, "fail_at='2': write EPOCH:RANK, e.g. 2:1 (rank 1 dies in epoch 2)."),
    ({"fail_at": "11:0"}, UsageError, "fail_at='11:0': the epoch must be 1..10 and the rank 0..0."),
])
def test_validate_says_one_sentence(change, error, words):
    cfg = TrainConfig(**{**TrainConfig().as_dict(), **change})
    with pytest.raises(error) as info:
        validate(cfg)
    assert str(info.value) == words


@pytest.mark.parametrize("change, world_size, words", [
    ({"strategy": "hsdp"}, 2, "--strategy hsdp with --shard-size 2 needs a world size that is a multiple of 2 and at "
     "least 4 (two groups to replicate across), not 2; e.g. --world-size 4."),
    ({"strategy": "hsdp", "shard_size": 3}, 8, "a multiple of 3 and at least 6"),
    ({"shard_size": 4}, 8, "--shard-size 4 only means something with --strategy hsdp"),
    ({"period": 8}, 2, "--period 8 only means something with --comm local-sgd or diloco"),
    ({"powersgd_rank": 4, "comm": "fp16"}, 2, "--powersgd-rank 4 only means something with --comm powersgd"),
    ({"comm": "powersgd", "strategy": "zero1"}, 2, "--comm powersgd changes how DDP's gradients meet, so it needs "
     "--strategy ddp and --sync ddp"),
    ({"comm": "fp16", "sync": "manual"}, 2, "needs --strategy ddp and --sync ddp"),
    ({"comm": "powersgd", "checkpoint": "ck.pt"}, 2, "--comm powersgd cannot be combined with --checkpoint: each rank "
     "keeps state of its own (error feedback and Q factors) that a checkpoint does not save."),
    ({"comm": "local-sgd", "check_grads": True}, 2, "the ranks' gradients differ by design"),
])
def test_comm_and_hsdp_refusals(change, world_size, words):
    with pytest.raises(UsageError) as info:
        validate(TrainConfig(**change), world_size)
    assert words in str(info.value)


def test_comm_and_hsdp_that_can_run_pass():
    validate(TrainConfig(strategy="hsdp", model="mlp"), world_size=4)
    validate(TrainConfig(strategy="hsdp", shard_size=3), world_size=6)
    validate(TrainConfig(comm="fp16", checkpoint=""), world_size=2)
    validate(TrainConfig(comm="diloco", period=16, momentum=0.9), world_size=3)


def test_fail_at_names_an_epoch_and_a_rank_of_this_run():
    assert fault(TrainConfig(fail_at="2:1"), world_size=2) == (1, 1)  # 0-based epoch inside
    with pytest.raises(UsageError, match="the rank 0..1"):
        validate(TrainConfig(fail_at="1:2"), world_size=2)


def test_digits_split_is_fixed_and_disjoint():
    train, held_out = load_digits_split("train"), load_digits_split("held_out")
    assert (len(train), len(held_out)) == (DIGITS_TRAIN, DIGITS_HELD_OUT) == (1500, 297)
    assert train.data.shape[1:] == (1, 8, 8) and 0 <= float(train.data.min()) and float(train.data.max()) <= 1
    rows = {tuple(x.flatten().tolist()) for x in train.data}
    assert sum(tuple(x.flatten().tolist()) in rows for x in held_out.data) < 5  # a few digits are drawn identically
    assert sorted(set(held_out.target.tolist())) == list(range(10))
    torch.testing.assert_close(load_digits_split("held_out").target, held_out.target)


def test_the_digits_are_scikit_learns_with_or_without_its_file(monkeypatch):
    import importlib.util

    import numpy as np
    from sklearn.datasets import load_digits

    from dp_helpers.tool import data

    expected = load_digits(return_X_y=True)
    read = data.digits_arrays()  # from scikit-learn's file, without importing scikit-learn
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # a layout without the file
    for got in (read, data.digits_arrays()):
        assert all(np.array_equal(g, e) and g.dtype == e.dtype for g, e in zip(got, expected, strict=True))


def test_fewer_samples_than_world_size():
    with pytest.raises(ValueError, match=r"samples=3 is fewer than world_size=4"):
        validate(TrainConfig(samples=3), world_size=4)


def test_defaults_are_the_seeds_problem():
    cfg = TrainConfig()
    assert (cfg.samples, cfg.dim, cfg.batch_size, cfg.lr, cfg.epochs) == (100, 10, 10, 0.01, 10)


def test_flags_round_trip():
    cfg = TrainConfig(epochs=3, batch_size=7, lr=0.5, samples=33, dim=4, seed=9, model="mlp")
    assert config_from_args(worker_parser().parse_args(cfg.as_args())) == cfg


def test_reference_learns_and_repeats():
    cfg = TrainConfig(epochs=30, lr=0.5, samples=200)
    a, b = train_reference(cfg), train_reference(cfg)
    assert a.losses == b.losses  # same seed, same process: bitwise
    first, last = sum(a.losses[:10]) / 10, sum(a.losses[-10:]) / 10
    assert last < 0.7 * first
    assert len(a.losses) == 30 * 20  # 200 samples / batch 10


def test_reference_world_size_means_global_batch():
    res = train_reference(TrainConfig(epochs=2), world_size=4)
    assert len(res.losses) == 2 * 3  # 100 samples / batch 40 -> 3 steps (the last has 20)


def test_reference_computes_with_the_workers_threads(monkeypatch):
    import dp_helpers.tool.reference as reference

    seen, step = [], reference.train_step
    monkeypatch.setattr(reference, "train_step", lambda *a, **k: seen.append(torch.get_num_threads()) or step(*a, **k))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # a notebook kernel's default on 2 cores
    try:
        train_reference(TrainConfig(epochs=1))
        assert set(seen) == {1} and torch.get_num_threads() == 2  # as a launched rank, then the kernel's again
    finally:
        torch.set_num_threads(before)


def test_a_worker_refuses_a_checkpoint_trained_with_other_settings(tmp_path):
    from types import SimpleNamespace

    from dp_helpers.scripts.train import load_checkpoint
    from dp_helpers.tool.models import build_model

    model = build_model("linear", 10, 0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 1, "step": 5,
                "world_size": 1, "batch_size": 10, "grad_accum_steps": 1}, tmp_path / "ck.pt")
    info = SimpleNamespace(device=torch.device("cpu"), world_size=1)
    with pytest.raises(ValueError, match=r"trained with --lr 0.01 --momentum 0.9; resume with the same \(now: --lr 0.5"):
        load_checkpoint(str(tmp_path / "ck.pt"), model, optimizer, TrainConfig(lr=0.5), info)
    assert load_checkpoint(str(tmp_path / "ck.pt"), model, optimizer, TrainConfig(momentum=0.9), info)[0] == 1


def test_a_resume_at_another_layout_says_whether_the_global_batch_is_kept():
    from dp_helpers.scripts.train import resumed_line
    from dp_helpers.tool.training import layout_change

    state = {"epoch": 2, "world_size": 4, "batch_size": 5, "grad_accum_steps": 1}
    assert layout_change(state, 4, 5, 1) is None
    same = layout_change(state, 2, 5, 2)  # half the ranks, twice the micro-batches: the same 20 samples a step
    assert same == {"world_size": 4, "batch_size": 5, "grad_accum_steps": 1, "global_batch_size": 20, "epoch": 2}
    assert resumed_line(same, 20).endswith("the same global batch (20), so the same steps as if uninterrupted")
    assert "changes from 20 to 10 (same --lr)" in resumed_line(layout_change(state, 2, 5, 1), 10)


def test_a_nan_output_is_called_divergence_not_a_range_error():
    from dp_helpers.tool.training import bce_loss

    with pytest.raises(FloatingPointError, match="output became NaN: training diverged"):
        bce_loss(torch.tensor([[0.5], [float("nan")]]), torch.tensor([1.0, 0.0]))
