"""README.zh-CN.md keeps the English README's commands and flags, and both link each other and the glossary."""

import re
from pathlib import Path

import pytest

from dp_helpers.tool.cli import flag_rows

REPO = Path(__file__).resolve().parent.parent
EN, ZH = (REPO / "README.md").read_text(encoding="utf-8"), (REPO / "README.zh-CN.md").read_text(encoding="utf-8")
COMMAND = re.compile(r"^(python3? (-m |dp_helpers/|tools/)|pip install|pytest|jupyter lab|conda env|srun |bash \.ci)")


def fragments(text: str):
    """Every line of a fenced block, and every inline code span."""
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        yield from block.splitlines()
    yield from re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))


def commands(text: str) -> set[str]:
    """The command lines a README shows, without a '$ ' prompt or a trailing comment (comments are translated)."""
    found = (f.strip().removeprefix("$ ").split("  #")[0].strip() for f in fragments(text))
    return {f for f in found if COMMAND.match(f)}


def flags(text: str) -> set[str]:
    """Every --flag a README mentions."""
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))


def test_the_chinese_readme_has_the_same_commands():
    assert commands(ZH) == commands(EN) and len(commands(EN)) > 10


def quick_start_setup(text: str, heading: str) -> list[str]:
    """The set-up lines of a README's Quick start: its first block up to the first command that uses the course."""
    block = text.split(f"\n## {heading}\n")[1].split("```bash\n")[1].split("```")[0]
    lines = [line.split("  #")[0].strip() for line in block.splitlines()]
    return lines[: next(i for i, line in enumerate(lines) if not line.startswith(("python3 -m venv", "pip install")))]


def test_ci_sets_up_with_the_quick_starts_own_commands():
    body = re.search(r"^setup_course\(\) \{.*?\n(.*?)\n\}", (REPO / ".ci" / "run").read_text(), re.S | re.M).group(1)
    ci = [line.strip().replace('"$env_dir/', "").replace('"', "") for line in body.splitlines()]
    assert ci == quick_start_setup(EN, "Quick start") == quick_start_setup(ZH, "快速开始") and len(ci) == 3


def test_the_chinese_readme_has_the_same_flags():
    assert flags(ZH) == flags(EN)


def test_the_chinese_flag_table_lists_every_train_flag_with_its_default():
    rows = {tuple(cell.strip() for cell in line.split("|")[1:3]) for line in ZH.splitlines() if line.startswith("| `--")}
    expected = {(flag, {"see meaning": "见含义"}.get(default, default)) for flag, default, _ in flag_rows()}
    assert expected <= rows


def test_the_readmes_link_each_other_and_the_glossary():
    assert "(README.zh-CN.md)" in EN.split("\n## ")[0] and "(README.md)" in ZH.split("\n## ")[0]
    assert "(docs/glossary.md)" in EN and "(docs/glossary.md)" in ZH
    glossary = (REPO / "docs" / "glossary.md").read_text(encoding="utf-8")
    for term in ("rank", "world_size", "all-reduce", "reduce-scatter", "bucket", "DistributedSampler", "ZeRO"):
        assert f"| {term}" in glossary or f"| `{term}`" in glossary, term


# Content: README.zh-CN.md says what README.md says. Section by section (the `## ` headings correspond one to one, in
# order), every table has the same rows and each row the same numbers, every code block is the same once its comments
# are stripped, and the prose outside them has the same numbers. A number or a row added in English alone fails here.
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")  # 1,500 · 98 · 2.13.0 · 0.01 · the 16 of fp16


def sections(text: str) -> list[str]:
    """The text before the first `## ` heading, then each `## ` section with its heading line."""
    return re.split(r"^(?=## )", text, flags=re.M)


def heading(section: str) -> str:
    """A section's heading line ('' for the text before the first one)."""
    return section.splitlines()[0] if section.startswith("## ") else ""


def numbers(text: str) -> list[str]:
    """The numbers in a text, sorted: a multiset to compare."""
    return sorted(NUMBER.findall(text))


def code_blocks(text: str) -> list[list[str]]:
    """Each fenced block's lines without comments (a '#' after two spaces, or a line that is only a comment)."""
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", text, re.S | re.M)
    return [[s for line in b.splitlines() if (s := line.split("  #")[0].rstrip()) and not s.lstrip().startswith("#")]
            for b in blocks]


def tables(text: str) -> list[list[str]]:
    """Each table's body rows (header and rule left out)."""
    found, rows = [], []
    for line in re.sub(r"^```.*?^```", "", text, flags=re.S | re.M).splitlines() + [""]:
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            found, rows = found + [rows[2:]], []
    return found


def prose(text: str) -> str:
    """A section without its code blocks and tables."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return "\n".join(line for line in text.splitlines() if not line.startswith("|"))


def content_differences(en: str, zh: str) -> list[str]:
    """Every way the Chinese README's content falls short of the English one's (empty: none)."""
    en_parts, zh_parts = sections(en), sections(zh)
    if len(en_parts) != len(zh_parts):
        return [f"{len(en_parts) - 1} sections in English, {len(zh_parts) - 1} in Chinese: "
                f"{[heading(s) for s in en_parts]} against {[heading(s) for s in zh_parts]}"]
    found = []
    for e, z in zip(en_parts, zh_parts, strict=True):
        where = f"{heading(e) or 'the introduction'} / {heading(z) or 'the introduction'}"
        if re.findall(r"`[^`]+`", heading(e)) != re.findall(r"`[^`]+`", heading(z)) or \
                numbers(heading(e)) != numbers(heading(z)):
            found.append(f"{where}: the headings differ in code or numbers")
        if len(re.findall(r"^### ", e, re.M)) != len(re.findall(r"^### ", z, re.M)):
            found.append(f"{where}: a different number of ### subsections")
        if code_blocks(e) != code_blocks(z):
            found.append(f"{where}: the code blocks differ (comments aside)")
        found += table_differences(where, tables(e), tables(z))
        if numbers(prose(e)) != numbers(prose(z)):
            found.append(f"{where}: the prose has numbers {numbers(prose(e))} in English, {numbers(prose(z))} in Chinese")
    return found


def table_differences(where: str, en: list[list[str]], zh: list[list[str]]) -> list[str]:
    """Tables of one section: as many, as many rows in each, and every row's numbers the same multiset."""
    if [len(t) for t in en] != [len(t) for t in zh]:
        return [f"{where}: tables of {[len(t) for t in en]} rows in English, {[len(t) for t in zh]} in Chinese"]
    return [f"{where}: the row {e!r} has numbers {numbers(e)}, its Chinese {numbers(z)}"
            for te, tz in zip(en, zh, strict=True) for e, z in zip(te, tz, strict=True) if numbers(e) != numbers(z)]


def test_the_chinese_readme_says_what_the_english_one_says():
    assert content_differences(EN, ZH) == []
    assert len(sections(EN)) > 10 and sum(map(len, tables(EN))) > 70 and len(code_blocks(EN)) > 12


def test_the_comparison_catches_what_english_alone_gains():
    """Each kind of change to the English text alone is found: the comparison can fail."""
    table_row = "| `--epochs` | `10` |"
    last_row = next(line for line in EN.splitlines() if line.startswith("| 09 |"))
    changes = {
        "a section": EN + "\n## Something new\n\nMore.\n",
        "a row": EN.replace(last_row, last_row + "\n| 10 | a new notebook | ready |"),
        "a number in a row": EN.replace(table_row, "| `--epochs` | `12` |"),
        "a command": EN.replace("pytest -m \"not slow\"  ", "pytest -m \"not slow\" -x", 1),
        "a number in the prose": EN.replace("takes 4 to 8 minutes", "takes 4 to 9 minutes"),
        "a subsection": EN.replace("### Opening them", "### Opening them\n\n### And more"),
    }
    assert all(table_row in EN and changed != EN for changed in changes.values())
    for what, changed in changes.items():
        assert content_differences(changed, ZH), what
    assert content_differences(EN, EN) == []  # comments and words are free: the same text passes
    translated = EN.replace("# every test but the long ones, the notebooks included", "# 全部测试")
    assert code_blocks(translated) == code_blocks(EN)


@pytest.mark.parametrize("name", ["README.zh-CN.md", "site/front/zh-CN.md", "docs/source-article.zh-CN.md"])
def test_no_chinese_paragraph_is_broken_where_a_browser_would_show_a_space(name):
    from tools import edition

    assert edition.soft_breaks((REPO / name).read_text(encoding="utf-8")) == []
