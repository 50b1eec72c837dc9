"""tools/notebooks.py: what CI checks on committed notebooks, and the re-execution command."""

import inspect
import re

import nbformat
import pytest

from tools import edition
from tools import notebooks as nbtools


def make_notebook(path, counts=(1, 2), error=False, headings=nbtools.SKELETON, widget=False):
    cells = [nbformat.v4.new_markdown_cell("# Title\nsubtitle"),
             nbformat.v4.new_markdown_cell("\n".join(f"## {h}" for h in headings))]
    for n in counts:
        cell = nbformat.v4.new_code_cell("x = 1")
        cell.execution_count = n
        cells.append(cell)
    if error:
        cells[-1].outputs = [nbformat.v4.new_output("error", ename="ValueError", evalue="x", traceback=[])]
    if widget:
        cells[-1].outputs = [nbformat.v4.new_output("display_data", data={
            "text/plain": "bench:   0%|", nbtools.WIDGET_VIEW: {"model_id": "x", "version_major": 2, "version_minor": 0}})]
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    return path


def test_clean_notebook_passes(tmp_path):
    assert nbtools.problems(make_notebook(tmp_path / "01_a.ipynb")) == []


@pytest.mark.parametrize("kwargs, words", [
    ({"counts": (1, 3)}, "not one clean run 1..2"),
    ({"counts": (None, None)}, "not one clean run"),
    ({"error": True}, "error outputs in code cells [2]"),
    ({"widget": True}, "widget outputs (frozen at their first frame) in code cells [2]"),
    ({"headings": ("What you'll learn", "Exercises")}, "no 'Takeaways' section"),
])
def test_problems_are_named(tmp_path, kwargs, words):
    found = nbtools.problems(make_notebook(tmp_path / "01_a.ipynb", **kwargs))
    assert any(words in p for p in found), found


def test_every_lesson_links_its_chinese_edition_saying_what_it_is():
    import nbformat

    from tools import edition

    for path in edition.english_notebooks():
        assert nbtools.pointer_problems(nbformat.read(path, as_version=4), path) == [], path.name
    nb = nbformat.read(edition.english_notebooks()[0], as_version=4)
    nb.cells[1].source = nb.cells[1].source.split("。")[0] + "（代码和输出与英文版相同）"  # what it said before
    assert "not the link to its Chinese edition" in nbtools.pointer_problems(nb, edition.english_notebooks()[0])[0]


def test_check_command_exit_codes(tmp_path, capsys):
    good, bad = make_notebook(tmp_path / "01_a.ipynb"), make_notebook(tmp_path / "02_b.ipynb", counts=(2, 1))
    assert nbtools.main(["check", str(good)]) == 0
    assert nbtools.main(["check", str(good), str(bad)]) == 1
    assert "02_b.ipynb: execution counts" in capsys.readouterr().out


@pytest.mark.slow
def test_execute_writes_a_clean_run(tmp_path):
    path = make_notebook(tmp_path / "01_a.ipynb", counts=(7, 3))
    nbtools.execute(path, timeout=120)
    assert nbtools.problems(path) == []


def test_execute_starts_every_exercise_from_its_template(tmp_path):
    called = set(re.findall(r"^(start_\w+_exercise)\(", "".join(
        c.source + "\n" for p in edition.english_notebooks() for c in nbformat.read(p, as_version=4).cells), re.M))
    assert called and called <= {f.__name__ for f in nbtools.exercise_starts()}  # a new exercise is cleared too
    left = [tmp_path / inspect.signature(f).parameters["path"].default for f in nbtools.exercise_starts()]
    for path in left:
        path.write_text("# a run's leftover, which the start would keep and the checker would run")
    nbtools.fresh_exercise_files(tmp_path)
    assert not any(path.exists() for path in left)

def test_strip_volatile_drops_widget_outputs(tmp_path):
    nb = nbformat.read(make_notebook(tmp_path / "01_a.ipynb", widget=True), as_version=4)
    nbtools.strip_volatile(nb)
    assert nb.cells[-1].outputs == []


def test_a_listing_that_no_longer_matches_the_package_is_named():
    from dp_helpers.course.show import source
    from dp_helpers.scratch.ddp.mini_ddp import broadcast_state

    shown = source(broadcast_state, torch_no_sync()) + "\n"
    assert nbtools.stale_parts(shown) == []  # today's source, and torch's own part (not checked)
    head, first, *rest = shown.splitlines()
    assert nbtools.stale_parts("\n".join([head, first + "  # edited since", *rest])) == [head.removeprefix("# ")]
    moved = head.rsplit(" ", 1)[0] + f" {int(head.rsplit(' ', 1)[1]) + 1}"  # the function moved down a line
    assert nbtools.stale_parts("\n".join([moved, first, *rest])) == [moved.removeprefix("# ")]
    assert nbtools.stale_parts("# dp_helpers/gone.py, line 3\ndef f(): ...") == ["dp_helpers/gone.py"]


def torch_no_sync():
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel.no_sync


@pytest.mark.slow
def test_execute_keeps_figures_as_svg(tmp_path):
    path = tmp_path / "01_a.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import matplotlib.pyplot as plt\nplt.plot([0, 1])\nplt.show()")]), path)
    nbtools.execute(path, timeout=120)
    (figure,) = [o for o in nbformat.read(path, as_version=4).cells[0].outputs if o.output_type == "display_data"]
    assert "image/svg+xml" in figure.data and "image/png" not in figure.data  # sharp at any zoom, on the site too
