"""How the lessons read, measured: `python tools/prose.py` prints the table.

`--check` also exits 1 where a target is missed. English: the sentences of a notebook's markdown
prose, in words. Code blocks, tables, headings, HTML lines and list markers are left out; a sentence
ends at . ! or ? before a space and a capital, a digit or a quote. Chinese: the sentences end at
。！？ and count in characters (inline code counts as one). Text inside <details> … </details> is a
note: a first reading may skip it. Machinery: the names a notebook's code takes from dp_helpers
outside dp_helpers.scratch (launching, recording, checking, plotting, showing); what
dp_helpers.scratch holds is the lesson's subject and counts apart. A module's attributes count as
names; a private name starts with "_".
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = dict(
    en_median=16,
    en_over40=0.03,
    en_max=60,
    zh_median=30,
    zh_over80=0.03,
    words=2200,
    words_notes=800,
    zh_chars=3500,
    zh_chars_notes=1300,
    readme_lines=150,
    machinery=30,
    machinery_per_notebook=12,
)
NOTE = re.compile(r"<details[^>]*>(.*?)</details>", flags=re.S)


@dataclass
class Reading:
    """One notebook, measured."""

    name: str
    zh: bool
    size: int  # words (English) or Chinese characters outside the notes
    notes: int  # the same inside them
    lengths: list[int]  # every sentence's length, notes included
    machinery: set[str]
    taught: set[str]


def split_notes(md: str) -> tuple[str, str]:
    """(the main text, the text of its collapsed <details> notes)."""
    return NOTE.sub(" ", md), "\n\n".join(NOTE.findall(md))


def prose_of(md: str) -> str:
    """Markdown's sentences: no code, tables, headings, HTML, list markers; a link as its text."""
    md = re.sub(r"```.*?```|<summary>.*?</summary>", " ", md, flags=re.S)
    lines = []
    for line in md.splitlines():
        text = line.strip()
        skip = not text or text.startswith(("|", "#", "[![", "<"))
        lines.append("" if skip else re.sub(r"^([-*]|\d+\.)\s+", "", text))
    return re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", "\n".join(lines))


def en_sentences(text: str) -> list[int]:
    """The length in words of each English sentence (three words or more)."""
    lengths = []
    for paragraph in re.split(r"\n\s*\n", text):
        for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z0-9`*(\"'])", " ".join(paragraph.split())):
            lengths.append(len(re.findall(r"[\w'’.-]+", sentence)))
    return [n for n in lengths if n >= 3]


def zh_sentences(text: str) -> list[int]:
    """The length in characters of each Chinese sentence (six or more), inline code as one."""
    lengths = []
    for paragraph in re.split(r"\n\s*\n", text):
        for sentence in re.split(r"(?<=[。！？])", "".join(paragraph.split())):
            lengths.append(len(re.sub(r"`[^`]*`", "X", sentence)))
    return [n for n in lengths if n >= 6]


def imported_names(code: str) -> dict[str, str]:
    """Each name the code imports from dp_helpers, and the module it comes from."""
    origin = {}
    for match in re.finditer(r"from\s+(dp_helpers[\w.]*)\s+import\s+\(?([^\n)]*)", code):
        for name in match.group(2).split(","):
            name = name.split("#")[0].strip().split(" as ")[-1].strip()
            if name and name != "*":
                origin[name] = match.group(1)
    for match in re.finditer(r"import\s+(dp_helpers[\w.]*)\s+as\s+(\w+)", code):
        origin[match.group(2)] = match.group(1)
    return origin


def course_names(code: str) -> tuple[set[str], set[str]]:
    """(machinery, taught): the course's names the code uses, a module's as module.attribute."""
    machinery, taught = set(), set()
    for name, module in imported_names(code).items():
        uses = set(re.findall(rf"\b{re.escape(name)}\.([A-Za-z_]\w*)", code))
        is_module = bool(uses) and name.islower() and not re.search(rf"\b{re.escape(name)}\(", code)
        bucket = taught if f"{module}.{name}".startswith("dp_helpers.scratch") else machinery
        bucket.update(
            {f"{name}.{use}" for use in uses if not use.startswith("__")} if is_module else {name}
        )
    return machinery, taught


def measure(path: Path) -> Reading:
    """A notebook's prose and course names."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    md = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    main, notes = (prose_of(part) for part in split_notes(md))
    zh = path.name.endswith(".zh-CN.ipynb")
    unit = r"[\u4e00-\u9fff]" if zh else r"[\w'’-]+"
    lengths = (zh_sentences if zh else en_sentences)(main + "\n\n" + notes)
    return Reading(
        path.name,
        zh,
        len(re.findall(unit, main)),
        len(re.findall(unit, notes)),
        lengths,
        *course_names(code),
    )


def spread(lengths: list[int], long: int) -> tuple[float, int, int, float]:
    """(median, 90th percentile, longest, share over `long`) of sentence lengths."""
    if not lengths:
        return 0.0, 0, 0, 0.0
    ordered = sorted(lengths)
    share = sum(n > long for n in ordered) / len(ordered)
    return statistics.median(ordered), ordered[int(0.9 * (len(ordered) - 1))], ordered[-1], share


def row(r: Reading) -> str:
    """One notebook's line of the table."""
    long, unit = (80, "chars") if r.zh else (40, "words")
    median, p90, longest, over = spread(r.lengths, long)
    return (
        f"{r.name:44} {unit} {r.size:5d} notes {r.notes:4d}  median {median:4.1f} p90 {p90:3d} "
        f"max {longest:3d} over{long} {over:5.1%}  machinery {len(r.machinery):2d}"
    )


def misses(r: Reading) -> list[str]:
    """What a notebook misses of the targets, one line each."""
    t, (median, _, longest, over) = TARGETS, spread(r.lengths, 80 if r.zh else 40)
    if r.zh:
        checks = [
            (median > t["zh_median"], f"median sentence {median} characters"),
            (over > t["zh_over80"], f"{over:.1%} of sentences over 80 characters"),
            (r.size > t["zh_chars"], f"{r.size} characters outside notes"),
            (r.notes > t["zh_chars_notes"], f"{r.notes} characters in notes"),
        ]
    else:
        checks = [
            (median > t["en_median"], f"median sentence {median} words"),
            (over > t["en_over40"], f"{over:.1%} of sentences over 40 words"),
            (longest > t["en_max"], f"a sentence of {longest} words"),
            (r.size > t["words"], f"{r.size} words outside notes"),
            (r.notes > t["words_notes"], f"{r.notes} words in notes"),
            (len(r.machinery) > t["machinery_per_notebook"], f"{len(r.machinery)} machinery names"),
        ]
    return [f"{r.name}: {why}" for missed, why in checks if missed]


def totals(readings: list[Reading]) -> tuple[list[str], list[str]]:
    """(the lines under the table, what the whole course misses)."""
    lines, missed = [], []
    for zh, unit, long in ((False, "words", 40), (True, "characters", 80)):
        part = [r for r in readings if r.zh == zh]
        median, p90, longest, over = spread([n for r in part for n in r.lengths], long)
        lines.append(
            f"{'Chinese' if zh else 'English'}: {unit} {sum(r.size for r in part)}, in notes "
            f"{sum(r.notes for r in part)}; median {median} p90 {p90} max {longest} "
            f"over{long} {over:.1%}"
        )
    english = [r for r in readings if not r.zh]
    machinery = set().union(*(r.machinery for r in english))
    private = sorted(
        n
        for n in machinery | set().union(*(r.taught for r in english))
        if n.split(".")[-1].startswith("_")
    )
    lines.append(
        f"course names in the English notebooks' code: machinery {len(machinery)}, private "
        f"{len(private)} {' '.join(private)}".rstrip()
    )
    missed += (
        [f"{len(machinery)} machinery names in all"]
        if len(machinery) > TARGETS["machinery"]
        else []
    )
    missed += [f"private names in notebook code: {', '.join(private)}"] if private else []
    return lines, missed


def readme_lines(root: Path) -> tuple[list[str], list[str]]:
    """(each README's length, the READMEs over the target)."""
    lines, missed = [], []
    for name in ("README.md", "README.zh-CN.md"):
        count = len((root / name).read_text(encoding="utf-8").splitlines())
        lines.append(f"{name}: {count} lines")
        missed += [f"{name}: {count} lines"] if count > TARGETS["readme_lines"] else []
    return lines, missed


def main(argv: list[str] | None = None) -> int:
    """Print the table; with --check, exit 1 and list every target missed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 where a target is missed")
    parser.add_argument(
        "--root", type=Path, default=ROOT, help="the repository (default: this one)"
    )
    args = parser.parse_args(argv)
    readings = [measure(p) for p in sorted((args.root / "notebooks").glob("[0-9]*.ipynb"))]
    under, course_missed = totals(readings)
    readmes, readme_missed = readme_lines(args.root)
    print("\n".join([row(r) for r in readings] + under + readmes))
    missed = [m for r in readings for m in misses(r)] + course_missed + readme_missed
    if args.check and missed:
        print("\n".join(["", f"{len(missed)} target(s) missed:", *missed]))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
