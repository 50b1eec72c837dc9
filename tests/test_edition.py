"""The Chinese edition: every lesson's NN_name.zh-CN.ipynb is the build of its English notebook and its translation."""

import nbformat
import pytest

from tools import edition

ENGLISH = edition.english_notebooks()


def test_every_chinese_edition_is_the_build_of_the_current_english_cells():
    assert edition.stale_editions(ENGLISH) == []  # each problem names the notebook, the cell and what to do


@pytest.mark.parametrize("path", ENGLISH, ids=lambda p: p.name)
def test_an_edition_runs_the_english_code_and_shows_the_outputs_of_its_own_run(path):
    en, zh = (nbformat.read(p, as_version=4) for p in (path, edition.edition_of(path)))
    assert [c.cell_type for c in zh.cells] == [c.cell_type for c in en.cells]
    for i, (e, z) in enumerate(zip(en.cells, zh.cells, strict=True)):
        if e.cell_type == "code":
            assert edition.same_code(e.source, edition.without_language(z.source)), i
        else:
            assert edition.CJK.search(z.source) or edition.is_pointer(i, e), f"cell {i} is not in Chinese"
    setup = next(c for c in zh.cells if edition.is_setup(c)).source  # the language set before the report prints
    assert setup.endswith(edition.LANGUAGE_LINES + "\nprint(format_report(report()))"), setup[-200:]
    assert edition.run_problems(zh, path.name) == []  # one clean run of exactly this code, no errors
    ran = [c.execution_count for c in zh.cells if c.cell_type == "code"]
    assert ran == list(range(1, len(ran) + 1))


@pytest.mark.parametrize("chinese, same", [
    ('ax.set_title(f"{rows} 行分到 8 个设备")', True),  # the text translated, the placeholder kept
    ('ax.set_title(f"{rows + 1} 行分到 8 个设备")', False),  # another expression shown
    ('ax.set_title(f"8 个设备")', False),  # a placeholder dropped
    ('ax.set_title(f"{rows} rows on 9 devices")', False),  # changed, but not into Chinese: a changed value
    ('ax.set_xlabel(f"{rows} 行分到 8 个设备")', False),  # another call
    ('ax.set_title(f"{rows} rows on 8 devices")  # 注释', True),
])
def test_a_translation_may_put_a_shown_string_into_chinese_and_nothing_else(chinese, same):
    assert edition.same_code('ax.set_title(f"{rows} rows on 8 devices")', chinese) is same


def test_a_build_keeps_the_editions_last_run_and_names_code_changed_since(lesson):
    edition.skeleton(lesson)
    fill(lesson, CHINESE)
    target = edition.edition_of(lesson)
    nb = edition.build(lesson)[0]
    nb.cells[2].outputs = [nbformat.v4.new_output("stream", name="stdout", text="ran\n")]
    nb.cells[2].execution_count = 1
    target.write_text(edition.as_text(nb), encoding="utf-8")
    edition.stamp_run(target)
    rebuilt = edition.build(lesson)[0]
    assert rebuilt.cells[2].outputs[0].text == "ran\n" and edition.run_problems(rebuilt, target.name) == []
    english = nbformat.read(lesson, as_version=4)
    english.cells[2].source = "from dp_helpers import launch  # the package"
    nbformat.write(english, lesson)
    fill(lesson, {"setup": "from dp_helpers import launch  # 课程的包"})
    blocks = edition.read_blocks(edition.translation_of(lesson))
    blocks[1].en = edition.source_hash(english.cells[2].source)
    edition.write_blocks(edition.translation_of(lesson), lesson.name, blocks)
    rebuilt, problems = edition.build(lesson)
    assert problems == [] and "do not come from its current code" in edition.run_problems(rebuilt, target.name)[0]


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


def test_a_chinese_paragraph_broken_between_two_characters_is_named():
    assert edition.soft_breaks("构建\n模型") == ["构建"]
    assert edition.soft_breaks("构建模型：\n- 一项\n```\n代码\n行\n```\n## 标题") == []  # a list, a fence, a heading
    assert edition.soft_breaks("use the\nmodel") == []  # English: the space is meant


def test_the_language_is_set_before_the_setup_cell_prints_the_machines_report():
    english = "import os\nfrom dp_helpers.tool.env import format_report, report\nprint(format_report(report()))"
    chinese = edition.with_language(english)
    assert chinese.splitlines()[-1] == "print(format_report(report()))" and edition.LANGUAGE_LINES in chinese
    assert edition.without_language(chinese) == english
    assert edition.with_language("import os") == "import os\n" + edition.LANGUAGE_LINES  # nothing printed: at the end
