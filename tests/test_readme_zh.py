"""README.zh-CN.md keeps the English README's commands and flags, and both link each other and the glossary."""

import re
from pathlib import Path

from dp_helpers.__main__ import flag_rows

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
