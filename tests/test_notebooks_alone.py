"""Every notebook, English and Chinese, run top to bottom on its own in a fresh copy of the checkout.

The suite's notebook run (nbval) executes them one after another in this checkout, where an earlier notebook may
leave a folder or a file behind that a later one needs; a learner on Colab or Kaggle opens one notebook in a fresh
clone. Each test here copies the checkout's files (what git tracks, and new files it does not ignore: no runs/, no
build/) into a new folder and runs one notebook there in a new kernel. About 5 minutes for all 22 on 2 cores with
2 workers: it runs only with --notebooks-alone, which .ci/run passes.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))

pytestmark = [pytest.mark.slow, pytest.mark.alone]


def checkout_files(root: Path) -> list[str]:
    """The checkout's files a fresh clone would hold (with new files not yet committed), relative to root."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root, capture_output=True,
                            check=True).stdout.decode()
    return [name for name in listed.split("\0") if name and (root / name).is_file()]


def fresh_copy(root: Path, into: Path) -> Path:
    """A copy of the checkout's files in `into`, as a fresh clone would have them."""
    for name in checkout_files(root):
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, into / name)
    return into


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_notebook_runs_alone_in_a_fresh_copy(name, tmp_path):
    from nbclient import NotebookClient

    copy = fresh_copy(ROOT, tmp_path / "checkout")
    assert not (copy / "notebooks" / "runs").exists()  # nothing an earlier notebook left
    path = copy / "notebooks" / name
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3", extra_arguments=["--IPKernelApp.log_level=ERROR"],
                   resources={"metadata": {"path": str(path.parent)}}).execute()  # raises at the first failing cell
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, errors
