"""Check, re-execute, time or translate the lessons: `python tools/notebooks.py check | execute | times | translate`.

`execute` runs each notebook top to bottom on this machine (CPU is fine) in the current Python
environment, writes the outputs back and strips volatile metadata; then it builds the notebook's Chinese
edition and runs it too (its figures and checkers speak Chinese). Figures are saved as SVG: vector, so that
they stay sharp when the site's reader zooms in on a phone. `check` verifies what CI needs:
one clean top-to-bottom run (execution counts 1..n), no error outputs, under 2 MB, the skeleton's
headings present, and each Chinese edition built from its English notebook's current cells.
`translate` builds the Chinese editions (NN_name.zh-CN.ipynb) from the English notebooks and
i18n/zh-CN/ (tools/edition.py); `translate --skeleton` first adds, in English, the blocks a
translation lacks. Each command takes English notebooks, all of them by default.
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import sys
import textwrap
from pathlib import Path

import nbformat

try:
    from tools import edition, repository
except ImportError:  # run as a script: tools/ is on sys.path, not the repository
    import edition
    import repository

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
MAX_BYTES = 2_000_000
SKELETON = ("What you'll learn", "Takeaways", "Exercises")
VOLATILE_NB = ("widgets",)
VOLATILE_CELL = ("execution", "collapsed", "scrolled")


def problems(path: Path) -> list[str]:
    """Everything wrong with one committed notebook, as short sentences."""
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    counts, errors = edition.unclean_run(code)
    found = counts + errors
    widgets = [i for i, c in enumerate(code, 1) if any(WIDGET_VIEW in o.get("data", {}) for o in c.outputs)]
    if widgets:
        found.append(f"widget outputs (frozen at their first frame) in code cells {widgets}")
    if path.stat().st_size > MAX_BYTES:
        found.append(f"{path.stat().st_size // 1000} kB, over the {MAX_BYTES // 1_000_000} MB limit")
    first = nb.cells[0].source if nb.cells else ""
    if not (nb.cells and nb.cells[0].cell_type == "markdown" and first.startswith("# ")):
        found.append("the first cell is not a '# Title' markdown cell")
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    found += [f"no '{heading}' section" for heading in SKELETON if heading not in text]
    return found + stale_listings(code) + elsewhere(nb) + pointer_problems(nb, path)


def pointer_problems(nb, path: Path) -> list[str]:
    """A lesson's second cell must be the link to its Chinese edition, saying what that edition is."""
    if path not in edition.english_notebooks():
        return []
    want = edition.CHINESE_POINTER.format(name=edition.edition_of(path).name)
    got = nb.cells[1].source if len(nb.cells) > 1 else ""
    return [] if got == want else [f"its second cell is not the link to its Chinese edition: {want!r}"]


def elsewhere(nb) -> list[str]:
    """Cells whose Colab/Kaggle links or clone disagree with pyproject.toml's repository and branch."""
    where = repository.home()
    cells = [i for i, c in enumerate(nb.cells) if repository.stamp(c.source, where) != c.source]
    return [f"cells {cells} point at another repository or branch than pyproject.toml's: run python "
            "tools/repository.py"] if cells else []


LISTING = re.compile(r"^# (\S+?)(?:, line (\d+))?$", re.M)  # show()'s head of each part: a path in the repo or torch's name
OURS = ("dp_helpers/", "examples/", "solutions/", "benchmarks/", "tools/")


def stale_listings(code: list) -> list[str]:
    """The show() listings of this repository's files that no longer match those files (the run is older than them)."""
    found = []
    for i, cell in enumerate(code, 1):
        for out in cell.outputs:
            shown = out.get("data", {}).get("text/plain", "") if out.output_type in ("display_data", "execute_result") else ""
            found += [f"code cell {i} shows {where} as it was: re-execute the notebook" for where in stale_parts(shown)]
    return found


def stale_parts(shown: str) -> list[str]:
    """Each '# path[, line N]' part of a listing whose lines differ from the file now (a missing file counts)."""
    heads, stale = list(LISTING.finditer(shown)), []
    for head, after in zip(heads, [*heads[1:], None][:len(heads)], strict=True):
        if not head.group(1).startswith(OURS):
            continue  # torch's own source: it changes with the installed version, not with this repository
        lines = shown[head.end():after.start() if after else len(shown)].strip("\n").splitlines()
        path = NOTEBOOKS.parent / head.group(1)
        if not path.is_file():
            stale.append(head.group(1))
            continue
        start = int(head.group(2) or 1) - 1
        current = path.read_text(encoding="utf-8").splitlines()[start:start + len(lines)]
        if textwrap.dedent("\n".join(current)).rstrip() != "\n".join(lines).rstrip():
            stale.append(f"{head.group(1)}" + (f", line {head.group(2)}" if head.group(2) else ""))
    return stale


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def strip_volatile(nb) -> None:
    """Drop what changes on every run (timings, widget state) and live widgets, whose saved text is their first frame."""
    for key in VOLATILE_NB:
        nb.metadata.pop(key, None)
    for cell in nb.cells:
        for key in VOLATILE_CELL:
            cell.metadata.pop(key, None)
        if cell.cell_type == "code":  # a progress bar saved as a widget shows "0%" forever on GitHub
            cell.outputs = [o for o in cell.outputs if WIDGET_VIEW not in o.get("data", {})]


def exercise_starts() -> list:
    """Every function that copies an exercise's template beside the notebook (start_*_exercise)."""
    from dp_helpers.course.checkers import capstone, fsdp_check, script_check

    return [f for m in (script_check, capstone, fsdp_check) for name, f in vars(m).items()
            if re.fullmatch(r"start_\w+_exercise", name) and f.__module__ == m.__name__]


def fresh_exercise_files(folder: Path) -> None:
    """Remove the files the exercises copy from their templates, so a committed run starts from the templates."""
    for start in exercise_starts():  # a file left there is kept by the start (a learner's work), and checked instead
        (folder / inspect.signature(start).parameters["path"].default).unlink(missing_ok=True)


# the kernel's own start-up warnings (ipykernel >= 7 logs one about TCP transport) stay out of the cells; figures
# are kept as SVG, whose text matplotlib draws as outlines: sharp at any zoom, Chinese without a font on the reader's side
KERNEL_ARGS = ["--IPKernelApp.log_level=ERROR", "--InlineBackend.figure_formats=svg"]


def execute(path: Path, timeout: int = 1200) -> None:
    """Run one notebook top to bottom in its folder with this Python and write it back."""
    from nbclient import NotebookClient

    fresh_exercise_files(path.parent)
    nb = nbformat.read(path, as_version=4)
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}  # Agg (the tests' choice) would draw no figure
    NotebookClient(nb, timeout=timeout, kernel_name="python3", extra_arguments=KERNEL_ARGS,
                   resources={"metadata": {"path": str(path.parent)}}).execute(env=env)
    strip_volatile(nb)
    nbformat.write(nb, path)


def execute_both(path: Path) -> int:
    """Run an English lesson, build its Chinese edition and run that too; 1 where the translation stops the build."""
    print(f"executing {path.name} ...", flush=True)
    execute(path)
    if path not in edition.english_notebooks():
        return 0  # not a lesson: no edition
    problems = edition.translate([path])[path.name]
    if problems:
        print(*problems, f"{path.name}: its Chinese edition is not built, so not executed", sep="\n")
        return 1
    print(f"executing {edition.edition_of(path).name} ...", flush=True)
    execute(edition.edition_of(path))
    edition.stamp_run(edition.edition_of(path))
    return 0


READING_WPM, CODE_LINES_PER_MIN = 150, 12  # a learner's pace, for the route's estimates
MIN_PER_QUESTION, MIN_PER_CODE_EXERCISE = 3, 12  # an answer to compute; code to write, run and fix
# minutes the counts miss: 00's side-by-side diff of two scripts, 07's capstone (four functions, not one)
EXTRA_MINUTES = {"00": 7, "07": 15}
DEEP_DIVE = "deep dive, optional"  # in parentheses, ends the heading of a section, subsection or exercise a first reading skips
PART = re.compile(r"^(#{2,3} |\*\*(?:Exercise )?\d+\b)", re.M)  # a section, a subsection, an exercise


def parts(cells) -> list[tuple[bool, list]]:
    """The notebook cut at its headings and exercises: (deep dive?, the text and code under it), in order."""
    out: list[tuple[bool, list]] = [(False, [])]
    section = False  # inside a deep-dive section, its subsections and exercises are deep dives too
    for cell in cells:
        if cell.cell_type == "code":
            out[-1][1].append(cell)
            continue
        pieces = PART.split(cell.source)
        out[-1][1].append(nbformat.v4.new_markdown_cell(pieces[0]))
        for mark, text in zip(pieces[1::2], pieces[2::2], strict=True):
            deep = DEEP_DIVE in (text.splitlines() or [""])[0]
            section = deep if mark.startswith("## ") else section
            out.append((deep or section, [nbformat.v4.new_markdown_cell(mark + text)]))
    return out


def without_notes(cell):
    """A markdown cell without its folded <details> notes (any other cell as it is)."""
    if cell.cell_type != "markdown":
        return cell
    return nbformat.v4.new_markdown_cell(re.sub(r"<details[^>]*>.*?</details>", " ", cell.source, flags=re.S))


def cost(cells) -> tuple[float, int, int]:
    """Reading minutes, questions and code exercises of some cells."""
    words = sum(len(c.source.split()) for c in cells if c.cell_type == "markdown")
    lines = sum(len(c.source.splitlines()) for c in cells if c.cell_type == "code")
    asks = [c.source for c in cells if c.cell_type == "code" and re.search(r"^(check_|start_)\w+\(", c.source, re.M)]
    code = sum(bool(re.search(r"raise NotImplementedError|^start_\w+_exercise\(", a, re.M)) for a in asks)
    questions = sum(bool(re.search(r"^check_answer\(|^check_\w+_prediction\(", a, re.M)) for a in asks)
    return words / READING_WPM + lines / CODE_LINES_PER_MIN, questions, code


def minutes(path: Path) -> dict:
    """A notebook's minutes for a learner (running excluded): reading, with the exercises, and its core alone."""
    cut = parts(nbformat.read(path, as_version=4).cells)
    every = [c for _, cells in cut for c in cells]
    core = [without_notes(c) for deep, cells in cut if not deep for c in cells]  # a first reading skips notes
    extra, whole = EXTRA_MINUTES.get(path.name[:2], 0), cost(every)
    return {"reading": round(whole[0]), "with exercises": round(with_exercises(*whole) + extra),
            "core, with its exercises": round(with_exercises(*cost(core)) + extra)}


def with_exercises(reading: float, questions: int, code: int) -> float:
    """Reading minutes plus the exercises'."""
    return reading + questions * MIN_PER_QUESTION + code * MIN_PER_CODE_EXERCISE


def main(argv: list[str] | None = None) -> int:
    """CLI: check (exit 1 on any problem) or execute."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("check", "execute", "times", "translate"))
    parser.add_argument("notebooks", nargs="*", type=Path)
    parser.add_argument("--skeleton", action="store_true", help="translate: first add the missing blocks, in English")
    args = parser.parse_intermixed_args(argv)  # `translate --skeleton NOTEBOOK` as well as `translate NOTEBOOK --skeleton`
    paths = [p.resolve() for p in args.notebooks] or edition.english_notebooks()
    if args.command == "translate":
        return translate(paths, args.skeleton)
    if args.command == "execute":
        return max([execute_both(path) for path in paths], default=0)
    if args.command == "times":
        for path in paths:
            print(path.name, minutes(path))
        return 0
    bad = {p.name: problems(p) for p in paths}
    for name, found in bad.items():
        for problem in found:
            print(f"{name}: {problem}")
    zh = edition.stale_editions([p for p in paths if p in edition.english_notebooks()])  # the course's lessons
    print(*zh, sep="\n") if zh else None
    print(f"{len(paths)} notebook(s) checked, {sum(map(bool, bad.values()))} with problems; "
          f"{len(zh)} problem(s) with their Chinese editions")
    return 1 if any(bad.values()) or zh else 0


def translate(paths: list[Path], add_skeleton: bool) -> int:
    """The translate command: build every Chinese edition that can be built; list what stops the others."""
    if add_skeleton:
        for path in paths:
            print(f"{path.name}: {edition.skeleton(path)} block(s) added to {edition.rel(edition.translation_of(path))}")
    found = edition.translate(paths)
    for problem in (p for problems in found.values() for p in problems):
        print(problem)
    built = [name for name, problems in found.items() if not problems]
    print(f"{len(paths)} notebook(s): {len(built)} Chinese edition(s) built, {len(paths) - len(built)} not")
    return 1 if len(built) < len(paths) else 0


if __name__ == "__main__":
    sys.exit(main())
