"""The package's structure, measured: `python tools/architecture.py [train's flags, for the walk]`.

- rooms: the package's modules (a package's __init__.py is a room too; templates are data, not rooms);
- arrows: one module importing another, at its top or inside a function (a lazy import still ties the two);
- floors: a room's floor is one above the highest room it imports (a room importing none is on floor 0), so an
  arrow always points down; a circle (rooms importing one another) is counted and its rooms share a floor;
- the walk: the rooms of the functions called while the CLI checks a `train` request, from `cmd_train` until the
  launcher writes anything (its run folder, a checkpoint's lock) or starts torchrun. Each function counts at its
  first call (a check run once per flag counts once; comprehensions and lambdas are no functions here); a room
  called again right after itself is one stop, and a climb is a stop on a higher floor than the stop before it (a
  helper below has handed control back up).
"""

from __future__ import annotations

import argparse
import ast
import graphlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dp_helpers"
NOT_ROOMS = {"templates"}  # the exercises' starting files: copied for a learner, never imported


def module_name(path: Path) -> str:
    """dp_helpers/launch/agent.py -> dp_helpers.launch.agent (a package's __init__.py: the package)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room_files() -> list[Path]:
    """Every module of the package, templates left out."""
    return sorted(p for p in PACKAGE.rglob("*.py") if not NOT_ROOMS & set(p.relative_to(PACKAGE).parts))


def imported(path: Path, modules: set[str]) -> set[str]:
    """The package's modules a file imports, at its top or inside a function."""
    here, found = module_name(path), set()
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]) if node.level else ""
            base = ".".join(filter(None, (base, node.module)))
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found & modules - {here}


def import_graph(files: list[Path] | None = None) -> dict[str, set[str]]:
    """Room -> the rooms it imports (the package's rooms, or these files')."""
    files = room_files() if files is None else files
    modules = {module_name(p) for p in files}
    return {module_name(p): imported(p, modules) for p in files}


def part(room: str) -> str:
    """The part a room belongs to: scratch, course, tool, scripts, or root (the package itself and __main__)."""
    name = room.split(".")[1] if "." in room else "root"
    return "root" if name == "__main__" else name


def part_arrows(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(importing part, imported part) for every arrow between two parts."""
    return {(part(m), part(d)) for m, deps in graph.items() for d in deps if part(m) != part(d)}


def reach(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every room an import path from start leads to."""
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: groups of two or more rooms that reach one another."""
    reached = {m: reach(graph, m) for m in graph}
    groups = {tuple(sorted({m} | {o for o in reached[m] if m in reached[o]})) for m in graph}
    return sorted(list(g) for g in groups if len(g) > 1)


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """Room -> its floor: one above the highest room it imports; the rooms of a circle share theirs."""
    part = {m: m for m in graph}
    for group in circles(graph):
        part.update({m: group[0] for m in group})
    condensed: dict[str, set[str]] = {}
    for m, deps in graph.items():
        condensed.setdefault(part[m], set()).update(part[d] for d in deps if part[d] != part[m])
    level: dict[str, int] = {}
    for node in graphlib.TopologicalSorter(condensed).static_order():
        level[node] = 1 + max((level[d] for d in condensed[node]), default=-1)
    return {m: level[part[m]] for m in graph}


class Launched(Exception):
    """Raised where the launcher would write its run folder or start torchrun: the walk ends there."""


def trace_train(argv: list[str]) -> list[str]:
    """The rooms whose functions are called while `train` checks argv, until anything is written or started."""
    import os
    import subprocess

    sys.path.insert(0, str(ROOT))
    import importlib

    for room in import_graph():  # imported now, so that no module body runs during the walk
        importlib.import_module(room)
    from dp_helpers.tool import cli

    def stop(*args, **kwargs):
        raise Launched

    def creating(path, flags, *args, **kwargs):
        if flags & os.O_CREAT:  # a lock file, say
            raise Launched
        return real_open(path, flags, *args, **kwargs)

    # the first thing a launch writes is its run folder (or a checkpoint's lock); torchrun starts through Popen
    real_open = os.open
    Path.mkdir, os.makedirs, subprocess.Popen.__init__, os.open = stop, stop, stop, creating
    calls: list[str] = []
    seen: set = set()

    def profile(frame, event, arg):
        name = frame.f_globals.get("__name__", "")
        code = frame.f_code  # a comprehension's or lambda's frame (<listcomp>, <lambda>) is no function of a room
        if event == "call" and name.startswith("dp_helpers") and code not in seen and not code.co_name.startswith("<"):
            seen.add(code)
            calls.append(name)

    args = cli.build_parser().parse_args(["train", *argv])
    sys.setprofile(profile)
    try:
        cli.cmd_train(args)
    except (Launched, ValueError):  # ValueError: a check refused the request; the walk ends there
        pass
    finally:
        sys.setprofile(None)
    return [room for i, room in enumerate(calls) if i == 0 or calls[i - 1] != room]


def climbs(walk: list[str], level: dict[str, int]) -> int:
    """Stops on a higher floor than the stop before them."""
    return sum(level.get(b, 0) > level.get(a, 0) for a, b in zip(walk, walk[1:], strict=False))


def short(room: str) -> str:
    """A room's name without the package's."""
    return room.removeprefix("dp_helpers.") or room


def report(walk_argv: list[str]) -> str:
    """The numbers, and the walk room by room with each stop's floor."""
    graph = import_graph()
    level = floors(graph)
    walk = trace_train(walk_argv)
    lines = [f"rooms {len(graph)}, floors {max(level.values()) + 1}, arrows {sum(map(len, graph.values()))}, "
             f"circles {len(circles(graph))}" + "".join(f"\n  circle: {' <-> '.join(map(short, c))}"
                                                        for c in circles(graph)),
             f"walk of `train {' '.join(walk_argv)}`: {len(walk)} stops in {len(set(walk))} rooms, "
             f"{climbs(walk, level)} climbs back up",
             "  " + " -> ".join(f"{short(r)}({level.get(r, 0)})" for r in walk)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _, walk = parser.parse_known_args()  # every other word is a flag of train's, for the walk
    print(report(walk))


if __name__ == "__main__":
    main()
