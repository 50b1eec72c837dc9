"""Put the real source of what a notebook runs on screen: a package function, a torch function, a script (every notebook).

The text comes from the file the running code was loaded from (`inspect.getsource`), so what a
learner reads is exactly what runs, and an edit to the package shows up the next time.
"""

from __future__ import annotations

import inspect
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
    if path.is_relative_to(PACKAGE_ROOT):
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
