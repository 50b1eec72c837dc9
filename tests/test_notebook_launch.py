"""run_ddp inside a real Jupyter kernel: worker lines reach the cell, two launches at once do not clash."""

import json
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.slow


def test_worker_lines_reach_the_notebook_cell(write_script, tmp_path):
    """Under pytest the kernel does not capture child file descriptors: the launcher must re-print."""
    script = write_script("import os\nprint('hello from', os.environ['RANK'], flush=True)\n")
    cell = (f"from dp_helpers.tool.launch import run_ddp\n"
            f"result = run_ddp({str(script)!r}, world_size=2, out_dir={str(tmp_path / 'run')!r}, progress=1)\n"
            f"print('returncode', result.returncode)")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)])
    NotebookClient(nb, timeout=180, kernel_name="python3").execute()
    text = "".join(o.get("text", "") for o in nb.cells[0].outputs if o.output_type == "stream")
    assert "[rank 0/2] hello from 0" in text and "[rank 1/2] hello from 1" in text
    assert "returncode 0" in text


@pytest.mark.long
def test_two_trainings_at_once(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-m", "dp_helpers", "train", "--epochs", "1", "--world-size", "1",
                               "--out", str(tmp_path / f"run{i}")], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    for i in range(2):
        assert json.loads((tmp_path / f"run{i}" / "summary.json").read_text())["steps"] == 10
