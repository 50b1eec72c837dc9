"""House rules checked on the code itself: no hard-coded devices or ports, no spawn, no import side effects, small pieces."""

import ast
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# the source article's script as the article wrote it, kept to be run and seen failing (notebook 03), and the
# helper that shows mp.spawn failing in a kernel: both break the rules on purpose
ON_PURPOSE = {"article_spawn.py", "pitfalls.py"}
CODE = sorted(p for p in (REPO / "dp_helpers").rglob("*.py") if p.name not in ON_PURPOSE)
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
# the skeletons of 07's capstone and 08's exercise 5 are examples/train_ddp_real.py and examples/train_fsdp.py as a
# learner receives them: take-home scripts in torch's own style (the device derived from torch.cuda.device_count(),
# main() whole), not the package's
TAKE_HOME = {"my_real_job.py", "my_fsdp.py"}
# plain torch on purpose, so torch's own device lines: notebook 03's fixed article script
PLAIN_TORCH = TAKE_HOME | {"article_torchrun.py"}


def notebook_code(path: Path, devices: bool = False) -> str:
    """A notebook's code cells without comments (prose may quote the source article's hard-coded devices)."""
    import nbformat

    cells = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    return "\n".join(re.sub(r"#.*$", "", src, flags=re.M) for src in cells
                     if not (devices and plain_torch_script(src)))


def plain_torch_script(cell: str) -> bool:
    """A %%writefile script in plain torch (no dp_helpers) that derives its GPU from torch.cuda.device_count()."""
    return cell.startswith("%%writefile") and "dp_helpers" not in cell and "torch.cuda.device_count()" in cell


def test_plain_torch_scripts_are_recognised():
    derived = '%%writefile a.py\nimport torch\nif torch.cuda.device_count() >= 2:\n    d = torch.device("cuda", 0)'
    assert plain_torch_script(derived)
    assert not plain_torch_script(derived.replace("device_count()", "is_available()"))
    assert not plain_torch_script(derived + "\nfrom dp_helpers.tool import dist")


def functions():
    for path in (p for p in CODE if p.name not in TAKE_HOME):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield path, node


# env.device_for is the single place that maps a backend to its device type
DEVICE_MAP = REPO / "dp_helpers" / "tool" / "env.py"


@pytest.mark.parametrize("path", CODE + NOTEBOOKS, ids=lambda p: p.name)
def test_no_hard_coded_device_port_or_spawn(path):
    text = path.read_text() if path.suffix == ".py" else notebook_code(path)
    devices = notebook_code(path, devices=True) if path.suffix != ".py" else "" if path.name in PLAIN_TORCH else text
    if path != DEVICE_MAP:
        assert not re.search(r"""["']cuda(:\d+)?["']""", devices), "derive the device, never write 'cuda'"
    assert not re.search(r"MASTER_PORT\s*[=:]\s*['\"]?\d", text), "no fixed port: use --standalone"
    assert not re.search(r"\bspawn\(|set_start_method\(", text), "launch scripts with run_ddp, never spawn or fork"
    assert "preexec_fn" not in text, "no Python between fork and exec: the parent may have threads"


def test_public_docstrings_are_one_line():
    offenders = [f"{p.name}:{n.name}" for p, n in functions()
                 if not n.name.startswith("_") and (not ast.get_docstring(n) or "\n" in ast.get_docstring(n).strip())]
    assert offenders == []


def test_functions_are_small():
    lengths = []
    for _, node in functions():
        if isinstance(node, ast.ClassDef):
            continue
        body = node.body[1:] if ast.get_docstring(node) else node.body
        lengths.append(body[-1].end_lineno - body[0].lineno + 1 if body else 0)
    assert statistics.median(lengths) <= 10 and max(lengths) <= 30


@pytest.mark.slow
def test_import_has_no_side_effects():
    """Importing every module starts no thread, seeds nothing, opens no pyplot figure and writes no file."""
    probe = """
import importlib, pkgutil, sys, threading, torch
torch.manual_seed(5); expected = torch.rand(1); torch.manual_seed(5)
threads = threading.active_count()
import dp_helpers
for m in pkgutil.walk_packages(dp_helpers.__path__, "dp_helpers."):
    importlib.import_module(m.name)
assert threading.active_count() == threads, "a thread was started"
assert torch.equal(torch.rand(1), expected), "the global RNG was touched"
assert "matplotlib.pyplot" not in sys.modules, "pyplot was imported"
print("clean")
"""
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO / "tests",
                          timeout=120)
    assert proc.stdout.strip() == "clean", proc.stderr


def test_the_package_has_no_import_circle():
    from tools.architecture import circles, import_graph

    graph = import_graph()
    assert sum(map(len, graph.values())) > len(graph)  # the walk finds the arrows there are
    assert not circles(graph), f"import circles: {circles(graph)}"


def test_the_repository_tools_have_no_import_circle():
    from tools.architecture import circles, import_graph

    graph = import_graph(sorted((REPO / "tools").glob("*.py")))
    assert graph["tools.notebooks"] >= {"tools.edition", "tools.repository"}  # the walk reads `from tools import`
    assert not circles(graph), f"import circles among tools/: {circles(graph)}"


def test_each_part_imports_only_the_parts_below_it():
    from tools.architecture import import_graph, part_arrows

    assert part_arrows(import_graph()) <= ALLOWED, sorted(part_arrows(import_graph()) - ALLOWED)


# scratch/ (what a learner reads) needs torch alone; the tool may draw the ring's schedule (plotting); the course's
# checkers use all three, their on-rank scripts the experiments' batches; scripts/ sit on top
ALLOWED = {("tool", "scratch"), ("course", "scratch"), ("course", "tool"), ("course", "scripts"), ("course", "root"),
           ("scripts", "scratch"), ("scripts", "tool"), ("root", "tool")}


@pytest.mark.slow
def test_a_train_request_is_checked_in_one_room_calling_down(tmp_path):
    # tools/architecture.py follows `train`'s arguments from the CLI until the launcher writes its run folder
    done = subprocess.run([sys.executable, str(REPO / "tools" / "architecture.py"), "--epochs", "2"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    walk = next(line for line in done.stdout.splitlines() if line.startswith("walk of"))
    assert "circles 0" in done.stdout and int(walk.split(" climbs")[0].rsplit(" ", 1)[1]) <= 2, done.stdout
    assert not (tmp_path / "runs").exists()  # it stopped before the run folder was made
