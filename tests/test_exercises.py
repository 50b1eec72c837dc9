"""Every exercise checker says correct for the reference answer and not yet for a wrong or missing one."""

import os
import runpy
import tempfile

import pytest
import torch
from torch import nn

from dp_helpers.course.checkers import exercises as ex
from dp_helpers.tool.data import chunk_sizes

RIGHT = {
    "00 one-device batch for 4 ranks of 8": 32,
    "00 rank 1's total after the all-reduce": [16.0, 32.0],
    "01 rows for 17 on 5": [4, 4, 4, 4, 1],
    "01 devices with work for 9 on 8": 5,
    "01 repeated sample of 11 on 4": {"samples": [0], "ranks": [0, 3]},
    "02 bytes replicated for 1e6 on 4": 12_000_000,
    "02 mean of shard means is the batch loss": False,
    "03 naive and ring MB for 100 MB on 8": {"ring": 175.0, "naive": 700.0},
    "04 all-reduces per step for 4,1,1,4,0.5 MiB at 5": 2,  # last layer first: [0.5, 4, 1] and [1, 4]
    "05 buckets of the wide MLP at bucket_cap_mb=2": {"all-reduces per step": 3, "tensors in the first bucket": 6},
    "05 ring MB per rank for 25e6 gradients on 8": {"fp32": 175.0, "fp16": 87.5},  # 2 (W - 1) / W of 100 and 50 MB
    "06 BatchNorm statistics of [1, 2, 3] and [5, 7, 9]": {"rank 0 mean": 2, "rank 0 variance": 2 / 3, "global mean": 4.5,
                                                           "global variance": 169 / 6 - 4.5**2},
    "06 evaluated and repeated for 10 on 4": {"evaluated": 12, "twice": [0, 1]},
    "07 steps when resuming after 3 of 6 epochs": {"resumes at step": 15, "steps after resuming": 15},  # 5 per epoch
    "07 epoch a restart without --checkpoint starts at": 1,
    "08 GB per rank for 1e9 parameters, ZeRO-2 on 8": 5.5,  # 4 bytes of parameters + (4 + 8) / 8 bytes, per parameter
    "09 efficiency when t_comm grows": "lower",
    "09 faster ring on 8 ranks at 10 us and 10 GB/s": {"8 B": "naive", "100 MB": "ring"},
    "09 DataParallel emulation limit at f = 1/3": 1.5,
    "10 PowerSGD saving for a 4096 x 4096 matrix at rank 8": 256,
    "10 DiLoCo share of DDP's bytes at H = 32": 1 / 32,
    "11 Streaming DiLoCo's MB per synchronisation for 1e9 fp32 parameters in 4 fragments": 1000,  # 4e9 bytes / 4
    "11 steps every replica takes again after a restart from the step-1500 checkpoint": 240,  # 1501-1740, 1740 unfinished
}


def test_every_numeric_exercise_has_a_tested_answer():
    assert set(RIGHT) == set(ex.ANSWERS)


@pytest.mark.parametrize("key", sorted(RIGHT))
def test_check_answer_both_ways(key, capsys):
    assert ex.check_answer(key, RIGHT[key])
    assert not ex.check_answer(key, "something else")
    assert not ex.check_answer(key, ...)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("correct") and out[1].startswith("not yet") and "replace the ..." in out[2]


def test_a_dict_with_a_blank_is_unanswered(capsys):
    assert not ex.check_answer("01 repeated sample of 11 on 4", {"samples": [0], "ranks": ...})
    assert "replace the ..." in capsys.readouterr().out


def test_verdict_is_truthy_and_adds_nothing_to_the_printed_line():
    assert ex.Verdict(True) and not ex.Verdict(False)
    assert ex.Verdict(True)._ipython_display_() is None and repr(ex.Verdict(False)) == "Verdict(not yet)"


def shard(samples, world_size, rank):
    padded = list(range(samples)) * (world_size // samples + 2)
    total = -(-samples // world_size) * world_size
    return padded[:total][rank::world_size]


def scatter(batch, n):
    rows = -(-len(batch) // n)
    return [batch[i:i + rows] for i in range(0, len(batch), rows)]


def ring_sums(rank, chunk, step, world_size):
    """The chunk this rank received in reduce-scatter step k holds k + 2 ranks' values; the others its own alone."""
    k = (rank - 1 - chunk) % world_size  # the step in which `chunk` arrived (W - 1: never, it is the one first sent)
    return k + 2 if k <= step else 1


def ring_sums_just_received(rank, chunk, step, world_size):
    return step + 2 if chunk == (rank - step - 1) % world_size else 1


def ring_sums_one_short(rank, chunk, step, world_size):
    return max(ring_sums(rank, chunk, step, world_size) - 1, 1)


def accumulate(model, micro_batches, optimizer, no_sync):
    optimizer.zero_grad()
    total = sum(len(x) for x, _ in micro_batches)
    for j, (x, y) in enumerate(micro_batches):
        context = no_sync() if j < len(micro_batches) - 1 else torch.enable_grad()
        with context:
            (nn.functional.binary_cross_entropy(model(x), y.unsqueeze(1)) * len(x) / total).backward()
    optimizer.step()


def accumulate_forward_outside(model, micro_batches, optimizer, no_sync):
    optimizer.zero_grad()
    for j, (x, y) in enumerate(micro_batches):
        loss = nn.functional.binary_cross_entropy(model(x), y.unsqueeze(1)) / len(micro_batches)
        with no_sync() if j < len(micro_batches) - 1 else torch.enable_grad():
            loss.backward()  # DDP needs the forward inside no_sync too
    optimizer.step()


def accumulate_no_division(model, micro_batches, optimizer, no_sync):
    optimizer.zero_grad()
    for j, (x, y) in enumerate(micro_batches):
        with no_sync() if j < len(micro_batches) - 1 else torch.enable_grad():
            nn.functional.binary_cross_entropy(model(x), y.unsqueeze(1)).backward()
    optimizer.step()


def accumulate_by_k(model, micro_batches, optimizer, no_sync):
    """Right for equal micro-batches only: 1/k weighs a short one as much as a full one."""
    optimizer.zero_grad()
    for j, (x, y) in enumerate(micro_batches):
        with no_sync() if j < len(micro_batches) - 1 else torch.enable_grad():
            (nn.functional.binary_cross_entropy(model(x), y.unsqueeze(1)) / len(micro_batches)).backward()
    optimizer.step()


def accumulate_without_zero_grad(model, micro_batches, optimizer, no_sync):
    total = sum(len(x) for x, _ in micro_batches)
    for j, (x, y) in enumerate(micro_batches):
        with no_sync() if j < len(micro_batches) - 1 else torch.enable_grad():
            (nn.functional.binary_cross_entropy(model(x), y.unsqueeze(1)) * len(x) / total).backward()
    optimizer.step()


def buckets(sizes, cap):
    out = [[]]
    for i in range(len(sizes)):
        if sum(sizes[j] for j in out[-1]) >= cap:
            out.append([])
        out[-1].append(i)
    return out


def buckets_below_cap(sizes, cap):
    """A common wrong reading: a bucket never exceeds the cap (the crossing tensor starts the next one)."""
    out = [[]]
    for i, size in enumerate(sizes):
        if out[-1] and sum(sizes[j] for j in out[-1]) + size > cap:
            out.append([])
        out[-1].append(i)
    return out


def chunk(numel, world_size, rank):
    size = -(-numel // world_size)
    return min(numel, rank * size), min(numel, rank * size + size)


def not_written(*args):
    raise NotImplementedError


@pytest.mark.parametrize("checker, right, wrong, words", [
    (ex.check_shard, shard, lambda n, w, r: list(range(r, n, w)), "expected"),
    (ex.check_scatter, scatter, lambda x, n: [x[i::n] for i in range(min(n, len(x)))], "expected"),
    (ex.check_ring_sums, ring_sums, lambda r, c, s, w: w, "expected"),
    (ex.check_ring_sums, ring_sums, ring_sums_just_received, "count the chunks this rank received in earlier"),
    (ex.check_ring_sums, ring_sums, ring_sums_one_short, "one too few"),
    (ex.check_accumulate, accumulate, accumulate_forward_outside, "inside no_sync"),
    (ex.check_accumulate, accumulate, accumulate_no_division, "divide each loss by k"),
    (ex.check_accumulate, accumulate, accumulate_by_k, "not by 1/k"),
    (ex.check_accumulate, accumulate, accumulate_without_zero_grad, "call optimizer.zero_grad() first"),
    (ex.check_buckets, buckets, buckets_below_cap, "expected"),
    (ex.check_chunk, chunk, lambda n, w, r: (r * n // w, (r + 1) * n // w), "expected"),
    (ex.check_naive_ring_time, ex.naive_ring_time, lambda b, w, a, bw: 2 * (w - 1) * (a + b / w / bw), "expected"),
    (ex.check_low_rank, lambda m, q: (p := torch.linalg.qr(m @ q).Q) @ (m.T @ p).T, lambda m, q: m @ q @ q.T, "expected"),
])
def test_function_checkers_both_ways(checker, right, wrong, words, capsys):
    assert checker(right)
    assert not checker(wrong)
    assert not checker(not_written)
    assert not checker(lambda *args: ...)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("correct") and words in out[1] and "NotImplementedError" in out[2]
    # a function that returns `...` without training: no forward ran, so check_accumulate names the forwards
    assert ("forwards inside no_sync were []" if checker is ex.check_accumulate else "write its body") in out[3]


def test_scatter_reference_is_the_chunk_rule():
    assert [len(p) for p in scatter(torch.arange(10), 8)] == chunk_sizes(10, 8)


@pytest.mark.parametrize("got, want", [
    (1 / (1 - 1 / 3), 1.5), ("Lower", "lower"), (" lower ", "lower"), ((4, 4, 1), [4, 4, 1]), (torch.tensor(2), 2),
    (torch.tensor([16.0, 32.0]), [16.0, 32.0]), ({"Ring": 175, "naive": 700.0}, {"ring": 175.0, "naive": 700.0}),
    ("no", False), (True, True), (2.0, 2),
])
def test_natural_answers_are_accepted(got, want):
    assert ex.difference(got, want) is None


@pytest.mark.parametrize("got, want, words", [
    (4, [4, 4, 4, 4, 1], "a list of 5 values is asked"),
    ([4, 4], [4, 4, 1], "has 2 values; 3 are asked"),
    ([4, 4, 2], [4, 4, 1], "the value at index 2 of your answer is 2"),
    (166.893, 175.0, "MiB where MB (10^6 bytes) are asked"),
    (5.5e9, 5.5, "bytes where GB are asked"),
    ({"ring": 175.0}, {"ring": 175.0, "naive": 700.0}, "the keys ['naive', 'ring'] are asked"),
    ({"ring": 175.0, "naive": 7.0}, {"ring": 175.0, "naive": 700.0}, "your answer['naive'] is 7.0"),
    ("higher", "lower", "your answer is 'higher'"),
    (1, True, "True or False is asked"),
    ("lower", 1.5, "one number is asked"),
])
def test_wrong_answers_are_named(got, want, words):
    assert words in ex.difference(got, want)


SOLUTIONS = sorted(ex.SOLUTIONS.glob("*.py"))
# code for ranks: tests/test_script_check.py launches it (07_4.py: tests/test_capstone.py, as examples/train_ddp_real.py;
# 08_5.py: tests/test_fsdp_check.py, as examples/train_fsdp.py)
SCRIPTS = {"00_1.py", "03_3.py", "04_3.py", "07_4.py", "08_3.py", "08_4.py", "08_5.py", "11_3.py"}


@pytest.mark.parametrize("path", [p for p in SOLUTIONS if p.name not in SCRIPTS], ids=lambda p: p.name)
def test_every_solution_passes_its_checker(path, capsys):
    runpy.run_path(str(path), run_name="__main__")  # each ends with `assert check_...(...)`
    assert capsys.readouterr().out.splitlines()[-1].startswith("correct")


def test_solution_shows_the_file_and_names_the_keys_when_wrong():
    assert "answer_2 = 4 * 8" in ex.solution("00.2").data
    with pytest.raises(ex.UsageError, match="there is no solution '9.9'; the exercises with one are 00.1, 00.2"):
        ex.solution("9.9")


def test_forbidden_calls_and_natural_types_and_exceptions_are_answered_in_one_line(capsys):
    def with_chunk(batch, n):
        return list(batch.chunk(n))

    def as_tuple(samples, world_size, rank):
        return tuple(range(rank, samples, world_size))  # a tuple for a list, wrong only where padding is needed

    assert not ex.check_scatter(with_chunk)
    assert not ex.check_shard(as_tuple)
    assert ex.check_ring_sums(lambda r, c, s, w: float(ring_sums(r, c, s, w)))  # a float for an int
    assert not ex.check_shard(lambda n, w, r: 1 / 0)
    out = capsys.readouterr().out.splitlines()
    assert "your function calls chunk: the exercise asks for slicing only" in out[0]
    assert "expected [0], got ()." in out[1] and out[2].startswith("correct")
    assert "your function raised ZeroDivisionError: division by zero." in out[3]


def slipped(key, **entries):
    """The right table answer to `key` with some entries replaced by a slip."""
    return {**RIGHT[key], **{k.replace("_", " "): v for k, v in entries.items()}}


SLIPS = [  # (question, an answer by one known slip, words the checker must say)
    ("00 rank 1's total after the all-reduce", [8.0, 16.0], "divides each gradient by the world size"),
    ("00 rank 1's total after the all-reduce", [6.0, 16.0], "what rank 1 held before"),
    ("01 rows for 17 on 5", [4, 4, 3, 3, 3], "tensor_split's rule"),
    ("01 devices with work for 9 on 8", 8, "the rows run out"),
    ("01 repeated sample of 11 on 4", {"samples": [10], "ranks": [0, 3]}, "pads with the first indices"),
    ("02 bytes replicated for 1e6 on 4", 3_000_000, "a float32 holds 4"),
    ("03 naive and ring MB for 100 MB on 8", {"ring": 87.5, "naive": 700}, "the reduce-scatter alone"),
    ("03 naive and ring MB for 100 MB on 8", {"ring": 200, "naive": 700}, "not 8 steps"),
    ("03 naive and ring MB for 100 MB on 8", {"ring": 175, "naive": 800}, "no rank sends to itself"),
    ("04 all-reduces per step for 4,1,1,4,0.5 MiB at 5", 3, "last first"),
    ("05 buckets of the wide MLP at bucket_cap_mb=2",
     slipped("05 buckets of the wide MLP at bucket_cap_mb=2", tensors_in_the_first_bucket=5), "from the head"),
    ("05 buckets of the wide MLP at bucket_cap_mb=2",
     slipped("05 buckets of the wide MLP at bucket_cap_mb=2", tensors_in_the_first_bucket=4), "first bucket of 1 MiB"),
    ("05 ring MB per rank for 25e6 gradients on 8", {"fp32": 100, "fp16": 50}, "the gradient itself"),
    ("06 BatchNorm statistics of [1, 2, 3] and [5, 7, 9]",
     slipped("06 BatchNorm statistics of [1, 2, 3] and [5, 7, 9]", rank_0_variance=1.0), "divides by N - 1"),
    ("06 BatchNorm statistics of [1, 2, 3] and [5, 7, 9]",
     slipped("06 BatchNorm statistics of [1, 2, 3] and [5, 7, 9]", global_variance=9.5), "divides by N - 1"),
    ("06 evaluated and repeated for 10 on 4", {"evaluated": 10, "twice": []}, "pads 10 samples to 12"),
    ("07 steps when resuming after 3 of 6 epochs", {"resumes at step": 16, "steps after resuming": 15},
     "steps count from 0"),
    ("07 steps when resuming after 3 of 6 epochs", {"resumes at step": 30, "steps after resuming": 30},
     "5 steps an epoch"),
    ("07 epoch a restart without --checkpoint starts at", 5, "it starts over"),
    ("07 epoch a restart without --checkpoint starts at", 0, "count from 1"),
    ("08 GB per rank for 1e9 parameters, ZeRO-2 on 8", 2, "ZeRO-3's figure"),
    ("08 GB per rank for 1e9 parameters, ZeRO-2 on 8", 9, "ZeRO-1's figure"),
    ("08 GB per rank for 1e9 parameters, ZeRO-2 on 8", 16, "DDP's figure"),
    ("08 GB per rank for 1e9 parameters, ZeRO-2 on 8", 3.75, "the paper's mixed precision"),
    ("09 DataParallel emulation limit at f = 1/3", 3, "1 / (1 - f)"),
    ("10 PowerSGD saving for a 4096 x 4096 matrix at rank 8", 512, "two factors"),
    ("10 DiLoCo share of DDP's bytes at H = 32", 32, "its inverse"),
    ("11 Streaming DiLoCo's MB per synchronisation for 1e9 fp32 parameters in 4 fragments", 4000, "one fragment"),
    ("11 steps every replica takes again after a restart from the step-1500 checkpoint", 239, "taken again too"),
]


@pytest.mark.parametrize(("key", "answer", "words"), SLIPS)
def test_a_numeric_checker_names_the_slip_an_answer_matches(key, answer, words, capsys):
    assert not ex.check_answer(key, answer)
    said = capsys.readouterr().out
    assert words in said and "recheck the rule" not in said


def test_every_known_slip_is_tried_and_named_in_chinese_too(capsys):
    from dp_helpers.course.i18n import set_language

    assert {key for key, _, _ in SLIPS} == set(ex.LIKELY_MISTAKES) - {"00 one-device batch for 4 ranks of 8"}
    set_language("zh-CN")
    try:
        for key, answer, _ in SLIPS:
            assert not ex.check_answer(key, answer)
            said = capsys.readouterr().out
            assert said.startswith("还不对") and "请对照本笔记本中的规则" not in said, said
    finally:
        set_language("en")


def test_a_count_gets_no_unit_hint_and_a_known_slip_is_named(capsys):
    assert not ex.check_answer("00 one-device batch for 4 ranks of 8", 4)
    assert not ex.check_answer("02 bytes replicated for 1e6 on 4", 16_000_000)
    out = capsys.readouterr().out.splitlines()
    assert "bits" not in out[0] and "4 is the number of processes" in out[0]
    assert "that counts device 0 too" in out[1]


def exact_mean(samples, score, rank, world_size, all_reduce):
    mine = range(rank, samples, world_size)
    totals = torch.tensor([sum(score(i) for i in mine), len(mine)], dtype=torch.float64)
    all_reduce(totals)
    return (totals[0] / totals[1]).item()


def padded_mean(samples, score, rank, world_size, all_reduce):
    mine = [(rank + k * world_size) % samples for k in range(-(-samples // world_size))]  # as the sampler pads
    totals = torch.tensor([sum(score(i) for i in mine), len(mine)], dtype=torch.float64)
    all_reduce(totals)
    return (totals[0] / totals[1]).item()


def mean_of_means(samples, score, rank, world_size, all_reduce):
    mine = range(rank, samples, world_size)
    mean = torch.tensor([sum(score(i) for i in mine) / max(len(mine), 1)], dtype=torch.float64)
    all_reduce(mean)
    return mean.item() / world_size


def skips_when_empty(samples, score, rank, world_size, all_reduce):
    if rank >= samples:
        return 0.0  # leaves the others waiting in their all_reduce
    return exact_mean(samples, score, rank, world_size, all_reduce)


def over_own_count(samples, score, rank, world_size, all_reduce):
    mine = range(rank, samples, world_size)
    total = torch.tensor([sum(score(i) for i in mine)], dtype=torch.float64)
    all_reduce(total)
    return total.item() / max(len(mine), 1)


def over_equal_counts(samples, score, rank, world_size, all_reduce):
    mine = range(rank, samples, world_size)
    total = torch.tensor([sum(score(i) for i in mine)], dtype=torch.float64)
    all_reduce(total)
    return total.item() / (world_size * max(len(mine), 1))


@pytest.mark.parametrize("wrong, words", [(padded_mean, "scored more than once"), (mean_of_means, "per-rank means"),
                                          (over_own_count, "own count"), (over_equal_counts, "as if every shard"),
                                          (skips_when_empty, "every rank calls every collective"),
                                          (lambda n, s, r, w, a: sum(map(s, range(n))) / n, "every rank scored every"),
                                          (not_written, "NotImplementedError")])
def test_the_exact_evaluation_checker_runs_ranks_and_names_each_mistake(wrong, words, capsys):
    assert ex.check_exact_eval(exact_mean) and not ex.check_exact_eval(wrong)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("correct") and words in out[1]


def save_through(tmp, state, path):
    """Write to tmp, rename onto path; on failure remove tmp and re-raise."""
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    except BaseException:
        os.remove(tmp) if os.path.exists(tmp) else None
        raise


def atomic_save(state, path):
    save_through(f"{path}.tmp", state, path)


def save_through_mkstemp(state, path):
    """The temporary file from tempfile.mkstemp, written through os.fdopen (its name is the descriptor)."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=os.path.basename(path) + ".")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def save_through_named_temporary_file(state, path):
    with tempfile.NamedTemporaryFile(dir=os.path.dirname(path), delete=False) as f:
        try:
            torch.save(state, f)
        except BaseException:
            f.close()
            os.unlink(f.name)
            raise
    os.replace(f.name, path)


def save_through_an_open_file(state, path):
    try:
        with open(f"{path}.tmp", "wb") as f:
            torch.save(state, f)
        os.replace(f"{path}.tmp", path)
    except BaseException:
        os.remove(f"{path}.tmp")
        raise


@pytest.mark.parametrize("right", [atomic_save, save_through_mkstemp, save_through_named_temporary_file,
                                   save_through_an_open_file])
def test_the_atomic_save_checker_takes_any_right_answer(right, capsys):
    assert ex.check_atomic_save(right), capsys.readouterr().out


def save_in_place(state, path):
    torch.save(state, path)


def save_without_clean_up(state, path):
    torch.save(state, f"{path}.tmp")
    os.replace(f"{path}.tmp", path)


def save_elsewhere(state, path):
    save_through(os.path.join(os.path.dirname(os.path.dirname(path)), "elsewhere.tmp"), state, path)


def save_quietly(state, path):
    try:
        atomic_save(state, path)
    except OSError:
        pass


@pytest.mark.parametrize("wrong, words", [(save_in_place, "destroyed the previous snapshot"),
                                          (save_without_clean_up, "left ['snapshot.pt.tmp'] behind"),
                                          (save_elsewhere, "in another folder"), (save_quietly, "let the OSError"),
                                          (lambda state, path: None, "there is no file"),
                                          (not_written, "NotImplementedError")])
def test_the_atomic_save_checker_crashes_a_save_and_names_each_mistake(wrong, words, capsys):
    assert ex.check_atomic_save(atomic_save) and not ex.check_atomic_save(wrong)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("correct") and words in out[1]


def test_a_rounded_answer_is_right_at_the_precision_it_shows():
    from dp_helpers.course.checkers.exercises import difference

    for shown, value in ((0.667, 2 / 3), (0.6667, 2 / 3), (7.917, 95 / 12), (7.92, 95 / 12)):
        assert difference(shown, value) is None, shown
    assert "3 significant digits" in difference(0.67, 2 / 3)
    for wrong in (0.668, 0.7, 7.9):
        assert difference(wrong, 95 / 12 if wrong > 1 else 2 / 3) is not None, wrong


def test_a_list_answer_names_the_index_that_differs():
    from dp_helpers.course.checkers.exercises import difference

    assert difference([0, 1, 2, 3, 5], [0, 1, 2, 3, 4]) == "the value at index 4 of your answer is 5"


def test_low_rank_checker_names_a_p_left_unorthonormalised(capsys):
    from dp_helpers.course.checkers.exercises import check_low_rank

    assert not check_low_rank(lambda m, q: (m @ q) @ (m.T @ (m @ q)).T)
    assert "orthonormalise P's columns" in capsys.readouterr().out


def test_an_unknown_question_lists_the_notebooks_questions(capsys):
    assert not ex.check_answer("00 no such question", 3)
    out = capsys.readouterr().out
    assert out.startswith("not yet: there is no question '00 no such question'") and "'00 " in out.split(":", 2)[2]
