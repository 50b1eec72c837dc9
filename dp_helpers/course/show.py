"""Put the real source of what a notebook runs on screen: a package function, a torch function, a script (every notebook).

The text comes from the file the running code was loaded from (`inspect.getsource`), so what a
learner reads is exactly what runs, and an edit to the package shows up the next time.
"""

from __future__ import annotations

import difflib
import html
import inspect
import itertools
import textwrap
from pathlib import Path

import dp_helpers

PACKAGE_ROOT = Path(dp_helpers.__file__).resolve().parent.parent


def where(obj) -> str:
    """Where `obj` lives: a path inside this repository, or torch's dotted module name."""
    if isinstance(obj, (str, Path)):
        path = Path(obj).resolve()
        return str(path.relative_to(PACKAGE_ROOT)) if path.is_relative_to(PACKAGE_ROOT) else path.name
    module = inspect.getmodule(obj)
    path = Path(inspect.getsourcefile(obj)).resolve()
    # the repository's code by its path; torch's by its name, also from a virtual environment inside the repository
    if path.is_relative_to(PACKAGE_ROOT) and "site-packages" not in path.parts:
        return f"{path.relative_to(PACKAGE_ROOT)}, line {inspect.getsourcelines(obj)[1]}"
    return f"{module.__name__}.{getattr(obj, '__qualname__', '')}".rstrip(".")


def source(*objs) -> str:
    """The source of each function, class, module or .py file, each under a '# where' line."""
    parts = []
    for obj in objs:
        is_file = isinstance(obj, (str, Path))
        text = Path(obj).read_text(encoding="utf-8") if is_file else textwrap.dedent(inspect.getsource(obj))
        parts.append(f"# {where(obj)}\n{text}")
    return "\n\n".join(part.rstrip() for part in parts) + "\n"


def show(*objs):
    """Display the source of each object, syntax-highlighted in Jupyter (plain text elsewhere)."""
    from IPython.display import Code

    return Code(source(*objs), language="python")


def paired(left: list[str], right: list[str], similar: float = 0.5) -> list[tuple[str, str, bool]]:
    """Changed lines side by side: a line next to its most similar counterpart (in order), the rest zipped between."""
    def code(line: str) -> str:
        """The line without its comment."""
        return line.split("  #")[0].strip()  # a comment added to a line does not make it another line

    def zipped(a: list[str], b: list[str]) -> list[tuple[str, str, bool]]:
        """Unmatched lines, side by side."""
        return [(x, y, True) for x, y in itertools.zip_longest(a, b, fillvalue="")]

    rows, j, alone = [], 0, []
    for line in left:
        ratios = [difflib.SequenceMatcher(None, code(line), code(other)).ratio() for other in right[j:]]
        best = max(range(len(ratios)), key=ratios.__getitem__, default=None)
        if best is None or ratios[best] < similar:
            alone.append(line)
            continue
        rows += zipped(alone, right[j:j + best]) + [(line, right[j + best], True)]
        alone, j = [], j + best + 1
    return rows + zipped(alone, right[j:])


class SideBySide:
    """Two files' changed lines next to each other (HTML in Jupyter), a unified diff everywhere else."""

    def __init__(self, left: Path, right: Path, context: int = 1):
        self.names = (where(left), where(right))
        self.lines = [Path(p).read_text(encoding="utf-8").splitlines() for p in (left, right)]
        self.context = context

    def rows(self) -> list[tuple[str, str, bool]]:
        """(left line, right line, changed) for every changed line and its context; ('⋯', '⋯', False) between."""
        a, b = self.lines
        rows = []
        for group in difflib.SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(self.context):
            rows += [("⋯", "⋯", False)] if rows else []
            for tag, i1, i2, j1, j2 in group:
                rows += [(x, x, False) for x in a[i1:i2]] if tag == "equal" else paired(a[i1:i2], b[j1:j2])
        return rows

    def _repr_html_(self) -> str:
        cell = '<td style="text-align:left;white-space:pre-wrap;font-family:monospace;font-size:85%">{}</td>'
        # classes for a narrow screen (the site's course.css): a changed row shows both lines, one under the other
        body = "".join(f'<tr class="{"changed" if changed else "same"}">' + "".join(
            cell.format(f"<mark>{html.escape(t)}</mark>" if changed and t else html.escape(t)) for t in (x, y))
            + "</tr>" for x, y, changed in self.rows())
        head = "".join(f"<th style='text-align:left'>{html.escape(n)}</th>" for n in self.names)
        return f'<table class="course-diff"><tr class="names">{head}</tr>{body}</table>'

    def __repr__(self) -> str:
        return "\n".join(difflib.unified_diff(*self.lines, *self.names, n=self.context, lineterm=""))


def show_diff(left, right, context: int = 1) -> SideBySide:
    """Display what changes from the file `left` to the file `right`, side by side (notebook 00)."""
    return SideBySide(Path(left), Path(right), context)
