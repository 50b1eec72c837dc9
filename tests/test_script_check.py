"""Notebook 00's checker: the solution passes on real ranks, and each typical mistake comes back as its own sentence."""

import runpy
from pathlib import Path

import pytest

from dp_helpers import script_check as sc
from dp_helpers.exercises import SOLUTIONS

SOLUTION = (SOLUTIONS / "00_1.py").read_text()
RANK_0_SAVES = "    if rank == 0:\n        torch.save("
SAMPLER = ("    sampler = DistributedSampler(dataset, shuffle=True, seed=0)  # this rank's share, shuffled as one device did\n"
           "    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)\n")
SET_EPOCH = "        sampler.set_epoch(epoch)  # a new order every epoch, the same on every rank\n"
REDUCE = "        dist.all_reduce(total)  # every rank: the sums over all ranks\n        if rank == 0:\n"
JOINED = "    rank = dist.get_rank()\n"


def mistake(*edits: tuple[str, str]) -> str:
    """The solution with one typical mistake made in it (each edit must apply: the solution may not drift away)."""
    text = SOLUTION
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


# the mistakes the exercise names, each with the words its sentence must hold
MISTAKES = {
    "no set_epoch": (mistake((SET_EPOCH, "")), "call sampler.set_epoch(epoch)"),
    "no sampler": (mistake((SAMPLER, "    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True)\n"),
                           (SET_EPOCH, "")), "no DistributedSampler"),
    "saving on every rank": (mistake((RANK_0_SAVES, "    if True:\n        torch.save(")), "rank 1 saved too"),
    "a division too many": (mistake(("loss = nn.functional.mse_loss(model(x), y)",
                                     "loss = nn.functional.mse_loss(model(x), y) / dist.get_world_size()")),
                            "2x too small: DDP already averages"),
    "a collective inside if rank == 0": (mistake((REDUCE, "        if rank == 0:\n            dist.all_reduce(total)\n")),
                                         "rank 0 called all_reduce (its collective number 1) and rank 1 never called"),
    "a hang": (mistake((JOINED, JOINED + "    while rank == 1:  # stuck for ever\n        pass\n")),
               "rank 0 waited 10 s in a collective that rank(s) [1] never reached"),
}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "my_ddp.py"
    path.write_text(text)
    return path


@pytest.mark.slow
def test_the_solution_is_correct_on_2_and_3_ranks(tmp_path, capsys):
    assert sc.check_ddp_script(write(tmp_path, SOLUTION))
    assert capsys.readouterr().out.startswith("correct: on 2 and 3 ranks")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_each_mistake_is_named(name, tmp_path, capsys):
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
    fields = {"weights": {"weight": 0, "bias": 0}, "losses": [1.0] * sc.EPOCHS, "printers": [0], "probes": good}
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
    assert "rank 0 called barrier (its collective number 2) and rank 1 called broadcast" in sc.collective_mismatch(calls)
    assert sc.collective_mismatch({0: calls[0][:2], 1: calls[1][:2]}) is None


def test_epoch_lines_are_read_in_any_common_format():
    assert sc.epoch_losses(["epoch 1 loss 0.5", "Epoch 2/4: loss=0.25", "step 7 loss 9.0", "epoch 3 | loss 1e-3"]) \
        == [0.5, 0.25]


CORE = (SOLUTIONS / "04_3.py").read_text()
LOOP = ("        while self.next < len(self.buckets) and all(p in self.ready_params for p in self.buckets[self.next]):\n"
        "            self.launch(self.next)  # every rank launches the buckets in this one order\n"
        "            self.next += 1\n")
AT_THE_END = "        if len(self.ready_params) == sum(map(len, self.buckets)):\n            for k in {}:\n                self.launch(k)\n"
CORE_MISTAKES = {
    "summed": ((" / dist.get_world_size()", ""), "your gradients are 2x DDP's"),
    "launched after the backward": ((LOOP, AT_THE_END.format("range(len(self.buckets))")),
                                    "every all-reduce started after the last gradient was ready"),
    "out of order": ((LOOP, AT_THE_END.format("reversed(range(len(self.buckets)))")),
                     "the buckets were launched in the order [2, 1, 0]"),
    "a bucket never launched": (("while self.next < len(self.buckets) and", "while self.next < len(self.buckets) - 1 and"),
                                "the buckets launched were [0, 1] of [0, 1, 2]"),
}


@pytest.mark.slow
def test_the_ddp_core_solution_equals_torchs_ddp(tmp_path, capsys):
    path = tmp_path / "my_ddp_core.py"
    path.write_text(CORE)
    assert sc.check_my_ddp(path)
    assert "3 buckets launched in order during the backward" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CORE_MISTAKES))
def test_each_ddp_core_mistake_is_named(name, tmp_path, capsys):
    (old, new), words = CORE_MISTAKES[name]
    assert old in CORE, old
    path = tmp_path / "my_ddp_core.py"
    path.write_text(CORE.replace(old, new, 1))
    assert not sc.check_my_ddp(path)
    out = capsys.readouterr().out
    assert out.startswith("not yet: on rank 0, step 1, ") and words in out, out


def test_the_ddp_core_skeleton_is_not_launched(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sc.start_my_ddp_exercise("my_ddp_core.py")
    assert not sc.check_my_ddp("my_ddp_core.py")
    assert "still the MyDDP skeleton" in capsys.readouterr().out


ZERO1 = (SOLUTIONS / "06_3.py").read_text()
ZERO1_MISTAKES = {
    "an all-reduce": (("        mine = torch.empty(self.chunk)\n        reduce_scatter(mine, self.flat(p.grad for p in self.params))",
                       "        full_grad = self.flat(p.grad for p in self.params)\n        dist.all_reduce(full_grad)\n"
                       "        mine = full_grad[self.rank * self.chunk:(self.rank + 1) * self.chunk]"),
                      "all-reduced the whole gradient"),
    "no division": (("        mine /= self.world_size  # the average gradient\n", ""), "used the sum of the ranks' gradients"),
    "no all-gather": (("        full = torch.empty(self.chunk * self.world_size)\n"
                       "        all_gather(full, own.contiguous())  # every rank's updated chunk, in rank order\n",
                       "        full = self.flat(self.params)  # only this rank's chunk updated: the others stay old\n"
                       "        full[self.rank * self.chunk:(self.rank + 1) * self.chunk] = own\n"),
                      "ZeRO-1 needs one reduce-scatter and one all-gather"),
    "the wrong chunk": (("[self.rank * self.chunk:(self.rank + 1) * self.chunk]\n        self.velocity", "[:self.chunk]\n"
                         "        self.velocity"), "is each rank updating exactly its own chunk"),
}


@pytest.mark.slow
def test_the_zero1_solution_equals_one_process(tmp_path, capsys):
    path = tmp_path / "my_zero1.py"
    path.write_text(ZERO1)
    assert sc.check_my_zero1(path)
    assert capsys.readouterr().out.startswith("correct: on 2 and 3 ranks")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ZERO1_MISTAKES))
def test_each_zero1_mistake_is_named(name, tmp_path, capsys):
    (old, new), words = ZERO1_MISTAKES[name]
    assert old in ZERO1, old
    path = tmp_path / "my_zero1.py"
    path.write_text(ZERO1.replace(old, new, 1))
    assert not sc.check_my_zero1(path)
    out = capsys.readouterr().out
    assert out.startswith("not yet: on 2 ranks, ") and words in out, out


@pytest.mark.slow
def test_a_memory_prediction_is_measured_on_three_ranks(capsys):
    right = runpy.run_path(str(SOLUTIONS / "06_4.py"))["prediction"]  # the solution asserts its own verdict
    assert not sc.check_memory_prediction({**right, "parameters": 4 * 4865})  # the padding forgotten
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("correct: measured on 3 gloo ranks")
    assert "your prediction['parameters'] is 19460; measured on rank 0 of 3: {'parameters': 19464" in out[1]


def test_an_unanswered_prediction_starts_nothing(capsys):
    assert not sc.check_memory_prediction({"parameters": ..., "gradients": 0, "optimizer state": 0})
    assert "replace each ..." in capsys.readouterr().out
