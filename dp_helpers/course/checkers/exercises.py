"""Checkers for the notebooks' exercises: each prints "correct" or the first case that differs.

Every checker prints one line and returns a Verdict, true when correct. An answer left as `...`
(or a function that still raises NotImplementedError) is "not answered yet", never an error, so a
notebook runs top to bottom before the learner has written anything.
The solutions live outside the notebooks, in solutions/<notebook>_<exercise>.py, so that no page shows one
before it is asked for: `solution("04.1")` displays it. tests/test_exercises.py runs every solution and
every checker against right and wrong answers.
"""

from __future__ import annotations

import collections
import contextlib
import inspect
import itertools
import math
import os
import re
import threading
from pathlib import Path

import torch
from torch import nn

from dp_helpers.scratch.collectives.ring import (
    naive_ring_bytes,
    ring_buffers,
    ring_bytes,
    ring_time,
)
from dp_helpers.scratch.communicating_less import compression
from dp_helpers.scratch.dataparallel.scatter_gather import replication_bytes
from dp_helpers.scratch.ddp.mini_ddp import assign_buckets
from dp_helpers.scratch.sharding.memory import zero_bytes
from dp_helpers.scratch.sharding.zero import Flat
from dp_helpers.tool.data import chunk_sizes, sampler_indices
from dp_helpers.tool.i18n import tr, tr_later
from dp_helpers.tool.request import UsageError
from dp_helpers.tool.sampler import shard_plan
from dp_helpers.tool.training import bce_loss, train_step

# the value each numeric exercise expects: computed by the package where it holds the rule, a literal where the
# answer is a word or a limit taken in the notebook's own prose
ANSWERS = {
    "00 one-device batch for 4 ranks of 8": lambda: 4 * 8,  # world_size x per-process batch
    "00 rank 1's total after the all-reduce": lambda: (torch.tensor([10.0, 16.0]) + torch.tensor([6.0, 16.0])).tolist(),
    "01 rows for 17 on 5": lambda: chunk_sizes(17, 5),
    "01 devices with work for 9 on 8": lambda: len(chunk_sizes(9, 8)),
    "01 repeated sample of 11 on 4": lambda: _repeat(sampler_indices(11, 4, shuffle=False)),
    "02 bytes replicated for 1e6 on 4": lambda: replication_bytes(nn.Linear(1000, 1000, bias=False), 4),
    "03 naive and ring MB for 100 MB on 8": lambda: {"ring": ring_bytes(25_000_000, 4, 8, 0) / 1e6,
                                                     "naive": naive_ring_bytes(25_000_000, 4, 8) / 1e6},
    "02 mean of shard means is the batch loss": lambda: _mean_of_means_is_batch_loss(),
    "04 all-reduces per step for 4,1,1,4,0.5 MiB at 5": lambda: len(assign_buckets([x * 2**20 for x in (0.5, 4, 1, 1, 4)],
                                                                                   5 * 2**20)),
    "05 buckets of the wide MLP at bucket_cap_mb=2": lambda: _rebuilt_buckets(2),
    "05 ring MB per rank for 25e6 gradients on 8": lambda: {"fp32": ring_bytes(25_000_000, 4, 8, 0) / 1e6,
                                                            "fp16": ring_bytes(25_000_000, 2, 8, 0) / 1e6},
    "06 BatchNorm statistics of [1, 2, 3] and [5, 7, 9]": lambda: _batchnorm_statistics([1.0, 2.0, 3.0], [5.0, 7.0, 9.0]),
    "06 evaluated and repeated for 10 on 4": lambda: {"evaluated": sum(map(len, sampler_indices(10, 4, shuffle=False))),
                                                   "twice": _repeat(sampler_indices(10, 4, shuffle=False))["samples"]},
    "07 steps when resuming after 3 of 6 epochs": lambda: _resume_steps(100, 2, 10, 3, 6),
    "07 epoch a restart without --checkpoint starts at": lambda: 1,  # nothing was saved: the new group starts over
    "08 GB per rank for 1e9 parameters, ZeRO-2 on 8": lambda: (sum(zero_bytes([10**9], 8, 2).values()) - 4) / 1e9,
    "09 efficiency when t_comm grows": lambda: "lower",
    "09 faster ring on 8 ranks at 10 us and 10 GB/s": lambda: {
        label: "naive" if naive_ring_time(n, 8, 10e-6, 10e9) < ring_time(n, 8, 10e-6, 10e9) else "ring"
        for label, n in (("8 B", 8), ("100 MB", 100e6))},
    "09 DataParallel emulation limit at f = 1/3": lambda: 1.5,
    "10 PowerSGD saving for a 4096 x 4096 matrix at rank 8": lambda: 4096 * 4096 / compression.powersgd_values(
        [torch.Size([4096, 4096])], 8),
    "10 DiLoCo share of DDP's bytes at H = 32": lambda: 1 / 32,  # the parameters once per 32 steps; N does not enter
    # fp32 values laid end to end, cut into 4 equal runs: one run a synchronisation
    "11 Streaming DiLoCo's MB per synchronisation for 1e9 fp32 parameters in 4 fragments": lambda: 4 * 10**9 / 4 / 1e6,
    # saved after step 1500; the failure in step 1740: steps 1501-1740 are taken again by every replica
    "11 steps every replica takes again after a restart from the step-1500 checkpoint": lambda: 1740 - 1500,
}


def _rebuilt_buckets(cap_mb: float) -> dict:
    """DDP's buckets after the rebuild for notebook 05's wide MLP: last layer first, torch's own assignment."""
    from dp_helpers.tool.models import MLP

    sizes = [p.numel() * p.element_size() for p in MLP(256, hidden=512, depth=6).parameters()][::-1]
    assigned = torch_buckets(sizes, int(cap_mb * 2**20))
    return {"all-reduces per step": len(assigned), "tensors in the first bucket": len(assigned[0])}


def _batchnorm_statistics(*shards: list[float]) -> dict:
    """The mean and (biased) variance BatchNorm normalises with: rank 0's shard alone, and all shards together."""
    own = torch.tensor(shards[0], dtype=torch.float64)
    everything = torch.tensor([x for shard in shards for x in shard], dtype=torch.float64)
    return {"rank 0 mean": own.mean().item(), "rank 0 variance": own.var(unbiased=False).item(),
            "global mean": everything.mean().item(), "global variance": everything.var(unbiased=False).item()}


def _resume_steps(samples: int, world_size: int, batch_size: int, stopped: int, epochs: int) -> dict:
    """Where a resumed run starts counting optimizer steps, and how many it takes to finish."""
    per_epoch = shard_plan(samples, world_size, batch_size).optimizer_steps
    return {"resumes at step": stopped * per_epoch, "steps after resuming": (epochs - stopped) * per_epoch}


def _mean_of_means_is_batch_loss() -> bool:
    """Whether averaging 8 per-shard mean losses of 30 rows gives the batch's mean loss."""
    gen = torch.Generator().manual_seed(0)
    p, y = torch.rand(30, 1, generator=gen), torch.rand(30, 1, generator=gen)
    means = torch.stack([bce_loss(a, b) for a, b in zip(p.chunk(8), y.chunk(8), strict=True)])
    return bool(torch.allclose(means.mean(), bce_loss(p, y)))


def _repeat(table: list[list[int]]) -> dict:
    """Which samples the sampler hands out twice in one epoch, and which ranks get them."""
    flat = [(i, r) for r, idx in enumerate(table) for i in idx]
    twice = sorted({i for i, _ in flat if sum(j == i for j, _ in flat) > 1})
    return {"samples": twice, "ranks": sorted({r for i, r in flat if i in twice})}


SOLUTIONS = Path(__file__).resolve().parents[3] / "solutions"  # the repository's solutions/


def solution(key: str):
    """Display one answer to exercise `key` ("04.1": notebook 04, exercise 1): for after you have tried."""
    from dp_helpers.course.show import show

    path = SOLUTIONS / f"{str(key).replace('.', '_')}.py"
    if not path.is_file():
        known = ", ".join(sorted(p.stem.replace("_", ".", 1) for p in SOLUTIONS.glob("*.py")))
        raise UsageError(tr("there is no solution {key!r}; the exercises with one are {known}", key=key, known=known))
    return show(path)


def _unanswered(value) -> bool:
    """An answer the learner has not filled in yet (a `...` left anywhere in it)."""
    if isinstance(value, dict):
        return any(map(_unanswered, value.values()))
    return value is Ellipsis or value is None


class Verdict:
    """A checker's result: true when correct; Jupyter shows nothing more, the line is already printed."""

    def __init__(self, ok: bool):
        self.ok = ok

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        return f"Verdict({'correct' if self.ok else 'not yet'})"

    def _ipython_display_(self) -> None:
        """Nothing to add to the printed line."""


def verdict(ok: bool, message: str) -> Verdict:
    """Print one line that says correct or what differs; return a Verdict that is true when correct."""
    print(tr("correct: {message}", message=message) if ok else tr("not yet: {message}", message=message))
    return Verdict(ok)


def check_answer(key: str, answer) -> Verdict:
    """A numeric, word or table answer against the package's own computation of it."""
    if key not in ANSWERS:
        near = [k for k in sorted(ANSWERS) if str(key)[:2] == k[:2]] or sorted(ANSWERS)
        return verdict(False, tr("there is no question {key!r}; the ones of this notebook are: {known}", key=key,
                                 known="; ".join(map(repr, near))))
    if _unanswered(answer):
        return verdict(False, tr("replace the ... with your answer and run the cell again."))
    problem = difference(answer, ANSWERS[key](), units=bool(UNITS.search(key)))  # no "MiB for MB" hint for a count
    if problem is None:
        return verdict(True, tr("that is what this notebook's rules give."))
    hint = next((words for slip, words in LIKELY_MISTAKES.get(key, ()) if _matches(answer, slip)), None)
    return verdict(False, tr("{problem}; {hint}.", problem=problem,
                             hint=tr(hint) if hint else tr("recheck the rule in this notebook and try again")))


def _matches(answer, slip) -> bool:
    """Whether an answer is this slip: the slip's whole value, or one entry of a table answer (an `_entry`)."""
    return slip(answer) if callable(slip) else difference(answer, slip) is None


def _entry(key: str, value):
    """A slip in one entry of a table answer: the entry `key` holds `value`, whatever the others hold."""
    def found(answer) -> bool:
        """Whether the answer is a table whose entry `key` holds the slip's value."""
        entries = {str(k).strip().lower(): v for k, v in answer.items()} if isinstance(answer, dict) else {}
        return key in entries and difference(entries[key], value) is None
    return found


def _unbiased(answer) -> bool:
    """Notebook 06's BatchNorm statistics with a variance divided by N - 1 (rank 0's shard or all six values)."""
    return _entry("rank 0 variance", 1.0)(answer) or _entry("global variance", 9.5)(answer)


# answers learners give by one known slip, and the sentence that names it (an English template: tr(words) shows it)
LIKELY_MISTAKES = {
    "00 one-device batch for 4 ranks of 8": [
        (4, tr_later("4 is the number of processes: one device must take in one step every sample the 4 processes "
                     "take together")),
        (8, tr_later("8 is one process's batch: one device must take all 4 processes' samples in one step"))],
    "00 rank 1's total after the all-reduce": [
        ([8.0, 16.0], tr_later("that is the mean: all_reduce sums by default (the average is DDP's own doing: it "
                               "divides each gradient by the world size)")),
        ([6.0, 16.0], tr_later("that is what rank 1 held before: all_reduce changes the tensor in place on every "
                               "rank")),
        ([10.0, 16.0], tr_later("that is rank 0's tensor: all_reduce sums every rank's, it does not copy one"))],
    "01 rows for 17 on 5": [
        ([4, 4, 3, 3, 3], tr_later("that is tensor_split's rule (sizes differ by at most one): DataParallel "
                                   "scatters with chunk, ceil(17 / 5) = 4 rows a device until the rows run out")),
        ([3, 3, 3, 3, 5], tr_later("chunk does not put the rest on the last device: it gives ceil(17 / 5) = 4 rows "
                                   "a device until the rows run out"))],
    "01 devices with work for 9 on 8": [
        (8, tr_later("chunk gives each device ceil(9 / 8) = 2 rows, so the rows run out before the last devices")),
        (9, tr_later("there are only 8 devices, and chunk gives each ceil(9 / 8) = 2 rows"))],
    "01 repeated sample of 11 on 4": [
        (_entry("samples", [10]), tr_later("the sampler pads with the first indices of its order, not the last"))],
    "02 bytes replicated for 1e6 on 4": [
        (16_000_000, tr_later("that counts device 0 too, which holds the model already: only the copies sent to the "
                              "other devices are replicated")),
        (3_000_000, tr_later("that counts one byte per parameter: a float32 holds 4"))],
    "03 naive and ring MB for 100 MB on 8": [
        (_entry("ring", 87.5), tr_later("87.5 MB is the reduce-scatter alone: the all-gather sends as much again")),
        (_entry("ring", 200.0), tr_later("each phase takes W - 1 = 7 steps of 100 / 8 MB, not 8 steps")),
        (_entry("naive", 800.0), tr_later("the naive ring forwards the tensor W - 1 = 7 times, not 8: no rank sends to "
                                          "itself")),
        (_entry("naive", 1400.0), tr_later("the naive ring makes one pass, W - 1 hops of the whole tensor; two "
                                           "phases are the ring's"))],
    "04 all-reduces per step for 4,1,1,4,0.5 MiB at 5": [
        (3, tr_later("the backward produces the gradients last first (0.5, 4, 1, 1, 4), and a bucket takes the "
                     "tensor that crosses the cap before it closes"))],
    "05 buckets of the wide MLP at bucket_cap_mb=2": [
        (_entry("tensors in the first bucket", 5), tr_later("the gradients become ready from the head backwards: "
                                                            "count from the last parameter")),
        (_entry("tensors in the first bucket", 4), tr_later("DDP's small first bucket of 1 MiB is used only when "
                                                            "bucket_cap_mb is not given"))],
    "05 ring MB per rank for 25e6 gradients on 8": [
        (_entry("fp32", 100.0), tr_later("100 MB is the gradient itself: a ring all-reduce sends 2(W - 1)/W of it per "
                                         "rank")),
        (_entry("fp16", 50.0), tr_later("50 MB is the fp16 gradient itself: a ring all-reduce sends 2(W - 1)/W of it "
                                        "per rank"))],
    "06 BatchNorm statistics of [1, 2, 3] and [5, 7, 9]": [
        (_unbiased, tr_later("that variance divides by N - 1 (torch.var's default): BatchNorm normalises with the "
                             "biased one, divided by N"))],
    "06 evaluated and repeated for 10 on 4": [
        (_entry("evaluated", 10), tr_later("the sampler pads 10 samples to 12, so that each of the 4 ranks gets 3")),
        (_entry("twice", [8, 9]), tr_later("the sampler pads with the first indices of its order, not the last"))],
    "07 steps when resuming after 3 of 6 epochs": [
        (_entry("resumes at step", 16), tr_later("steps count from 0 here: after 15 steps the next one is step 15")),
        (_entry("resumes at step", 30), tr_later("a step takes 2 ranks x 10 = 20 samples: 5 steps an epoch, not 10"))],
    "07 epoch a restart without --checkpoint starts at": [
        (5, tr_later("nothing was saved, so the new group cannot know where the old one was: it starts over")),
        (6, tr_later("nothing was saved, so the new group cannot know where the old one was: it starts over")),
        (0, tr_later("epochs count from 1 here: the first epoch is epoch 1"))],
    "08 GB per rank for 1e9 parameters, ZeRO-2 on 8": [
        (2, tr_later("2 GB is ZeRO-3's figure, which shards the parameters too; ZeRO-2 keeps every parameter")),
        (9, tr_later("9 GB is ZeRO-1's figure, which keeps every gradient; ZeRO-2 shards the gradients too")),
        (16, tr_later("16 GB is DDP's figure, which shards nothing")),
        (3.75, tr_later("3.75 GB is the paper's mixed precision (2 + 2 + 12 bytes); this exercise asks for fp32 Adam, "
                        "4 + 4 + 8"))],
    "09 DataParallel emulation limit at f = 1/3": [
        (3, tr_later("1 / f treats the parallel third as the whole step: the serial 2/3 stays, so the limit is "
                     "1 / (1 - f)"))],
    "10 PowerSGD saving for a 4096 x 4096 matrix at rank 8": [
        (512, tr_later("PowerSGD sends two factors, P (4096 x 8) and Q (4096 x 8), not one")),
        (128, tr_later("that counts each factor twice: P is 4096 x 8 and Q is 4096 x 8, once each"))],
    "10 DiLoCo share of DDP's bytes at H = 32": [
        (32, tr_later("32 is DDP's bytes over DiLoCo's: the share asked for is its inverse")),
        (1 / 2048, tr_later("the number of ranks does not enter: each sends the parameters once per 32 steps, as "
                            "DDP sends the gradients once per step"))],
    "11 Streaming DiLoCo's MB per synchronisation for 1e9 fp32 parameters in 4 fragments": [
        (4000, tr_later("4000 MB is every fragment: one synchronisation sends one fragment, a quarter")),
        (250, tr_later("250 million is the fragment's values: each is 4 bytes of fp32"))],
    "11 steps every replica takes again after a restart from the step-1500 checkpoint": [
        (239, tr_later("the step that failed was not finished: it is taken again too"))],
}


# your number / the right one, when the right number came out in the wrong unit (English templates, as above)
UNIT_SLIPS = {1e6 / 2**20: tr_later("MiB where MB (10^6 bytes) are asked"),
              2**20 / 1e6: tr_later("MB where MiB (2^20 bytes) are asked"),
              1e9 / 2**30: tr_later("GiB where GB (10^9 bytes) are asked"),
              2**30 / 1e9: tr_later("GB where GiB (2^30 bytes) are asked"),
              1e3: tr_later("a unit 1000 times smaller than the one asked (kB for MB?)"),
              1e-3: tr_later("a unit 1000 times larger than the one asked (GB for MB?)"),
              1e6: tr_later("bytes where MB are asked"), 1e9: tr_later("bytes where GB are asked"),
              8: tr_later("bits where bytes are asked"), 1 / 8: tr_later("bytes where bits are asked")}
UNITS = re.compile(r"bytes|bits|\b[kMG]i?B\b")  # an answer key that asks for a size
YES_NO = {"true": True, "yes": True, "false": False, "no": False}


def _plain(value):
    """A tensor, NumPy value or tuple as the plain Python value it holds."""
    if hasattr(value, "tolist") and not isinstance(value, (list, dict, str)):
        return value.tolist()
    return list(value) if isinstance(value, (tuple, range)) else value


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def difference(got, want, what: str | None = None, units: bool = True) -> str | None:
    """Why `got` is not `want` (numbers to 1e-6, words in any case, any container), or None; `what` names it."""
    what = tr("your answer") if what is None else what
    got = _plain(got)
    kind = next((f for t, f in ((bool, _yes_no_difference), (str, _word_difference), (dict, _dict_difference),
                                (list, _list_difference)) if isinstance(want, t)), None)
    if kind in (_dict_difference, _list_difference):
        return kind(got, want, what, units)
    if kind:
        return kind(got, want, what)
    if _number(want):
        return _number_difference(got, want, what, units)
    return None if got == want else tr("{what} is {got!r}", what=what, got=got)


def _yes_no_difference(got, want: bool, what: str) -> str | None:
    yes_no = YES_NO.get(got.strip().lower()) if isinstance(got, str) else got
    if not isinstance(yes_no, bool):
        return tr("{what} is {got!r}; True or False is asked", what=what, got=got)
    return None if yes_no == want else tr("{what} is {got!r}", what=what, got=got)


def _word_difference(got, want: str, what: str) -> str | None:
    if not isinstance(got, str):
        return tr("{what} is {got!r}; a word is asked", what=what, got=got)
    return None if got.strip().lower() == want.lower() else tr("{what} is {got!r}", what=what, got=got)


def _number_difference(got, want: float, what: str, units: bool = True) -> str | None:
    if not _number(got):
        return tr("{what} is {got!r}; one number is asked", what=what, got=got)
    if math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9) or _rounded_alike(got, want):
        return None
    if math.isclose(got, want, rel_tol=1e-2) and _digits(got) < 3:
        return tr("{what} is {got!r}: close, but give at least 3 significant digits", what=what, got=got)
    slip = next((words for factor, words in UNIT_SLIPS.items() if math.isclose(got, want * factor, rel_tol=1e-3)),
                None) if units else None
    if slip:
        return tr("{what} is {got!r}: that looks like {slip}", what=what, got=got, slip=tr(slip))
    return tr("{what} is {got!r}", what=what, got=got)


def _digits(x: float) -> int:
    """The significant digits x is written with (0.667: 3, 7.917: 4, 2.0: 1); 0 in exponent notation."""
    text = repr(float(x)).lstrip("-")
    if "e" in text:
        return 0
    return len(text.replace(".", "").lstrip("0").rstrip("0") or "0")


def _rounded_alike(got: float, want: float) -> bool:
    """Whether got is want rounded to the decimals got shows, with at least 3 significant digits (2/3 as 0.667)."""
    if _digits(got) < 3 or isinstance(got, int):
        return False
    decimals = len(repr(float(got)).split(".")[1])
    return math.isclose(round(want, decimals), got, rel_tol=0, abs_tol=10 ** -(decimals + 3))


def _list_difference(got, want: list, what: str, units: bool = True) -> str | None:
    if not isinstance(got, list):
        return tr("{what} is {got!r}; a list of {n} values is asked", what=what, got=got, n=len(want))
    if len(got) != len(want):
        return tr("{what} has {n} values; {asked} are asked", what=what, n=len(got), asked=len(want))
    return next(filter(None, (difference(g, w, tr("the value at index {i} of {what}", i=i, what=what), units) for i, (g, w) in
                              enumerate(zip(got, want, strict=True)))), None)


def _dict_difference(got, want: dict, what: str, units: bool = True) -> str | None:
    """A table answer: the keys named when they differ, then the first value that differs."""
    if not isinstance(got, dict):
        return tr("{what} is {got!r}; a dict with the keys {keys} is asked", what=what, got=got, keys=sorted(want))
    keys = {str(k).strip().lower(): k for k in got}
    missing = [k for k in want if k.lower() not in keys]
    if missing:
        return tr("{what} has the keys {given}; the keys {keys} are asked", what=what, given=sorted(map(str, got)),
                  keys=sorted(want))
    return next(filter(None, (difference(got[keys[k.lower()]], v, f"{what}[{k!r}]", units)
                              for k, v in want.items())), None)


def compare_function(fn, reference, cases, describe, same=None, mistakes=()) -> Verdict:
    """fn against reference on every case (`same` compares, default ==); names a slip of `mistakes` (function, words)."""
    for args in cases:
        try:
            got = fn(*args)
        except NotImplementedError:
            return verdict(False, tr("your function still raises NotImplementedError: write its body."))
        except Exception as exc:  # the learner's bug, in one line rather than a traceback
            return verdict(False, tr("for {case} your function raised {error}: {exc}.", case=describe(args),
                                     error=type(exc).__name__, exc=exc))
        if _unanswered(got):
            return verdict(False, tr("your function returned {got!r} for {case}: write its body.", got=got,
                                     case=describe(args)))
        want = reference(*args)
        if not (same or _same)(got, want):
            slip = next((words for mistake, words in mistakes if (same or _same)(got, mistake(*args))), None)
            if slip:
                return verdict(False, tr("for {case}: {slip}.", case=describe(args), slip=tr(slip)))
            return verdict(False, tr("for {case} expected {want!r}, got {got!r}.", case=describe(args),
                                     want=_shown(want), got=_shown(got)))
    return verdict(True, tr("{n} cases agree with the reference.", n=len(cases)))


def _shown(value):
    """A value for a one-line message: tensors (also in a list) as nested lists."""
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return [_shown(v) for v in value]
    return value


def _same(got, want) -> bool:
    """Equal values, comparing tensors element by element (lists of tensors too)."""
    if isinstance(want, torch.Tensor):
        return isinstance(got, torch.Tensor) and got.shape == want.shape and torch.equal(got, want)
    if isinstance(want, (list, tuple)) and want and isinstance(want[0], torch.Tensor):
        return isinstance(got, (list, tuple)) and len(got) == len(want) and all(map(_same, got, want))
    return difference(got, _plain(want)) is None  # a list for a tuple, a tensor or NumPy value for a number


def check_shard(fn) -> Verdict:
    """Notebook 01: fn(samples, world_size, rank) -> the indices DistributedSampler(shuffle=False) gives rank."""
    cases = [(n, w, r) for n in (1, 5, 10, 11, 12, 31) for w in (1, 2, 3, 4, 8) for r in range(w)]
    return compare_function(fn, lambda n, w, r: sampler_indices(n, w, shuffle=False)[r], cases,
                            lambda a: f"samples={a[0]}, world_size={a[1]}, rank={a[2]}")


def check_scatter(fn) -> Verdict:
    """Notebook 02: fn(batch, n_devices) -> the list of pieces DataParallel's scatter cuts along dim 0."""
    used = _calls_any(fn, ("chunk", "tensor_split", "split"))
    if used:
        return verdict(False, tr("your function calls {name}: the exercise asks for slicing only (batch[i:j]).",
                                 name=used))
    cases = [(torch.arange(rows * 2).reshape(rows, 2), n) for rows in (1, 2, 7, 10, 30) for n in (1, 2, 3, 4, 8)]
    return compare_function(fn, lambda x, n: list(x.chunk(n)), cases,
                            lambda a: tr("a batch of {rows} rows on {n} devices", rows=len(a[0]), n=a[1]))


def _calls_any(fn, names: tuple[str, ...]) -> str | None:
    """The first of these function names that fn's source calls (`x.chunk(`, `torch.split(`), or None."""
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):  # no source to read (a lambda typed in a console, a builtin): nothing to forbid
        return None
    return next((name for name in names if re.search(rf"\b{name}\s*\(", source)), None)


def check_ring_sums(fn) -> Verdict:
    """Notebook 03: fn(rank, chunk, step, world_size) -> how many ranks' values that chunk sums after the step."""
    table = {}  # the chunks' sums after each step, as ring_schedule's sends leave them
    for w in range(2, 9):
        states = ring_buffers(w)
        table.update({(r, c, s, w): len(states[s + 1][r][c]) for s in range(w - 1) for r in range(w) for c in range(w)})
    slips = [(lambda r, c, s, w: min(s + 2, w) if c == (r - s - 1) % w else 1,
              tr_later("a chunk keeps its sum after it is forwarded: count the chunks this rank received in earlier "
                       "steps too")),
             (lambda r, c, s, w: max(table[r, c, s, w] - 1, 1),
              tr_later("one too few: a chunk that arrives holds the sender's sum, and the receiver adds its own "
                       "values to it"))]
    return compare_function(fn, lambda r, c, s, w: table[r, c, s, w], sorted(table, key=lambda k: (k[3], k[2], k[0], k[1])),
                            lambda a: f"rank={a[0]}, chunk={a[1]}, step={a[2]}, world_size={a[3]}", mistakes=slips)


def torch_buckets(sizes: list[int], cap: int) -> list[list[int]]:
    """DDP's own bucket assignment of float32 tensors of these byte sizes, in this order, under one cap."""
    tensors = [torch.empty(size // 4) for size in sizes]
    return [list(bucket) for bucket in torch.distributed._compute_bucket_assignment_by_size(tensors, [cap])[0]]


def check_buckets(fn) -> Verdict:
    """Notebook 04: fn(sizes, cap) -> the greedy bucket assignment (lists of indices) that DDP computes."""
    gen = torch.Generator().manual_seed(4)
    cases = [([4 * int(n) for n in torch.randint(1, 3000, (int(k),), generator=gen)], cap)
             for k in (1, 2, 5, 9, 20) for cap in (4, 4000, 10_000, 2**20)]
    return compare_function(fn, torch_buckets, cases + [([400, 400, 400], 800), ([400, 400, 400], 801)],
                            lambda a: f"sizes={a[0][:6]}{'...' if len(a[0]) > 6 else ''}, cap={a[1]}")


def flat_chunk(numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """The reference of notebook 08's exercise: the [start, stop) of a numel-long tensor that rank owns (padding excluded)."""
    size = Flat([torch.zeros(numel)], world_size).size
    return min(numel, rank * size), min(numel, (rank + 1) * size)


def check_chunk(fn) -> Verdict:
    """Notebook 08: fn(numel, world_size, rank) -> (start, stop) of the values rank owns in the padded flat buffer."""
    cases = [(n, w, r) for n in (1, 5, 8, 10, 33, 100) for w in (1, 2, 3, 4, 8) for r in range(w)]
    return compare_function(fn, flat_chunk, cases, lambda a: f"numel={a[0]}, world_size={a[1]}, rank={a[2]}")


def low_rank_step(m: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Notebook 10: PowerSGD's step for one matrix on one rank: P = M Q orthonormalised, then P (Mᵀ P)ᵀ."""
    p = m @ q
    compression.orthogonalize(p)
    return p @ (m.T @ p).T


def check_low_rank(fn) -> Verdict:
    """Notebook 10: fn(m, q) -> PowerSGD's rank-r picture of m from q, one rank, no communication."""
    gen = torch.Generator().manual_seed(0)
    cases = [(torch.randn(n, k, generator=gen), torch.randn(k, r, generator=gen)) for n, k, r in ((6, 4, 1), (8, 5, 2),
                                                                                                   (5, 9, 3), (7, 7, 7))]
    close = lambda got, want: isinstance(got, torch.Tensor) and got.shape == want.shape and bool(  # noqa: E731
        torch.allclose(got, want, rtol=1e-4, atol=1e-5))  # any orthonormalisation (QR too) gives the same picture
    return compare_function(fn, low_rank_step, cases, lambda a: tr("a {n} x {k} matrix M and a {k} x {r} Q",
                                                                   n=a[0].shape[0], k=a[0].shape[1], r=a[1].shape[1]),
                            same=close, mistakes=[(lambda m, q: (m @ q) @ (m.T @ (m @ q)).T, tr_later(
                                "your function gives P (M^T P)^T with P = M Q as it is: orthonormalise P's columns "
                                "(compression.orthogonalize, or torch.linalg.qr) before Q = M^T P"))])


class RecordingNoSync:
    """A stand-in for DDP's model.no_sync that records which forwards ran inside it."""

    def __init__(self, model: nn.Module):
        self.inside, self.forwards = False, []
        model.register_forward_pre_hook(lambda module, args: self.forwards.append(self.inside))

    @contextlib.contextmanager
    def __call__(self):
        self.inside = True
        try:
            yield
        finally:
            self.inside = False


def _accumulation_problem(fn, sizes: tuple[int, ...]) -> str | None:
    """What is wrong with fn as an accumulation step over micro-batches of these sizes, or None."""
    gen = torch.Generator().manual_seed(len(sizes))
    x, y = torch.randn(sum(sizes), 6, generator=gen), torch.rand(sum(sizes), generator=gen)
    mine, ref = (nn.Sequential(nn.Linear(6, 1), nn.Sigmoid()) for _ in range(2))
    ref.load_state_dict(mine.state_dict())
    for p in mine.parameters():
        p.grad = torch.ones_like(p)  # a previous step's gradients, which this step must clear first
    opt, ref_opt = torch.optim.SGD(mine.parameters(), lr=0.5), torch.optim.SGD(ref.parameters(), lr=0.5)
    no_sync = RecordingNoSync(mine)
    fn(mine, list(zip(x.split(list(sizes)), y.split(list(sizes)), strict=True)), opt, no_sync)
    train_step(ref, x, y, ref_opt)
    k = len(sizes)
    if no_sync.forwards != [True] * (k - 1) + [False]:
        return tr("with {k} micro-batches, forwards inside no_sync were {forwards}; expected all but the last.", k=k,
                  forwards=no_sync.forwards)
    if all(torch.allclose(a, b, atol=1e-6) for a, b in zip(mine.parameters(), ref.parameters(), strict=True)):
        return None
    if all(torch.allclose(a, b - 0.5, atol=1e-5) for a, b in zip(mine.parameters(), ref.parameters(), strict=True)):
        return tr("the gradients of the previous step were still there: call optimizer.zero_grad() first.")
    if len(set(sizes)) > 1:
        return tr("with micro-batches of {sizes} samples the weights differ from one step on the whole batch: "
                  "weight each loss by its share of the samples (len(inputs) / total), not by 1/k.", sizes=list(sizes))
    if k == 1:
        return tr("with one micro-batch (the whole batch) the weights differ from one step of train_step: the mean "
                  "BCE loss on model(inputs) and targets.unsqueeze(1), one backward, one optimizer.step().")
    return tr("with {k} micro-batches the weights differ from one step on the whole batch: divide each loss by k, and "
              "step the optimizer once, after the last backward.", k=k)


def _accumulation_error(exc: Exception) -> str:
    """An exception raised by the learner's accumulation step, in one sentence with the likely fix."""
    error = type(exc).__name__
    if "no_sync" in str(exc):
        return tr("your function raised {error}: {exc}: use the no_sync argument, `with no_sync():` (the checker's "
                  "model is a plain module; under DDP you would pass model.no_sync).", error=error, exc=exc)
    if "context manager" in str(exc):
        return tr("your function raised {error}: {exc}: call it, `with no_sync():`, as you would write "
                  "`with model.no_sync():`.", error=error, exc=exc)
    return tr("your function raised {error}: {exc}.", error=error, exc=exc)


def check_accumulate(fn) -> Verdict:
    """Notebook 05: fn(model, micro_batches, optimizer, no_sync) takes one step equal to one step on the whole batch."""
    for sizes in ((4,), (4, 4), (4, 4, 4), (4, 4, 4, 4, 4), (4, 4, 1), (5, 3)):
        try:
            problem = _accumulation_problem(fn, sizes)
        except NotImplementedError:
            return verdict(False, tr("your function still raises NotImplementedError: write its body."))
        except Exception as exc:  # the learner's bug, in one line rather than a traceback
            return verdict(False, _accumulation_error(exc))
        if problem:
            return verdict(False, problem)
    return verdict(True, tr("one optimizer step equal to the large batch, with equal and unequal micro-batches, and "
                            "only the last backward synchronises."))


def naive_ring_time(bytes_: float, world_size: int, latency: float, bandwidth: float) -> float:
    """The reference answer of notebook 09's exercise: W-1 hops, each a latency plus the whole tensor."""
    return (world_size - 1) * (latency + bytes_ / bandwidth)


def check_naive_ring_time(fn) -> Verdict:
    """Notebook 09: fn(bytes, world_size, latency, bandwidth) -> the naive ring's alpha-beta time in seconds."""
    cases = list(itertools.product((0, 4, 4e6, 1e9), (2, 3, 8), (0.0, 2e-5), (1e9, 25e9)))
    return compare_function(fn, naive_ring_time, cases,
                            lambda a: f"bytes={a[0]:g}, world_size={a[1]}, latency={a[2]}, bandwidth={a[3]:g}",
                            same=lambda got, want: _number(_plain(got)) and abs(_plain(got) - want) <= 1e-9 * max(1.0, want))


class ThreadRanks:
    """world_size ranks as threads of this process, with an all_reduce that sums in place as dist.all_reduce does."""

    def __init__(self, world_size: int, timeout: float = 5.0):
        self.world_size, self.slots = world_size, [None] * world_size
        self.barrier = threading.Barrier(world_size, timeout=timeout)

    def all_reduce_for(self, rank: int):
        """Rank `rank`'s all_reduce(tensor): every rank must call it, the same number of times."""
        def all_reduce(tensor, *args, **kwargs):
            """Sum tensor over the ranks, in place."""
            self.slots[rank] = tensor.detach().clone()
            self.barrier.wait()  # every rank's contribution is in
            total = torch.stack([slot.to(tensor.dtype) for slot in self.slots]).sum(0)
            self.barrier.wait()  # every rank has read them all before the next call overwrites a slot
            tensor.copy_(total)
        return all_reduce

    def run(self, fn) -> list:
        """fn(rank, all_reduce) on every rank at once; each rank's result, or the exception it raised."""
        results = [None] * self.world_size

        def one(rank: int) -> None:
            """One rank's call, its result or exception kept."""
            try:
                results[rank] = fn(rank, self.all_reduce_for(rank))
            except BaseException as exc:  # noqa: BLE001 -- reported to the learner in one line
                results[rank] = exc
                self.barrier.abort()  # the other ranks stop waiting for this one
        threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in range(self.world_size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return results


def _scored_run(fn, samples: int, world_size: int) -> tuple[list, list[tuple[int, int]], torch.Tensor]:
    """Run fn as world_size thread ranks over random losses: each rank's result, the (rank, index) scored, the losses."""
    losses = torch.rand(samples, generator=torch.Generator().manual_seed(samples * 10 + world_size), dtype=torch.float64)
    scored, lock = [], threading.Lock()

    def scorer(rank: int):
        """Rank's score function: sample i's loss, noting who scored it."""
        def score(i: int) -> float:
            """Sample i's loss, noting that it was scored."""
            with lock:
                scored.append((rank, int(i)))
            return losses[int(i)].item()
        return score
    got = ThreadRanks(world_size).run(lambda rank, all_reduce: fn(samples, scorer(rank), rank, world_size, all_reduce))
    return got, scored, losses


def _exact_eval_problem(fn, samples: int, world_size: int) -> str | None:
    """What is wrong with fn as an exact distributed mean over `samples` losses on world_size ranks, or None."""
    got, scored, losses = _scored_run(fn, samples, world_size)
    case = tr("with {samples} samples on {world_size} ranks", samples=samples, world_size=world_size)
    errors = [g for g in got if isinstance(g, BaseException)]
    real = next((g for g in errors if not isinstance(g, threading.BrokenBarrierError)), None)
    if isinstance(real, NotImplementedError):
        raise real
    if real is not None:
        return tr("{case} your function raised {error}: {exc}.", case=case, error=type(real).__name__, exc=real)
    if errors:
        return tr("{case} the ranks did not all call all_reduce the same number of times (one waited for the "
                  "others): every rank calls every collective, even a rank with no samples.", case=case)
    counts = collections.Counter(i for _, i in scored)
    return _coverage_problem(case, counts, samples, world_size) or _mean_problem(case, got, losses, scored)


def _coverage_problem(case: str, counts: collections.Counter, samples: int, world_size: int) -> str | None:
    """Samples scored twice or never, in one sentence, or None."""
    if world_size > 1 and set(counts) == set(range(samples)) and set(counts.values()) == {world_size}:
        return tr("{case} every rank scored every sample ({world_size} times each): give rank r only the samples "
                  "r, r + W, r + 2W, ...", case=case, world_size=world_size)
    twice = sorted(i for i, c in counts.items() if c > 1)
    if twice:
        return tr("{case} samples {twice} were scored more than once (padding, as DistributedSampler does?): give "
                  "rank r the samples r, r + W, r + 2W, ... and no more.", case=case, twice=twice[:6])
    missing = sorted(set(range(samples)) - set(counts))
    return tr("{case} samples {missing} were never scored: together the ranks must score every sample once.",
              case=case, missing=missing[:6]) if missing else None


# What a rank's wrong result matches, from the shards' sums and counts, and the mistake each one names.
MEAN_MISTAKES = {
    "local": tr_later("it is this rank's own mean: all-reduce the sum and the count, then divide"),
    "local_count": tr_later("it is the all-reduced sum divided by this rank's own count: all-reduce the count too"),
    "means": tr_later("it is the mean of the per-rank means, which weighs a short shard like a full one: "
                      "all-reduce the sums and the counts, then divide once"),
    "equal_counts": tr_later("it is the sum divided by world_size times this rank's count, as if every shard were as "
                             "long: all-reduce the counts instead"),
    "sum": tr_later("it is the all-reduced sum, never divided: divide it by the all-reduced count"),
}


def _mean_candidates(rank: int, losses: torch.Tensor, scored: list[tuple[int, int]], world_size: int) -> dict:
    """The values rank would return under each mistake in MEAN_MISTAKES."""
    sums, counts = [0.0] * world_size, [0] * world_size
    for r, i in scored:
        sums[r] += losses[i].item()
        counts[r] += 1
    total = sum(sums)
    means = [s / c if c else 0.0 for s, c in zip(sums, counts, strict=True)]
    return {"local": means[rank], "local_count": total / counts[rank] if counts[rank] else math.inf,
            "means": sum(means) / world_size, "equal_counts": total / (world_size * counts[rank]) if counts[rank]
            else math.inf, "sum": total}


def _mean_problem(case: str, got: list, losses: torch.Tensor, scored: list[tuple[int, int]]) -> str | None:
    """The first rank whose result is not the mean over every sample, and the mistake it matches, or None."""
    want = losses.mean().item()
    wrong = [(r, g) for r, g in enumerate(got) if not (_number(_plain(g)) and abs(_plain(g) - want) <= 1e-6)]
    if not wrong:
        return None
    rank, value = wrong[0]
    value = _plain(value)
    candidates = _mean_candidates(rank, losses, scored, len(got)) if _number(value) else {}
    mistake = next((k for k, v in candidates.items() if abs(v - want) > 1e-9 and abs(value - v) <= 1e-6), None)
    why = tr(MEAN_MISTAKES[mistake]) if mistake else tr("all-reduce the sums and the counts, then divide once")
    return tr("{case} rank {rank} returned {value!r}, the mean over all samples is {want:.6f}: {why}.",
              case=case, rank=rank, value=_shown(value), want=want, why=why)


def check_exact_eval(fn) -> Verdict:
    """Notebook 06: fn(samples, score, rank, world_size, all_reduce) -> the mean loss over every sample, on every rank."""
    for samples, world_size in ((12, 4), (10, 4), (7, 3), (3, 4), (1, 2)):
        try:
            problem = _exact_eval_problem(fn, samples, world_size)
        except NotImplementedError:
            return verdict(False, tr("your function still raises NotImplementedError: write its body."))
        if problem:
            return verdict(False, problem)
    return verdict(True, tr("every sample scored once, on 1 to 4 ranks with even and uneven shards, and every rank "
                            "returns the exact mean."))


HALF_WRITTEN = b"half a checkpoint"


def _crashing_save(targets: list):
    """A torch.save that writes part of the file, then fails as a full disk or a killed process would."""
    def save(obj, f, *args, **kwargs):
        """Write half a file to f, then fail."""
        path_given = isinstance(f, (str, os.PathLike))
        target = Path(f) if path_given else _path_of(f)
        if target is not None:
            targets.append(target)
        if path_given:
            Path(f).write_bytes(HALF_WRITTEN)
        else:
            f.write(HALF_WRITTEN)
        raise OSError(28, "No space left on device")
    return save


def _path_of(f) -> Path | None:
    """The file a file object writes to: its name, or what its descriptor points at (os.fdopen names it by number)."""
    name = getattr(f, "name", None)
    if isinstance(name, int):
        try:
            return Path(os.readlink(f"/proc/self/fd/{name}"))  # Linux
        except OSError:
            return None  # elsewhere: the folder goes unchecked
    return Path(os.fsdecode(name)) if isinstance(name, (str, bytes, os.PathLike)) else None


def _atomic_save_problem(fn, folder: Path) -> str | None:
    """What is wrong with fn(state, path) as a save that never leaves a half-written checkpoint, or None."""
    from unittest import mock

    path, first, second = folder / "snapshot.pt", {"epoch": 1, "w": torch.ones(3)}, {"epoch": 2, "w": torch.zeros(3)}
    fn(first, str(path))
    if not path.is_file():
        return tr("after fn(state, {name!r}) there is no file {name!r}: save the state at that path.", name=path.name)
    loaded = torch.load(path, weights_only=True)
    if loaded.keys() != first.keys() or loaded["epoch"] != 1 or not torch.equal(loaded["w"], first["w"]):
        return tr("the saved file does not load back as the state you were given: save the whole dict.")
    targets, raised = [], None
    with mock.patch.object(torch, "save", _crashing_save(targets)):
        try:
            fn(second, str(path))
        except OSError as exc:
            raised = exc
    if path.read_bytes() == HALF_WRITTEN or torch.load(path, weights_only=True)["epoch"] != 1:
        return tr("a save that failed halfway destroyed the previous snapshot: write to a temporary file in the same "
                  "folder, then os.replace() it onto the path (a rename is all or nothing).")
    if targets and targets[0].resolve().parent != folder.resolve():
        return tr("the temporary file is in another folder: os.replace() is atomic only within one file system, so "
                  "put it beside the checkpoint.")
    if raised is None:
        return tr("when torch.save failed your function returned as if it had saved: let the OSError propagate.")
    left = sorted(p.name for p in folder.iterdir() if p != path)
    if left:
        return tr("a failed save left {left} behind: remove the temporary file when the write fails, then re-raise.",
                  left=left)
    return None


def check_atomic_save(fn) -> Verdict:
    """Notebook 07: fn(state, path) saves so that a crash while writing leaves the previous checkpoint whole."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        try:
            problem = _atomic_save_problem(fn, Path(folder))
        except NotImplementedError:
            return verdict(False, tr("your function still raises NotImplementedError: write its body."))
        except Exception as exc:  # the learner's bug, in one line rather than a traceback
            return verdict(False, tr("your function raised {error}: {exc}.", error=type(exc).__name__, exc=exc))
    if problem:
        return verdict(False, problem)
    return verdict(True, tr("the snapshot loads back, and a save that failed halfway left the previous one whole and "
                            "nothing else behind."))
