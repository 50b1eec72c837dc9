"""The Chinese edition: every lesson's NN_name.zh-CN.ipynb is the build of its English notebook and its translation."""

import nbformat
import pytest

from tools import edition

ENGLISH = edition.english_notebooks()


def test_every_chinese_edition_is_the_build_of_the_current_english_cells():
    assert edition.stale_editions(ENGLISH) == []  # each problem names the notebook, the cell and what to do


@pytest.mark.parametrize("path", ENGLISH, ids=lambda p: p.name)
def test_an_edition_runs_the_english_code_and_shows_the_english_outputs(path):
    en, zh = (nbformat.read(p, as_version=4).cells for p in (path, edition.edition_of(path)))
    assert [c.cell_type for c in zh] == [c.cell_type for c in en]
    for i, (e, z) in enumerate(zip(en, zh, strict=True)):
        if e.cell_type == "code":
            assert edition.code_tokens(edition.without_language(z.source)) == edition.code_tokens(e.source), i
            assert (z.outputs, z.execution_count) == (e.outputs, e.execution_count), i
        else:
            assert edition.CJK.search(z.source) or edition.is_pointer(i, e), f"cell {i} is not in Chinese"
    assert next(c for c in zh if edition.is_setup(c)).source.endswith(edition.LANGUAGE_LINES)


def cell(kind: str, source: str, id_: str):
    made = nbformat.v4.new_markdown_cell(source) if kind == "markdown" else nbformat.v4.new_code_cell(source)
    made.id = id_
    return made


@pytest.fixture
def lesson(tmp_path, monkeypatch):
    """A lesson of four cells in a folder of its own, its translation folder beside it."""
    monkeypatch.setattr(edition, "TRANSLATIONS", tmp_path / "i18n")
    nb = nbformat.v4.new_notebook(cells=[
        cell("markdown", "# 01 · A lesson\nSee [the next one](02_b.ipynb) and [the article](../docs/source-article.md).", "title"),
        cell("markdown", "## 中文版\n[01_a.zh-CN.ipynb](01_a.zh-CN.ipynb)", "pointer"),
        cell("code", "from dp_helpers import tasks  # the package", "setup"),
        cell("markdown", "## What you'll learn\n## Takeaways\n## Exercises", "skeleton"),
    ])
    path = tmp_path / "01_a.ipynb"
    nbformat.write(nb, path)
    return path


def fill(path, texts: dict) -> None:
    """Replace the blocks' text of a translation file by the given texts, by cell id."""
    blocks = edition.read_blocks(edition.translation_of(path))
    for block in blocks:
        block.text = texts.get(block.cell, block.text)
    edition.write_blocks(edition.translation_of(path), path.name, blocks)


CHINESE = {"title": "# 01 · 一课\n见[下一课](02_b.ipynb)和[原文](../docs/source-article.md)。", "setup": "from dp_helpers import tasks  # 课程的包",
           "skeleton": "## 学习目标\n## 小结\n## 练习"}


def test_a_skeleton_is_english_until_translated_then_the_build_localises_links_and_sets_the_language(lesson):
    assert edition.skeleton(lesson) == 3  # the title, the setup cell's comment, the skeleton; not the pointer
    problems = edition.build(lesson)[1]
    assert sum("is still in English" in p for p in problems) == 2 and sum("no heading" in p for p in problems) == 3
    fill(lesson, CHINESE)
    nb, problems = edition.build(lesson)
    assert problems == []
    assert "](02_b.zh-CN.ipynb)" in nb.cells[0].source and "](01_a.ipynb)" in nb.cells[1].source
    assert "](../docs/source-article.zh-CN.md)" in nb.cells[0].source
    assert nb.cells[2].source == "from dp_helpers import tasks  # 课程的包\n" + edition.LANGUAGE_LINES


def test_a_changed_english_cell_is_named_and_a_translation_that_changes_code_is_refused(lesson):
    edition.skeleton(lesson)
    fill(lesson, {**CHINESE, "setup": "from dp_helpers import launch  # 课程的包"})
    nb = nbformat.read(lesson, as_version=4)
    nb.cells[0].source += "\nOne more sentence."
    nbformat.write(nb, lesson)
    problems = edition.build(lesson)[1]
    assert any("01_a.ipynb cell 0 (id title, markdown) changed since it was translated" in p for p in problems)
    assert any("cell 2 (id setup, code)" in p and "changes the code" in p for p in problems)
    assert len(problems) == 2
