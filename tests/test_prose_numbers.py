"""The lessons' prose holds no number taken from a run (STYLE.md: numbers come from the run).

A lesson is read beside the outputs of its last run, and each edition is run on its own, so a number copied into
the prose from one run contradicts the next run's output. The run's numbers are printed by the cells; the prose
says what they show. The sweep below finds every number in the prose (both editions) that looks measured, a time,
a ratio or a share, and each must be listed here with what it is: a setting of the lesson, arithmetic on settings,
a published figure, a figure `benchmarks/README.md` records (checked there), or a range over other runs that the
sentence says is one.
"""

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
BENCHMARKS = NOTEBOOKS.parent / "benchmarks" / "README.md"
NUM = r"\d+(?:\.\d+)?"
LOOKS_MEASURED = [re.compile(rf"(?<![\w.$]){NUM}\s*[–-]\s*{NUM}\s*(?:ms|µs|us|s\b|×|x\b|%|of\b|倍)"),
                  re.compile(r"(?<![\w.$])\d+\.\d+\s*[–-]\s*\d+\.\d+"),  # a range of ratios
                  re.compile(rf"(?<![\w.$/^]){NUM}\.\d+\s*(?:ms|µs|us|s\b|×|%|GB/s|MB/s|倍)"),
                  re.compile(rf"(?<![\w.$]){NUM}\s*(?:ms|µs|us)\b"),
                  # a bare ratio, 0.87 or 1.02: two decimals, no unit after, no version before (torch 1.11)
                  re.compile(r"(?<![\w.$–-])(?<!orch )[01]\.\d\d(?!\d|\s*(?:[–-]\s*\d|ms|µs|us|s\b|×|%|[kMG]i?B|倍))"),
                  re.compile(rf"(?<![\w.$]){NUM}\s*%")]

SETTING, ARITHMETIC, PUBLISHED = "a setting of the lesson", "arithmetic on settings", "a published figure"
RECORDED = "recorded in benchmarks/README.md"
OTHER_RUNS = "a range over other runs, said to be one"
KNOWN = {  # (lesson, the number as the prose writes it, spaces removed): what it is
    ("03", "0.5"): ARITHMETIC, ("03", "0.693"): ARITHMETIC,  # ln 2: predicting 0.5 for every sample
    ("04", "0.87"): RECORDED, ("04", "1.01"): RECORDED,
    ("04", "1ms"): SETTING, ("04", "10µs"): SETTING, ("04", "1.26ms"): ARITHMETIC, ("04", "2ms"): ARITHMETIC,
    ("04", "0.1"): SETTING, ("04", "40%"): SETTING, ("04", "0.5"): SETTING,
    ("04", "1.50"): ARITHMETIC,  # a bucket's MiB in notebook 05: the model's shapes decide it
    ("04", "71%"): OTHER_RUNS, ("04", "1.35–1.55"): OTHER_RUNS, ("04", "1.02"): OTHER_RUNS,
    ("05", "0.25"): SETTING, ("05", "1.50"): ARITHMETIC,
    ("08", "1.5×"): ARITHMETIC, ("08", "0.8"): ARITHMETIC, ("08", "1ms"): SETTING,
    ("09", "0.77"): RECORDED, ("09", "0.92"): RECORDED, ("09", "1.18"): RECORDED, ("09", "1.26"): RECORDED,
    ("09", "1.18×"): RECORDED, ("09", "1.26×"): RECORDED,  # the Chinese edition's 倍
    ("09", "100%"): ARITHMETIC, ("09", "0.04"): ARITHMETIC, ("09", "0.04%"): ARITHMETIC, ("09", "0.1"): SETTING,
    ("09", "0.1%"): SETTING, ("09", "68%"): PUBLISHED, ("09", "90%"): PUBLISHED, ("09", "91%"): PUBLISHED,
    ("09", "93%"): PUBLISHED, ("09", "0.5"): SETTING, ("09", "10µs"): SETTING,
    ("10", "10%"): SETTING, ("10", "0.3"): SETTING, ("10", "0.7"): SETTING, ("10", "0.9"): SETTING,
    ("10", "1ms"): SETTING, ("10", "2ms"): ARITHMETIC, ("10", "35ms"): ARITHMETIC, ("10", "50µs"): SETTING,
    ("10", "70µs"): ARITHMETIC, ("10", "0.9us"): ARITHMETIC, ("10", "6.5%"): ARITHMETIC, ("10", "0.25"): SETTING,
    ("11", "0.1s"): SETTING,  # torch's default monitor interval
    ("11", "0.2"): SETTING, ("11", "1.5s"): SETTING, ("11", "0.5"): SETTING, ("11", "0.5s"): SETTING,
}


def lessons() -> list[Path]:
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def prose(path: Path) -> list[str]:
    """A lesson's markdown cells without code spans and maths (a number there is code's or a formula's)."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [re.sub(r"\$[^$]*\$", "", re.sub(r"`[^`]*`", "", "".join(c["source"])))
            for c in cells if c["cell_type"] == "markdown"]


def numbers(text: str) -> set[str]:
    """Every number in the text that looks measured, as the text writes it, spaces removed."""
    found = {m.group(0) for p in LOOKS_MEASURED for m in p.finditer(text)}
    return {re.sub(r"\s+", "", n).replace("-", "–").replace("倍", "×") for n in found}


def unknown(path: Path) -> list[str]:
    """The measured-looking numbers of a lesson's prose that are not known as a setting, arithmetic or citation."""
    lesson = path.name[:2]
    found = set().union(*map(numbers, prose(path)))
    return sorted(n for n in found if (lesson, n) not in KNOWN)


@pytest.mark.parametrize("path", lessons(), ids=lambda p: p.name)
def test_no_number_in_the_prose_is_copied_from_a_run(path):
    assert unknown(path) == [], (f"{path.name}: print these from the run instead, or say in KNOWN what they are "
                                 f"(a setting, arithmetic on settings, a citation)")


def test_a_figure_cited_from_benchmarks_readme_is_there():
    recorded = BENCHMARKS.read_text(encoding="utf-8")
    for (lesson, number), what in KNOWN.items():
        if what == RECORDED:
            assert re.search(rf"(?<![\d.]){re.escape(number.rstrip('×'))}(?![\d])", recorded), (lesson, number)


def test_the_sweep_finds_a_run_number_copied_into_prose():
    assert "0.77–0.96" in numbers("the model came to 0.77–0.96 of the measurement")
    assert numbers("α came back larger, 107 µs a step, and β 0.95 of the link") >= {"107µs", "0.95"}
    assert numbers("a 1 MiB unit 2–3 ms of forward") >= {"2–3ms"}
