"""Notebook 08's exercise 5: the right FSDP2 script passes on real ranks, and each typical mistake comes back named."""

import ast

import pytest

from dp_helpers.course.checkers import fsdp_check
from dp_helpers.course.checkers.exercises import SOLUTIONS
from dp_helpers.course.checkers.script_check import CHINESE_TEMPLATES
from tests.conftest import REPO

EXAMPLE = (REPO / "examples" / "train_fsdp.py").read_text()
THREE = ("build_model", "save_checkpoint", "load_checkpoint")
META = '    with torch.device("meta"):  # shapes only: no rank ever holds the full model here\n'
BLOCKS = "    for block in model.blocks:  # a group per block: whole for its forward and its backward, freed after each\n" \
         "        fully_shard(block, mesh=mesh, mp_policy=policy)\n"
STATE = '    state = {"model": model_state, "optimizer": optimizer_state}\n    try:\n'
SAVE = "        dcp.save(state, checkpoint_id=tmp[0])  # a collective; DCP fsyncs each file it writes\n"
LOAD = "        dcp.load(state, checkpoint_id=str(path))\n"


def mistake(*edits: tuple[str, str]) -> str:
    """The example with one typical mistake made in it (each edit must apply: the example may not drift away)."""
    text = EXAMPLE
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


MISTAKES = {
    "the whole model on every rank": (mistake((META, "    if True:\n")), "had real weights when fully_shard split it"),
    "the root alone sharded": (mistake((BLOCKS, "")), "fully_shard was called on CharLM", "needs a call of its own"),
    "the root sharded first": (
        mistake((BLOCKS + "    fully_shard(model, mesh=mesh, mp_policy=policy)", "    fully_shard(model, mesh=mesh, "
                 "mp_policy=policy)\n" + BLOCKS.rstrip("\n"))), "sharded before its blocks"),
    "DCP saved on rank 0 only": (mistake((SAVE, "        if rank == 0:\n    " + SAVE)),
                                 "rank 1 never called dcp.save while rank 0 did", "outside `if rank == 0:`"),
    "DCP loaded on rank 0 only": (mistake((LOAD, "        if dist.get_rank() == 0:\n    " + LOAD)),
                                  "rank 1 never called dcp.load while rank 0 did"),
    "saved straight into place": (
        mistake((SAVE, SAVE.replace("tmp[0]", "str(target)")),
                ("        os.replace(tmp[0], target)  # the whole snapshot appears at once\n", "        pass\n")),
        "dcp.save wrote straight into", "os.replace"),
    "the optimizer left out": (mistake((STATE, STATE.replace(', "optimizer": optimizer_state', ""))),
                               "holds no optimizer state", "exp_avg"),
    "a load that reads nothing": (mistake((LOAD, "")), "rank 0 never called dcp.load"),
}


def defined(text: str, names=THREE) -> dict[str, str]:
    """The AST of each named top-level function (docstrings and comments aside)."""
    found = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            node.body = node.body[1:] if ast.get_docstring(node) is not None else node.body
            found[node.name] = ast.dump(node)
    return found


def test_the_skeleton_is_the_example_without_the_three_bodies():
    template = fsdp_check.TEMPLATE.read_text()
    others = [n.name for n in ast.parse(EXAMPLE).body if isinstance(n, ast.FunctionDef | ast.ClassDef)
              and n.name not in THREE]
    assert defined(template, others) == defined(EXAMPLE, others) and len(others) > 10
    assert all("raise NotImplementedError" in ast.get_source_segment(template, n) for n in ast.parse(template).body
               if isinstance(n, ast.FunctionDef) and n.name in THREE)


def test_the_solution_is_the_examples_three_functions():
    assert defined((SOLUTIONS / "08_5.py").read_text()) == defined(EXAMPLE)


def test_an_untouched_or_half_written_skeleton_is_not_launched(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(fsdp_check, "launched_problem", lambda *a: pytest.fail("launched an unwritten skeleton"))
    path = tmp_path / "my_fsdp.py"
    fsdp_check.start_fsdp_exercise(str(path))
    assert path.read_text() == fsdp_check.TEMPLATE.read_text() and "ready to edit" in capsys.readouterr().out
    assert not fsdp_check.check_fsdp_script(str(path)) and "still the FSDP2 skeleton" in capsys.readouterr().out
    (tmp_path / "zh.py").write_text((CHINESE_TEMPLATES / "my_fsdp.py").read_text())
    assert not fsdp_check.check_fsdp_script(str(tmp_path / "zh.py"))
    template = fsdp_check.TEMPLATE.read_text()
    stub = next(n for n in ast.parse(template).body if getattr(n, "name", "") == "build_model")
    written = next(n for n in ast.parse(EXAMPLE).body if getattr(n, "name", "") == "build_model")
    path.write_text(template.replace(ast.get_source_segment(template, stub), ast.get_source_segment(EXAMPLE, written)))
    assert not fsdp_check.check_fsdp_script(str(path))
    assert "save_checkpoint, load_checkpoint still raise NotImplementedError" in capsys.readouterr().out


@pytest.mark.long
@pytest.mark.slow
def test_the_right_answer_passes_stopped_on_2_ranks_and_resumed_on_3(tmp_path, capsys):
    path = tmp_path / "my_fsdp.py"
    path.write_text(EXAMPLE)
    assert fsdp_check.check_fsdp_script(str(path)), capsys.readouterr().out
    assert "renamed into place" in capsys.readouterr().out


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_each_mistake_is_named(name, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DP_PROBE_TIMEOUT", "4")  # a rank left waiting fails in 4 s
    text, *words = MISTAKES[name]
    path = tmp_path / "my_fsdp.py"
    path.write_text(text)
    assert not fsdp_check.check_fsdp_script(str(path))
    out = capsys.readouterr().out
    assert all(w in out for w in words), out
