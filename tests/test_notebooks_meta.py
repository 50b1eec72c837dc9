"""The committed notebooks follow the skeleton: badges to themselves, a setup cell, short cells, real checks."""

import ast
import importlib
import pkgutil
import re
import statistics
from pathlib import Path

import nbformat
import pytest

import dp_helpers
from tools import repository

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb") if not p.name.endswith(".zh-CN.ipynb"))
HOME = repository.home()  # pyproject.toml's repository and branch


def code_cells(path):
    return [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def test_there_are_notebooks():
    assert [p.name[:2] for p in NOTEBOOKS] == [f"{i:02d}" for i in range(len(NOTEBOOKS))]  # 00 first: start here


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_badges_point_at_this_notebook(path):
    first = nbformat.read(path, as_version=4).cells[0].source
    assert HOME.colab(f"notebooks/{path.name}") in first and HOME.kaggle(f"notebooks/{path.name}") in first


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_setup_cell_installs_when_missing(path):
    setup = code_cells(path)[0].source
    assert 'find_spec("dp_helpers") is None' in setup and HOME.clone() in setup and "report()" in setup


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_cells_are_short(path):
    setup, *lengths = [len(c.source.splitlines()) for c in code_cells(path)]
    assert setup <= 25  # the setup cell: install when missing, then the notebook's imports
    assert statistics.median(lengths) <= 5 and max(lengths) <= 22


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_at_least_five_checks(path):
    source = "\n".join(c.source for c in code_cells(path))
    assert len(re.findall(r"^\s*assert |assert_close\(", source, re.M)) >= 5


def exercises(path) -> list[str]:
    """The numbers of a notebook's exercises: '**Exercise k.' inside its sections, else '**k.' in its Exercises section."""
    text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown")
    inside = re.findall(r"^\*\*Exercise (\d+)\b", text.split("## Takeaways", 1)[0], re.M)
    return inside or re.findall(r"^\*\*(\d+)\.", text.split("## Exercises", 1)[1], re.M)


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.name[:2] in ("05", "06", "07")], ids=lambda p: p.name)
def test_the_practice_notebooks_place_three_exercises_inside_their_sections(path):
    cells = nbformat.read(path, as_version=4).cells
    sections = [i for i, c in enumerate(cells) if c.cell_type == "markdown" and re.match(r"## \d+\. ", c.source)]
    placed = [i for i, c in enumerate(cells) if c.cell_type == "markdown" and c.source.startswith("**Exercise ")]
    assert len(placed) >= 3 and all(sections[0] < i for i in placed)
    # its answer cell follows, after the cell that copies its skeleton where it has one
    assert all(re.search(r"^check_\w+\(", cells[i + 1].source, re.M) or re.match(r"(from .*\n)?start_\w+\(", cells[i + 1].source)
               and re.search(r"^check_\w+\(", cells[i + 2].source, re.M) for i in placed)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_solution_is_on_the_page_and_one_exercise_asks_for_code(path):
    cells = code_cells(path)
    assert not any(c.metadata.get("jupyter", {}).get("source_hidden") or "@title Solution" in c.source for c in cells)
    asks = [c for c in cells if re.search(r"^check_\w+\(", c.source, re.M)]
    # code the learner writes: a function in the notebook, or a file a checker runs (check_ddp_script, check_my_...)
    assert asks and any("raise NotImplementedError" in c.source or re.search(r"check_(ddp_script|my_\w+)\(", c.source)
                        for c in asks)
    number = path.name[:2]
    assert exercises(path) == [str(k) for k in range(1, len(exercises(path)) + 1)] and len(asks) >= len(exercises(path))
    # every exercise has its solution, outside the notebook, and the notebook says how to show it
    assert sorted(p.stem for p in (REPO / "solutions").glob(f"{number}_*.py")) == [f"{number}_{k}" for k in
                                                                                   exercises(path)]
    assert f'solution("{number}.1")' in "\n".join(c.source for c in nbformat.read(path, as_version=4).cells)


def test_every_solution_belongs_to_an_exercise():
    known = {f"{p.name[:2]}_{k}" for p in NOTEBOOKS for k in exercises(p)}
    assert {p.stem for p in (REPO / "solutions").glob("*.py")} == known


def test_the_first_notebook_maps_the_whole_route():
    route = nbformat.read(NOTEBOOKS[0], as_version=4).cells
    table = next(c.source for c in route if c.source.startswith("## 6. The route"))
    for path in NOTEBOOKS[1:]:
        assert f"]({path.name})" in table and re.search(rf"^\| {path.name[:2]} \|.*\| \d+ min", table, re.M), path.name


def test_the_core_route_takes_at_most_three_hours_and_its_times_are_not_below_the_estimate():
    from tools import notebooks, site

    rows, core = site.route_rows("en"), {}
    for path in NOTEBOOKS:
        row, estimate = rows[path.name[:2]], notebooks.minutes(path)
        assert int(row[4].split()[0]) >= estimate["with exercises"], path.name  # the table adds a run's seconds
        if row[3] != "optional":
            core[path.name[:2]] = int(row[3].split()[0])
            assert core[path.name[:2]] >= estimate["core, with its exercises"], path.name
    assert sorted(core) == ["00", "03", "06", "07", "08"] and sum(core.values()) <= 180, core
    assert max(core.values()) <= 50, core  # "about 40": 00 and 07 (the capstone) are the longest


def test_a_deep_dive_heading_takes_its_section_or_exercise_off_the_core_route():
    from tools import notebooks

    md = nbformat.v4.new_markdown_cell
    cells = [md("## 1. Core\n" + "word " * 150), md("## 2. Inner (deep dive, optional)\n" + "word " * 300),
             md("### 2.1 More\n" + "word " * 150), md("## 3. Back\n**1. (deep dive, optional)** " + "word " * 150)]
    deep = [(d, sum(len(c.source.split()) for c in cs)) for d, cs in notebooks.parts(cells)]
    assert deep == [(False, 0), (False, 153), (True, 306), (True, 153), (False, 3), (True, 154)]


def test_a_folded_note_counts_for_the_whole_notebook_but_not_for_its_core_route(tmp_path):
    from tools import notebooks

    note = "<details><summary>Why?</summary>\n\n" + "word " * 1500 + "\n\n</details>"
    for name, text in (("plain", "word " * 1500), ("noted", "word " * 1500 + note)):
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(text)]), tmp_path / name)
    plain, noted = (notebooks.minutes(tmp_path / name) for name in ("plain", "noted"))
    assert noted["core, with its exercises"] == plain["core, with its exercises"] == 10
    assert noted["with exercises"] == 2 * plain["with exercises"] == 20


def exported_names() -> set[str]:
    names = set()
    for mod in pkgutil.walk_packages(dp_helpers.__path__, "dp_helpers."):
        names |= {n for n in vars(importlib.import_module(mod.name)) if not n.startswith("_")}
    return names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebooks_do_not_redefine_package_code(path):
    defined = {node.name for c in code_cells(path) if not c.source.lstrip().startswith(("%", "!"))
               for node in ast.walk(ast.parse(c.source)) if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    assert not defined & exported_names()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_under_the_title_a_link_to_the_chinese_edition_and_english_alone_below(path):
    cells = nbformat.read(path, as_version=4).cells
    assert cells[1].cell_type == "markdown" and cells[1].source.startswith("## 中文版")
    assert f"]({path.stem}.zh-CN.ipynb)" in cells[1].source
    # the Chinese edition carries the Chinese: no gloss left in the English prose
    glossed = [c.source[:60] for c in cells[2:] if c.cell_type == "markdown" and re.search(r"[\u4e00-\u9fff]", c.source)]
    assert not glossed
