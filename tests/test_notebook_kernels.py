"""How the suite runs notebooks: each in one kernel, in order (conftest.py's guard says so when not, instead of
NameErrors), and at torch's default thread count, as in a learner's JupyterLab."""

import importlib.util
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import nbformat
import pytest
from nbval.kernel import CURRENT_ENV_KERNEL_NAME, start_new_kernel

from dp_helpers.tool.env import cpu_cores
from tests.conftest import REPO

# the repository's root conftest.py, by path: the name "conftest" may already be tests/conftest.py's
spec = importlib.util.spec_from_file_location("root_conftest", REPO / "conftest.py")
root = importlib.util.module_from_spec(spec)
spec.loader.exec_module(root)


def chained_notebook(path, cells: int):
    """Each cell needs the variable the cell above it defined: run anywhere else, it raises a NameError."""
    code = ["x0 = 0"] + [f"x{i} = x{i - 1} + 1" for i in range(1, cells)]
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in code]), path)


def fake_cell(config, path, name):
    return SimpleNamespace(config=config, path=path, name=name, cell={})


def test_the_guard_names_the_cells_that_ran_elsewhere():
    config = SimpleNamespace(stash={root.CELL_ORDER: {"nb": ["Cell 0", "Cell 1", "Cell 2"]}, root.RAN_HERE: {}})
    assert root.cells_missing_before(fake_cell(config, "nb", "Cell 0")) == []
    assert root.cells_missing_before(fake_cell(config, "nb", "Cell 2")) == ["Cell 1"]  # Cell 1 ran on another worker
    assert root.cells_missing_before(fake_cell(config, "nb", "Cell 1")) == []


@pytest.mark.long
@pytest.mark.slow
def test_a_notebook_split_over_two_workers_fails_loudly(tmp_path):
    shutil.copy(REPO / "conftest.py", tmp_path)
    shutil.copy(REPO / "pyproject.toml", tmp_path)  # the suite's own options (nbval, xdist), then --dist load on top
    chained_notebook(tmp_path / "chain.ipynb", cells=12)
    out = subprocess.run([sys.executable, "-m", "pytest", "chain.ipynb", "--dist", "load", "-o", "testpaths=."],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120).stdout
    assert "runs in a kernel that has not run" in out and "--dist loadfile" in out, out[-3000:]
    assert "NameError" not in out, out[-3000:]


@pytest.mark.slow
def test_notebook_kernels_keep_torchs_default_threads():
    """nbval's kernels inherit this environment: no thread setting may hide a check that depends on the threads."""
    if cpu_cores() < 2:
        pytest.skip(f"a learner's default of several threads needs >= 2 cores; this machine has {cpu_cores()}")
    manager, client = start_new_kernel(kernel_name=CURRENT_ENV_KERNEL_NAME)  # as --nbval-current-env does
    printed = []
    try:
        client.execute_interactive("import torch; print(torch.get_num_threads())", timeout=60,
                                   output_hook=lambda msg: printed.append(msg["content"].get("text", "")))
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    default = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                             env={k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")},
                             capture_output=True, text=True, check=True).stdout
    kernel, default = int("".join(printed)), int(default)
    assert kernel == default >= 2, (f"notebook kernels compute with {kernel} thread(s), a learner's with torch's "
                                    f"default {default}: run the suite without *_NUM_THREADS set")
