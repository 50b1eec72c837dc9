"""Notebook 07's capstone: the right answer passes on real ranks, and each typical mistake comes back as its sentence."""

import ast

import pytest

from dp_helpers.course.checkers import capstone
from dp_helpers.course.checkers.exercises import SOLUTIONS
from dp_helpers.course.checkers.script_check import CHINESE_TEMPLATES
from tests.conftest import REPO

EXAMPLE = (REPO / "examples" / "train_ddp_real.py").read_text()
FOUR = ("train_step", "evaluate", "save_checkpoint", "load_checkpoint")
SYNC = "        sync = contextlib.nullcontext() if i == len(group) - 1 else model.no_sync()\n"
STEP = """        with sync:
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                logits = model(x)
            loss = nn.functional.binary_cross_entropy_with_logits(logits.float(), y, reduction="sum")
            scaler.scale(loss / samples).backward()  # this rank's mean over the group; DDP averages over ranks
"""
SAVE = """    if rank == 0:
        state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                 "scaler": scaler.state_dict(), "epoch": next_epoch, "rng": rng}
"""
WRITE = """        tmp = f"{path}.tmp{os.getpid()}"  # this process's own: two runs on one path never share it
        try:
            torch.save(state, tmp)
            with open(tmp, "rb") as written:
                os.fsync(written.fileno())  # on the disk before the rename, power cut or not
            os.replace(tmp, path)  # one step: whoever reads path finds the old snapshot or the new
"""
GATHER = "    dist.gather_object(torch.get_rng_state(), rng, dst=0)  # every rank calls it: each rank's random state\n"
CLIP = "    nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)  # after DDP's all-reduce: the global norm\n"
UNSCALE = "    scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones\n"


def mistake(*edits: tuple[str, str]) -> str:
    """The example with one typical mistake made in it (each edit must apply: the example may not drift away)."""
    text = EXAMPLE
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


MISTAKES = {
    "no no_sync": (mistake((SYNC, "        sync = contextlib.nullcontext()\n")),
                   "all-reduced the gradients 20 times for 10 optimizer steps", "run every micro-batch but"),
    "no_sync around the backward only": (
        mistake((STEP, STEP.replace("        with sync:\n", "").replace("            ", "        ").replace(
            "        scaler.scale", "        with sync:\n            scaler.scale"))),
        "all-reduced the gradients 20 times for 10 optimizer steps", "must wrap the forward as well"),
    "every rank writes the checkpoint": (
        mistake((SAVE, SAVE.replace("if rank == 0:", "if True:"))),  # each rank its own temporary file
        "rank 1 wrote the checkpoint too", "only rank 0"),
    "written straight into place": (
        mistake((WRITE, "        try:\n            torch.save(state, path)\n")), "rank 0 wrote straight into", "os.replace"),
    "a resume that starts over": (mistake(('    return epoch  #', "    return 0  #")),
                                  "the resumed run trained epochs [1, 2, 3]", "load_checkpoint must return"),
    "a resume without the optimizer": (mistake(('        optimizer.load_state_dict(state["optimizer"])\n', "")),
                                       "never loaded an optimizer state", "momentum"),
    "evaluation on padded shards": (
        mistake(("    mine = Subset(held_out, range(rank, len(held_out), world_size))",
                 "    mine = Subset(held_out, list(DistributedSampler(held_out, shuffle=False)))")),
        "on 3 ranks, the held-out scores are", "DistributedSampler pads"),
    "the random states gathered on rank 0 only": (
        mistake((GATHER, ""), ("    if rank == 0:\n        state", "    if rank == 0:\n" + GATHER.replace("    ", "        ", 1)
                                                           + "        state")),
        "rank 0 called gather_object", "the same collectives in the same order"),
}


def defined(text: str, names=FOUR) -> dict[str, str]:
    """The AST of each named top-level function (docstrings and comments aside)."""
    found = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            if isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
                node.body = node.body[1:]
            found[node.name] = ast.dump(node)
    return found


def test_the_skeleton_is_the_example_without_the_four_bodies():
    template = capstone.TEMPLATE.read_text()
    others = [n.name for n in ast.parse(EXAMPLE).body if isinstance(n, ast.FunctionDef) and n.name not in FOUR]
    assert defined(template, others) == defined(EXAMPLE, others) and len(others) == 10
    assert all("raise NotImplementedError" in ast.get_source_segment(template, n) for n in ast.parse(template).body
               if isinstance(n, ast.FunctionDef) and n.name in FOUR)


def test_the_solution_is_the_examples_four_functions():
    assert defined((SOLUTIONS / "07_4.py").read_text()) == defined(EXAMPLE)


def test_clipping_before_unscaling_is_read_from_the_source():
    assert capstone.source_problem(EXAMPLE) is None
    swapped = mistake((UNSCALE + CLIP, CLIP + UNSCALE))
    assert "clip_grad_norm_ comes before scaler.unscale_" in capstone.source_problem(swapped)
    assert "clip_grad_norm_ comes before" in capstone.source_problem(mistake((UNSCALE, "")))


def test_an_untouched_skeleton_is_not_launched(tmp_path, capsys):
    path = tmp_path / "my_real_job.py"
    capstone.start_real_job_exercise(str(path))
    assert path.read_text() == capstone.TEMPLATE.read_text() and "ready to edit" in capsys.readouterr().out
    assert not capstone.check_real_job(str(path)) and "still the real-job skeleton" in capsys.readouterr().out
    (tmp_path / "zh.py").write_text((CHINESE_TEMPLATES / "my_real_job.py").read_text())
    assert not capstone.check_real_job(str(tmp_path / "zh.py"))



def test_a_half_written_skeleton_names_the_functions_left_and_launches_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(capstone, "launched_problem", lambda *a: pytest.fail("launched an unwritten skeleton"))
    template, example = capstone.TEMPLATE.read_text(), ast.parse(EXAMPLE)
    stub = next(n for n in ast.parse(template).body if getattr(n, "name", "") == "evaluate")
    written = next(n for n in example.body if getattr(n, "name", "") == "evaluate")
    text = template.replace(ast.get_source_segment(template, stub), ast.get_source_segment(EXAMPLE, written))
    (tmp_path / "my_real_job.py").write_text(text)
    assert not capstone.check_real_job(str(tmp_path / "my_real_job.py"))
    assert "train_step, save_checkpoint, load_checkpoint still raise NotImplementedError" in capsys.readouterr().out

@pytest.mark.long
@pytest.mark.slow
def test_the_right_answer_passes_on_2_and_3_ranks(tmp_path, capsys):
    path = tmp_path / "my_real_job.py"
    path.write_text(EXAMPLE)
    assert capstone.check_real_job(str(path)), capsys.readouterr().out
    assert "one all-reduce per optimizer step" in capsys.readouterr().out


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_each_mistake_is_named(name, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DP_PROBE_TIMEOUT", "4")  # a rank left waiting fails in 4 s
    text, *words = MISTAKES[name]
    path = tmp_path / "my_real_job.py"
    path.write_text(text)
    assert not capstone.check_real_job(str(path))
    out = capsys.readouterr().out
    assert all(w in out for w in words), out
