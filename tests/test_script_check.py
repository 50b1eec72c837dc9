"""Notebook 00's checker: the solution passes on real ranks, and each typical mistake comes back as its own sentence."""

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dp_helpers.course.checkers import script_check as sc
from dp_helpers.course.checkers.exercises import SOLUTIONS

SOLUTION = (SOLUTIONS / "00_1.py").read_text()
ROOT = Path(__file__).resolve().parents[1]
REDUCE = "        dist.all_reduce(total)  # every rank: the sums over all ranks\n        if rank == 0:\n"
JOINED = "    rank = dist.get_rank()\n"


def mistake(*edits: tuple[str, str]) -> str:
    """The solution with one typical mistake made in it (each edit must apply: the solution may not drift away)."""
    text = SOLUTION
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


# the mistakes launched for real, each with the words its sentence must hold: the two only real ranks can show (a
# collective that one rank skips, a rank that never returns); the others are judged from records below
MISTAKES = {
    "a collective inside if rank == 0": (mistake((REDUCE, "        if rank == 0:\n            dist.all_reduce(total)\n")),
                                         "rank 0 waited in all_reduce (its collective number 1) for rank(s) [1]"),
    "a hang": (mistake((JOINED, JOINED + "    while rank == 1:  # stuck for ever\n        pass\n")),
               "rank 0 waited 4 s in a collective that rank(s) [1] never reached"),
}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "my_ddp.py"
    path.write_text(text)
    return path


@pytest.mark.long
@pytest.mark.slow
def test_the_solution_is_correct_on_2_and_3_ranks_in_two_kernels_at_once(tmp_path):
    path, temp = write(tmp_path, SOLUTION), tmp_path / "tmp"  # the checkers' folders go under temp: seen, then gone
    temp.mkdir()
    check = "import sys; from dp_helpers.course.checkers import script_check as sc; sys.exit(0 if sc.check_ddp_script(sys.argv[1]) else 1)"
    env = {**os.environ, "TMPDIR": str(temp), "PYTHONPATH": str(ROOT)}
    kernels = [subprocess.Popen([sys.executable, "-c", check, str(path)], stdout=subprocess.PIPE, text=True, env=env)
               for _ in range(2)]
    outs = [k.communicate(timeout=300)[0] for k in kernels]
    assert [k.returncode for k in kernels] == [0, 0], outs
    assert all(out.startswith("correct: on 2 and 3 ranks") for out in outs), outs
    assert not list(temp.glob("dp-course-*"))  # each used a folder of its own and removed it (torch keeps caches)


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_each_mistake_is_named(name, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DP_PROBE_TIMEOUT", "4")  # the hang fails in 4 s instead of a learner's 10
    text, words = MISTAKES[name]
    assert not sc.check_ddp_script(write(tmp_path, text))
    out = capsys.readouterr().out
    assert out.startswith("not yet: ") and words in out and out.count("\n") == 1, out


def test_before_any_launch_a_missing_untouched_or_broken_file_is_named(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert not sc.check_ddp_script("my_ddp.py")
    sc.start_ddp_exercise("my_ddp.py")
    assert not sc.check_ddp_script("my_ddp.py")
    Path("my_ddp.py").write_text("def main(:\n")
    assert not sc.check_ddp_script("my_ddp.py")
    sc.start_ddp_exercise("my_ddp.py")  # never over the learner's file
    out = capsys.readouterr().out.splitlines()
    assert "there is no my_ddp.py yet" in out[0] and "the one-device loop, ready to edit" in out[1]
    assert "still the one-device loop" in out[2] and "my_ddp.py, line 1: " in out[3] and "your file, kept" in out[4]


def outcome(**changes) -> sc.Outcome:
    """A run that did everything right on 2 ranks, with some of its records changed."""
    good = {0: [{"event": "init_process_group", "phase": "start"}, {"event": "__init__", "what": "ddp"},
                {"event": "sampler", "num_replicas": 2, "rank": 0, "shuffle": True, "seed": 0, "samples": 960}]
               + [{"event": "__iter__", "phase": "start", "epoch": e} for e in range(sc.EPOCHS)]
               + [{"event": "save", "phase": "start", "path": "w.pt", "keys": ["weight", "bias"]}],
            1: [{"event": "sampler", "num_replicas": 2, "rank": 1, "shuffle": True, "seed": 0, "samples": 960}]}
    fields = {"weights": {"weight": 0, "bias": 0}, "losses": ["1.0"] * sc.EPOCHS, "printers": [0], "probes": good}
    return sc.Outcome(**{**fields, **changes})


@pytest.mark.parametrize("change, words", [
    ({"printers": [0, 1]}, "ranks [0, 1] print the epoch loss: print on rank 0 only"),
    ({"printers": []}, "rank 0 prints no 'epoch N loss X' line"),
    ({"weights": {"module.weight": 0}}, "save model.module.state_dict()"),
    ({"weights": None}, "nothing was saved at --out"),
])
def test_what_was_saved_or_printed_is_checked(change, words):
    assert words in sc.output_problem(outcome(**change))
    assert sc.output_problem(outcome()) is None


def test_no_set_epoch_and_saving_on_every_rank_are_named_from_the_records():
    same_order = outcome()
    for e in same_order.probes[0]:
        if e["event"] == "__iter__":
            e["epoch"] = 0  # every epoch iterated the sampler at epoch 0: set_epoch never called
    assert "call sampler.set_epoch(epoch) at the start of every epoch" in sc.setup_problem(same_order, 2)
    both = outcome()
    both.probes[1].append({"event": "save", "phase": "start", "path": "w.pt", "keys": ["weight", "bias"]})
    assert "rank 1 saved too: only rank 0 may write the file" in sc.output_problem(both)


def test_a_loss_divided_by_the_world_size_again_is_named():
    halved = sc.Outcome(sc.one_device(sc.LR / 2).weights, [])  # what dividing the loss by 2 ranks gives
    assert "2x too small: DDP already averages them" in sc.result_problem(halved, sc.one_device(), 2)


def test_each_piece_of_the_recipe_is_named():
    assert sc.setup_problem(outcome(), 2) is None
    probes = outcome().probes
    without = {name: {0: [e for e in probes[0] if e["event"] != name], 1: probes[1]}
               for name in ("init_process_group", "__init__", "sampler")}
    assert "no process group" in sc.setup_problem(outcome(probes=without["init_process_group"]), 2)
    assert "never wrapped in DistributedDataParallel" in sc.setup_problem(outcome(probes=without["__init__"]), 2)
    assert "no DistributedSampler" in sc.setup_problem(outcome(probes=without["sampler"]), 2)
    lone = {0: probes[0], 1: [dict(probes[1][0], num_replicas=1, rank=0)]}
    assert "rank 1's DistributedSampler has num_replicas=1, rank=0" in sc.setup_problem(outcome(probes=lone), 2)


def test_a_collective_only_some_ranks_make_is_named():
    calls = {0: [{"event": "all_reduce", "phase": "start"}, {"event": "all_reduce", "phase": "done"},
                 {"event": "barrier", "phase": "start"}],
             1: [{"event": "all_reduce", "phase": "start"}, {"event": "all_reduce", "phase": "done"},
                 {"event": "broadcast", "phase": "start"}]}
    assert "rank 0 called barrier (its collective number 2) where rank 1 called broadcast" in sc.collective_mismatch(calls)
    assert sc.collective_mismatch({0: calls[0][:2], 1: calls[1][:2]}) is None
    early, stuck = {0: calls[0], 1: calls[1][:2] + [{"event": "end"}]}, {0: calls[0], 1: calls[1][:2]}
    assert "rank(s) [1] finished without calling it: is it inside `if rank == 0:`?" in sc.collective_mismatch(early)
    assert "for rank(s) [1], which had not called it when the run failed" in sc.collective_mismatch(stuck)
    assert "inside `if rank == 0:`" in sc.collective_mismatch(stuck)


def test_a_failed_launch_is_told_in_one_sentence(tmp_path):
    from dp_helpers.tool.launch import DistributedRunError

    reset = DistributedRunError("failed", ranks=(0,), cause="RuntimeError: [pair.cc:537] Connection reset by peer")
    left = {0: [{"event": "init_process_group", "phase": "start"}], 1: [{"event": "end"}]}
    assert "rank(s) [1] finished while rank(s) [0] still needed them" in sc.failure_sentence(reset, left, 2, tmp_path)
    invalid = DistributedRunError("failed", ranks=(2,), cause="ValueError: Invalid rank 2, rank should be in [0, 1]")
    assert "leave num_replicas and rank out" in sc.failure_sentence(invalid, {}, 3, tmp_path)


def test_a_global_batch_on_every_rank_is_named():
    wrong = outcome(weights={"weight": torch.ones(1)})
    wrong.probes[0].append({"event": "__init__", "phase": "start", "what": "loader", "batch_size": 12})
    problem = sc.result_problem(wrong, outcome(weights={"weight": torch.zeros(1)}), 2)
    assert "takes batches of [12], and the checker passed --batch-size 24" in problem


def test_epoch_lines_are_read_in_any_common_format():
    assert sc.epoch_losses(["epoch 1 loss 0.5", "Epoch 2/4: loss=0.25", "step 7 loss 9.0", "epoch 3 | loss 1e-3"]) \
        == ["0.5", "0.25"]


def test_a_loss_printed_with_fewer_digits_is_the_same_loss():
    assert sc.same_loss("1.8269", "1.826911") and sc.same_loss("1.826911", "1.826911")
    assert not sc.same_loss("1.8270", "1.826911") and not sc.same_loss("1.826950", "1.826911")


def test_a_rank_s_own_exception_and_a_group_that_never_formed_are_named(tmp_path):
    from dp_helpers.tool.launch import DistributedRunError

    log = ('[rank 0/2]   File "/home/me/my_ddp.py", line 43, in main\n[rank 1/2]   File "/home/me/my_ddp.py", line 42,'
           ' in main\n[rank 1/2] RuntimeError: boom')
    boom = DistributedRunError(log, ranks=(1, 0), cause="RuntimeError: boom")
    stuck = {0: [{"event": "all_reduce", "phase": "start"}], 1: []}  # rank 0 then waits for rank 1, which died
    assert "rank 1 raised RuntimeError: boom, in my_ddp.py, line 42" in sc.failure_sentence(boom, stuck, 2, tmp_path)
    port = DistributedRunError("failed", ranks=(0, 1), cause="DistNetworkError: The client socket has timed out after "
                               "10000ms while trying to connect to (127.0.0.1, 29500).")
    assert "the process group never formed" in sc.failure_sentence(port, {}, 2, tmp_path)


CORE = (SOLUTIONS / "04_3.py").read_text()
CORE_MISTAKES = {  # launched for real: only a run shows that the check script records a wait; the rest is judged
    # from records below (the gradient ratio, measured in every run, is 1.0 for the solution)
    "waited in launch": (("        self.pending.append((k, flat, dist.all_reduce(flat, async_op=True)))",
                          "        work = dist.all_reduce(flat, async_op=True)\n        work.wait()\n"
                          "        self.pending.append((k, flat, work))"),
                         "waited for while the backward still produced gradients"),
}


def core_step(order: str, ratio: float = 1.0, gap: float = 0.0) -> dict:
    """A recorded step: 'r' a gradient ready, 'w' an all-reduce waited for, a digit a bucket launched."""
    kinds = {"r": "ready", "w": "wait"}
    events = [{"kind": kinds[c], "arg": None} if c in kinds else {"kind": "launch", "arg": int(c)} for c in order]
    return {"events": events, "ratio": ratio, "gap": gap}


@pytest.mark.parametrize("order, ratio, gap, words", [
    ("rrrr0r1rr2", 1.0, 0.0, None),
    ("rrrr0rrrr21", 1.0, 0.0, "launched in the order [0, 2, 1]"),
    ("rrrr0r1rr", 1.0, 0.0, "the buckets launched were [0, 1] of [0, 1, 2]"),
    ("rrrr0r1rr22", 1.0, 0.0, "the buckets launched were [0, 1, 2, 2]"),
    ("rrrr0r1rr2", 0.5, 0.5, "1/2 of DDP's: they are divided by the world size twice"),
    ("rrrr0r1rr2", 1.0, 0.3, "your gradients differ from DDP's by up to 0.3"),
    ("rrrrrrrrr012", 1.0, 0.0, "every all-reduce started after the last gradient was ready"),  # launched at the end
    ("rrrr0rrrr", 1.0, 0.0, "the buckets launched were [0] of [0, 1, 2]"),  # `if` where `while` launches the rest
    ("rrrr0r1rr2", 2.0, 1.0, "your gradients are 2x DDP's: the all-reduce sums"),  # the division left out
    ("rrrr0wr1wrr2w", 1.0, 0.0, "waited for while the backward still produced gradients"),
    ("rrrr0r1rr2www", 1.0, 0.0, None),  # waited for in finish(), after the backward: right
])
def test_each_bucket_or_gradient_mistake_is_named(order, ratio, gap, words):
    step = core_step(order, ratio, gap)
    problem = sc.bucket_problem(step, 3, "here") or sc.gradient_problem(step, 2, "here")
    assert problem is None if words is None else words in problem


@pytest.mark.long
@pytest.mark.slow
def test_the_ddp_core_solution_equals_torchs_ddp(tmp_path, capsys):
    path = tmp_path / "my_ddp_core.py"
    path.write_text(CORE)
    assert sc.check_my_ddp(path)
    assert "3 buckets launched in order during the backward" in capsys.readouterr().out


def test_the_ddp_core_skeleton_is_not_launched(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sc.start_my_ddp_exercise("my_ddp_core.py")
    assert not sc.check_my_ddp("my_ddp_core.py")
    assert "still the MyDDP skeleton" in capsys.readouterr().out


ZERO1 = (SOLUTIONS / "08_3.py").read_text()
def zero1_record(names=("reduce_scatter_single", "all_gather_single"), state=1233, weights=(1.0,), gap=0.0,
                 gap_if_summed=1.0):
    """One rank's record of a 2-rank run on the 2,465-value MLP."""
    step = {"calls": [{"name": n, "values": 0} for n in names], "gap": gap, "gap_if_summed": gap_if_summed}
    return {"numel": 2465, "steps": [step], "state": state, "weights": list(weights)}


@pytest.mark.parametrize("ranks, words", [
    ([zero1_record(), zero1_record()], None),
    ([zero1_record(names=("reduce_scatter_single",))] * 2, "ZeRO-1 needs one reduce-scatter and one all-gather"),
    ([zero1_record(names=("all_reduce", "all_gather_single"))] * 2, "all-reduced the whole gradient"),
    ([zero1_record(state=2465)] * 2, "the ranks keep [2465, 2465] values of optimizer state: each needs only its chunk, 1233"),
    ([zero1_record(), zero1_record(weights=(2.0,))], "all-gather every rank's updated chunk"),
    ([zero1_record(gap=0.4)] * 2, "update exactly its own chunk"),
    ([zero1_record(gap=0.4, gap_if_summed=0.0)] * 2, "used the sum of the ranks' gradients"),  # no division
])
def test_each_zero1_record_problem_is_named(ranks, words):
    problem = sc.zero1_problem(ranks)
    assert problem is None if words is None else words in problem


@pytest.mark.long
@pytest.mark.slow
def test_the_zero1_solution_equals_one_process(tmp_path, capsys):
    path = tmp_path / "my_zero1.py"
    path.write_text(ZERO1)
    assert sc.check_my_zero1(path)
    assert capsys.readouterr().out.startswith("correct: on 2 and 3 ranks")


# each launched for real: (checker, the solution, its file name, how the sentence starts, the mistake, its words)
LAUNCHED = [(sc.check_my_ddp, CORE, "my_ddp_core.py", "not yet: on rank 0, ", *m) for m in CORE_MISTAKES.values()]


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize("checker, solution, name, start, edit, words", LAUNCHED,
                         ids=[*CORE_MISTAKES])
def test_each_launched_mistake_is_named(checker, solution, name, start, edit, words, tmp_path, capsys):
    old, new = edit
    assert old in solution, old
    (tmp_path / name).write_text(solution.replace(old, new, 1))
    assert not checker(tmp_path / name)
    out = capsys.readouterr().out
    assert out.startswith(start) and words in out, out


@pytest.mark.long
@pytest.mark.slow
def test_a_memory_prediction_is_measured_on_three_ranks(capsys):
    right = runpy.run_path(str(SOLUTIONS / "08_4.py"))["prediction"]  # the solution asserts its own verdict
    assert not sc.check_memory_prediction({**right, "parameters": 4 * 4865})  # the padding forgotten
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("correct: measured on 3 gloo ranks")
    assert "your prediction['parameters'] is 19460: too low, as measured on rank 0 of 3." in out[1]
    assert "19464" not in out[1]  # the measured bytes would give the answer away


def test_an_unanswered_prediction_starts_nothing(capsys):
    assert not sc.check_memory_prediction({"parameters": ..., "gradients": 0, "optimizer state": 0})
    assert "replace each ..." in capsys.readouterr().out


RING = (SOLUTIONS / "03_3.py").read_text()


@pytest.mark.long
@pytest.mark.slow
def test_the_ring_all_gather_solution_equals_dist_all_gather(tmp_path, capsys):
    path = tmp_path / "my_all_gather.py"
    path.write_text(RING)
    assert sc.check_my_all_gather(path)
    assert capsys.readouterr().out.startswith("correct: on 3 and 4 ranks")


def gather_case(calls=None, whose=(0, 1, 2), result_shape=(15,), sent=40) -> dict:
    """Rank 0's record of one 3-rank case: a float32 tensor of 5 values."""
    calls = calls if calls is not None else [{"name": "irecv", "peer": 2}, {"name": "isend", "peer": 1}] * 2
    return {"shape": [5], "dtype": "torch.float32", "calls": calls, "bytes": sent, "mine": 20,
            "result_shape": list(result_shape), "whose": list(whose)}


@pytest.mark.parametrize("case, words", [
    (gather_case(), None),
    (gather_case(calls=[{"name": "all_gather", "peer": None}]), "your code called dist.all_gather: build the all-gather"),
    (gather_case(calls=[{"name": "isend", "peer": 2}]), "it sent to rank 2: in the ring rank 0 sends to its right"),
    (gather_case(calls=[{"name": "irecv", "peer": 1}]), "it received from rank 1"),
    (gather_case(whose=(0, 2, 1)), "the result's pieces hold the tensors of ranks [0, 2, 1]"),
    (gather_case(result_shape=(5,)), "the result has shape [5], where dist.all_gather's concatenation has [15]"),
    (gather_case(sent=80), "it sent 80 bytes where 2 pieces of 20 are enough"),
])
def test_each_ring_all_gather_problem_is_named(case, words):
    ranks = [[case], [gather_case(calls=[{"name": "isend", "peer": 2}, {"name": "irecv", "peer": 0}])],
             [gather_case(calls=[{"name": "isend", "peer": 0}, {"name": "irecv", "peer": 1}])]]
    problem = sc.all_gather_problem(ranks)
    assert problem is None if words is None else words in problem and problem.startswith("rank 0, a float32 tensor")


def test_a_hang_and_an_abort_in_the_ring_are_explained():
    hang = "rank 0 waited 4 s in a collective that rank(s) [1] never reached: a hang (every rank's output: x/console.log)"
    assert "for a message that never came" in sc.message_problem(hang, 3)
    assert sc.message_problem(hang, 3).endswith("(every rank's output: x/console.log).")
    abort = "on 3 ranks, rank 0 raised Fatal Python error: Aborted (every rank's output: x/console.log)."
    assert "differs from its receive buffer" in sc.message_problem(abort, 3)


@pytest.mark.long
@pytest.mark.slow
def test_a_ring_all_gather_that_never_waits_is_told_to_wait(tmp_path, capsys):
    path = tmp_path / "my_all_gather.py"
    path.write_text(RING.replace("        incoming.wait()\n        outgoing.wait()\n", ""))
    assert not sc.check_my_all_gather(path)
    assert "call .wait() on each handle" in capsys.readouterr().out


def test_a_folder_a_non_utf8_file_or_an_impossible_setting_is_one_sentence(tmp_path, capsys):
    assert not sc.check_ddp_script(tmp_path)
    (tmp_path / "latin1.py").write_bytes("# caf\xe9\n".encode("latin-1"))
    assert not sc.check_ddp_script(tmp_path / "latin1.py")
    assert not sc.check_memory_prediction({"parameters": 1}, stage=7)
    assert not sc.check_memory_prediction({"parameters": 1}, world_size=0)
    out = capsys.readouterr().out.splitlines()
    assert ["is a folder" in out[0], "is not UTF-8" in out[1], "stage must be 1, 2 or 3" in out[2],
            "world_size must be a whole number" in out[3]] == [True] * 4, out


# The survivors' average (the exercise for the per-step fault tolerance): a right answer, and each usual slip named
LIVE_MEAN = (SOLUTIONS / "11_3.py").read_text()


def live_records(world_size: int, dead: list[int], result=None, returned=None) -> list[list[dict]]:
    """Every rank's record of one float32 case, as my_live_mean_check writes it: the right one unless told."""
    from dp_helpers.course.checkers.my_live_mean_check import grads_of

    live = [r for r in range(world_size) if r not in dead]
    right = [sum(gs) / len(live) for gs in zip(*(grads_of(r, torch.float32) for r in live), strict=True)]

    def record(rank):
        grads = result(rank) if result else right
        return [{"dead": dead, "dtype": "torch.float32", "returned": len(live) if returned is None else returned,
                 "grads": [g.tolist() for g in grads], "calls": ["all_reduce"]}]

    return [record(r) for r in range(world_size)]


def test_each_survivors_average_slip_is_named():
    from dp_helpers.course.checkers.my_live_mean_check import grads_of

    def everyone(rank):
        return [sum(gs) / 3 for gs in zip(*(grads_of(r, torch.float32) for r in range(3)), strict=True)]

    def by_world_size(rank):
        return [sum(gs) / 3 for gs in zip(*(grads_of(r, torch.float32) for r in (0, 2)), strict=True)]

    def dead_keeps_its_own(rank):
        return grads_of(1, torch.float32) if rank == 1 else live_records(3, [1])[0][0]["grads"]

    assert sc.live_mean_problem(live_records(3, [1])) is None
    assert sc.live_mean_problem(live_records(3, [])) is None
    for records, words in [
        (live_records(3, [1], returned=3), "with rank(s) [1] dead, rank 0 returned 3, where 2 ranks are alive"),
        (live_records(3, [1], everyone), "became the mean over all 3 ranks: a dead replica's values must not count"),
        (live_records(3, [1], by_world_size), "divide by the number of ranks alive, not by the world size"),
        (live_records(3, [1], lambda r: [torch.as_tensor(g) for g in dead_keeps_its_own(r)]),
         "rank 1: dead in this case, it kept its own values"),
    ]:
        problem = sc.live_mean_problem(records)
        assert problem is not None and words in problem, problem


@pytest.mark.long
@pytest.mark.slow
def test_the_survivors_average_on_ranks_passes_and_a_world_size_divisor_is_named(tmp_path, capsys):
    path = tmp_path / "my_live_mean.py"
    path.write_text(LIVE_MEAN)
    assert sc.check_my_live_mean(path)
    path.write_text(LIVE_MEAN.replace("/ count)", "/ dist.get_world_size())"))
    assert not sc.check_my_live_mean(path)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("correct: on 3 and 4 ranks") and "not by the world size" in out[1]


def test_the_live_mean_skeleton_is_refused_untouched(tmp_path, capsys):
    sc.start_my_live_mean_exercise(tmp_path / "my_live_mean.py")
    assert "the live_mean skeleton, ready to edit" in capsys.readouterr().out
    assert not sc.check_my_live_mean(tmp_path / "my_live_mean.py")
