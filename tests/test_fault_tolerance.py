"""Per-step fault tolerance from scratch: the quorum's agreement, the survivors' average, healing."""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from dp_helpers.scratch.fault_tolerance.quorum import Quorum
from dp_helpers.scratch.fault_tolerance.replica import replay
from dp_helpers.scripts.fault_tolerant import batch, model_and_optimizer
from dp_helpers.tool.launch.replicas import run_replicas
from tests.conftest import REPO

SCRIPT = Path(__file__).resolve().parents[1] / "dp_helpers" / "scripts" / "fault_tolerant.py"


def in_threads(*jobs):
    """Run each job in a thread of its own; their results in order (an exception in one fails the test)."""
    results, errors = [None] * len(jobs), []

    def run(i, job):
        try:
            results[i] = job()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, job)) for i, job in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    return results


def test_every_replica_reads_the_same_members_and_the_absent_one_is_left_out():
    store = dist.HashStore()
    quorum = Quorum(store, num_replicas=3, join_timeout_s=0.3, startup_timeout_s=0.3)
    began = time.monotonic()
    first, second = in_threads(lambda: quorum.meet(0, 0, 0), lambda: quorum.meet(0, 1, 0))
    assert first == second and first.replicas == (0, 1)  # replica 2 never came: the quorum closed without it
    assert time.monotonic() - began >= 0.3  # after waiting the join timeout for it
    late = quorum.meet(0, 2, 0)
    assert late.replicas == (0, 1)  # too late for step 0: it reads the same list, and is not in it


def test_a_quorum_closes_without_waiting_when_everyone_expected_is_there():
    quorum = Quorum(dist.HashStore(), num_replicas=2, join_timeout_s=30)
    began = time.monotonic()
    members = in_threads(lambda: quorum.meet(0, 0, 5), lambda: quorum.meet(0, 1, 3))
    assert members[0].replicas == (0, 1) and members[0].committed == (5, 3) and members[0].healthy == 0
    assert time.monotonic() - began < 10


def test_a_returning_replica_waits_for_the_members_even_through_a_long_step_and_counts_are_frozen():
    store = dist.HashStore()
    Quorum(store, num_replicas=3, startup_timeout_s=0.2).meet(0, 0, 0)  # step 0: replica 0 alone (1 and 2 absent)
    quorum = Quorum(store, num_replicas=3, join_timeout_s=0.2, startup_timeout_s=30)

    def member_after_a_long_step():
        time.sleep(1.0)  # five join timeouts: replica 0 is still computing step 0
        return quorum.meet(1, 0, 1)

    returning, member = in_threads(lambda: quorum.meet(1, 2, 0), member_after_a_long_step)
    assert returning == member and member.replicas == (0, 2)  # not (2,): it did not close step 1 on its own
    store.set("step1/arrived/2", "7")  # replica 2 restarts again and posts at step 1 once more
    assert quorum.meet(1, 0, 1).committed == (1, 0)  # everyone reads the counts frozen with the list


def test_the_quorum_refuses_an_impossible_minimum():
    with pytest.raises(ValueError, match="min_replicas"):
        Quorum(dist.HashStore(), num_replicas=2, min_replicas=3)


def loss_of(model, step, replica):
    x, y = batch(step, replica)
    return nn.functional.mse_loss(model(x), y)


def records(prefix, replica):
    """The (step, members, ok, committed, life) lines one replica wrote."""
    lines = Path(f"{prefix}.replica{replica}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def weights(prefix, replica):
    return torch.load(f"{prefix}.replica{replica}.pt", weights_only=True)


def replayed(schedule, batchnorm=False):
    """The one-process reference's weights after these (step, members) steps."""
    model, optimizer = model_and_optimizer(batchnorm)
    replay(model, optimizer, loss_of, schedule)
    return model.state_dict()


@pytest.mark.slow  # two torchruns
def test_replicas_average_each_step_over_all_of_them(tmp_path):
    prefix = tmp_path / "ft"
    run_replicas(SCRIPT, "--steps", 6, "--step-seconds", 0, "--out", prefix, replicas=2, max_restarts=0,
                 out_dir=tmp_path / "run", timeout=120)
    lines = records(prefix, 0)
    assert [(r["step"], r["members"], r["ok"]) for r in lines] == [(s, [0, 1], True) for s in range(6)]
    torch.testing.assert_close(weights(prefix, 0), replayed([(s, (0, 1)) for s in range(6)]))
    for name, value in weights(prefix, 0).items():  # gloo's sum is the same on both: so are the weights, bit for bit
        assert torch.equal(value, weights(prefix, 1)[name])


@pytest.mark.slow  # two torchruns
def test_a_batchnorm_models_running_statistics_stay_equal_on_every_replica(tmp_path):
    prefix = tmp_path / "ft"
    run_replicas(SCRIPT, "--steps", 6, "--step-seconds", 0, "--batchnorm", "--out", prefix, replicas=2,
                 max_restarts=0, out_dir=tmp_path / "run", timeout=120)
    first, second = weights(prefix, 0), weights(prefix, 1)
    assert "1.running_mean" in first and first["1.num_batches_tracked"] == 6
    for name, value in first.items():  # buffers too: averaged over the members every step
        assert torch.equal(value, second[name]), name
    # one process whose members' forwards start from the same statistics, the step keeping their mean
    torch.testing.assert_close(first, replayed([(s, (0, 1)) for s in range(6)], batchnorm=True))


@pytest.mark.slow
@pytest.mark.long  # fault injection: a replica SIGKILLed, restarted by its torchrun, healed from a live peer
def test_a_killed_replica_costs_its_share_and_comes_back_bitwise(tmp_path):
    prefix, steps = tmp_path / "ft", 60
    run_replicas(SCRIPT, "--steps", steps, "--kill", "1:5", "--step-seconds", 0.15, "--join-timeout", 1.5,
                 "--rejoin-after", 3, "--out", prefix, replicas=3, max_restarts=1, out_dir=tmp_path / "run", timeout=240)
    survivor = [r for r in records(prefix, 0) if r["ok"]]
    assert [r["step"] for r in survivor] == list(range(steps))  # killed before step 5's quorum: no step lost
    assert [r["members"] for r in survivor[:5]] == [[0, 1, 2]] * 5 and survivor[5]["members"] == [0, 2]
    second_life = [r for r in records(prefix, 1) if r["life"] == 1]
    back = second_life[0]["step"]
    assert 5 < back < steps and survivor[back]["members"] == [0, 1, 2]  # healed, then counted again
    assert second_life[0]["committed"] == survivor[back]["committed"]  # it took the survivors' state, then the step
    torch.testing.assert_close(weights(prefix, 0), replayed([(r["step"], tuple(r["members"])) for r in survivor]))
    for name, value in weights(prefix, 0).items():
        assert torch.equal(value, weights(prefix, 1)[name]) and torch.equal(value, weights(prefix, 2)[name])


@pytest.mark.slow
@pytest.mark.long  # found on a fast machine: a restart that beats the join timeout brings back the same membership
def test_a_replica_back_before_the_quorum_closes_gets_a_new_group_and_is_healed_in_that_step(tmp_path):
    prefix, steps = tmp_path / "ft", 12
    run_replicas(SCRIPT, "--steps", steps, "--kill", "1:5", "--step-seconds", 0, "--join-timeout", 60, "--out", prefix,
                 replicas=3, max_restarts=1, out_dir=tmp_path / "run", timeout=240)
    survivor = [r for r in records(prefix, 0) if r["ok"]]
    assert [r["step"] for r in survivor] == list(range(steps))  # no step lost to a group the new process never joined
    assert all(r["members"] == [0, 1, 2] for r in survivor)  # step 5 waited for it: the same members, a new process
    assert [r["step"] for r in records(prefix, 1) if r["life"] == 1][0] == 5
    for name, value in weights(prefix, 0).items():
        assert torch.equal(value, weights(prefix, 1)[name]) and torch.equal(value, weights(prefix, 2)[name])


@pytest.mark.slow
@pytest.mark.long
def test_torchft_itself_leaves_the_failed_replica_out_and_heals_it_as_the_course_does(tmp_path):
    pytest.importorskip("torchft", reason="torchft (optional, torch >= 2.7) is the reference here: pip install torchft")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    ran = subprocess.run([sys.executable, str(REPO / "tests" / "torchft_reference.py"), str(tmp_path / "ft.pt"), "fault",
                          "30", "5"], env=env, capture_output=True, text=True, timeout=240)
    assert ran.returncode == 0, ran.stderr[-3000:]
    (first, first_done), (second, second_done), (third, third_done) = torch.load(tmp_path / "ft.pt", weights_only=False)
    back = second_done.index(("second life", None))
    rejoined, lives = second_done[back + 1][0], (first_done, second_done[:back] + second_done[back + 1:], third_done)
    members = {s: tuple(r for r in range(3) if (s, True) in lives[r]) for s in range(30)}
    assert second_done[:back] == [(s, True) for s in range(5)]  # its first life: steps 0-4, then the failure
    assert 5 < rejoined < 30 and all(members[s] == (0, 2) for s in range(5, rejoined))  # left out, no step lost
    assert all(members[s] == (0, 1, 2) for s in range(5)) and all({0, 2} <= set(members[s]) for s in range(30))
    # healed and counted again (under load torchft may still leave it out of a step right after its return)
    assert members[29] == (0, 1, 2)
    # torchft's average (ReduceOp.AVG: summed, then divided) against the replay's mean of losses: rounding apart
    torch.testing.assert_close(first, replayed(sorted(members.items())), rtol=1e-5, atol=1e-6)
    for name, value in first.items():  # the one that came back with other weights ends bit for bit the survivors'
        assert torch.equal(value, second[name]) and torch.equal(value, third[name])
