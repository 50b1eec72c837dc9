"""tools/prose.py: how the lessons read (sentence lengths, words in and out of notes, the course names
their code uses), printed in CI."""

import json

from tools import prose


def test_english_sentences_are_counted_in_words_and_an_abbreviation_does_not_end_one():
    text = "The batch splits in two, e.g. rows 0-3 and 4-7. Each rank runs it! Yes.\n\nA new paragraph here."
    assert prose.en_sentences(text) == [10, 4, 4]  # "Yes." is under three words


def test_chinese_sentences_are_counted_in_characters_inline_code_as_one():
    assert prose.zh_sentences("每个进程拿到一半数据。`DistributedSampler` 负责切分！好。") == [11, 6]  # 。 counts


def test_notes_code_tables_and_headings_are_not_the_main_text():
    md = ("## A heading\n\nOne short sentence here, with [a link](x.md).\n\n| a | b |\n\n```python\nx = 1\n```\n"
          "<details><summary>Why</summary>\n\nA note a first reading skips.\n\n</details>")
    main, notes = (prose.prose_of(part) for part in prose.split_notes(md))
    assert main.split() == "One short sentence here, with a link.".split()
    assert notes.split() == "A note a first reading skips.".split()


def test_machinery_and_taught_names_are_told_apart_and_a_modules_attributes_count():
    code = ("from dp_helpers.course import run_ddp, show  # launch and show\n"
            "from dp_helpers.scratch.ddp.mini_ddp import MiniDDP\n"
            "import dp_helpers.tool.dp as dp\n"
            "run_ddp('x.py'); show(MiniDDP); dp._gather_map(1); dp.replicate(2)\n")
    machinery, taught = prose.course_names(code)
    assert machinery == {"run_ddp", "show", "dp._gather_map", "dp.replicate"} and taught == {"MiniDDP"}


def lesson(root, name: str, markdown: str) -> None:
    """A one-cell notebook under root/notebooks."""
    cell = {"cell_type": "markdown", "metadata": {}, "source": [markdown]}
    (root / "notebooks").mkdir(exist_ok=True)
    (root / "notebooks" / name).write_text(json.dumps({"cells": [cell]}), encoding="utf-8")


def test_check_passes_a_plain_course_and_names_what_a_long_one_misses(tmp_path, capsys):
    for name in ("README.md", "README.zh-CN.md"):
        (tmp_path / name).write_text("# Course\n\nShort.\n", encoding="utf-8")
    lesson(tmp_path, "00_a.ipynb", "Each rank takes its own rows. Then they average.")
    lesson(tmp_path, "00_a.zh-CN.ipynb", "每个进程拿到自己的那几行。然后求平均。")
    assert prose.main(["--root", str(tmp_path), "--check"]) == 0
    assert "00_a.ipynb" in capsys.readouterr().out
    lesson(tmp_path, "00_a.ipynb", " ".join(["word"] * 61) + ".")
    assert prose.main(["--root", str(tmp_path), "--check"]) == 1
    assert "00_a.ipynb: a sentence of 61 words" in capsys.readouterr().out
