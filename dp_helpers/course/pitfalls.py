"""Mistakes shown failing on purpose, safely, so a notebook can display and check the error (taught in notebooks 03 and 07)."""

from __future__ import annotations

import os
import subprocess

from dp_helpers.tool.launch.process import run_tree

SPAWN_CELL = '''import torch.multiprocessing as mp

def work(rank):
    print("hello from", rank)

mp.spawn(work, nprocs=2)
'''


def spawn_in_a_kernel(timeout: float = 120) -> str:
    """Run mp.spawn on a function defined in a fresh Jupyter kernel and return everything the cell printed."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(SPAWN_CELL)])
    # without pytest's marker in the environment the kernel captures its children's output, as in Jupyter
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True)
    client.execute(env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # the cell keeps its output
    parts = []
    for out in nb.cells[0].outputs:
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type == "error":
            parts.append(f"{out.ename}: {out.evalue}")
    return "".join(parts)


def fixed_port_in_use(timeout: float = 120) -> str:
    """Start torchrun on a fixed --master-port that another socket holds; return the error lines it prints."""
    import socket
    import sys

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))  # stands for another job, or a leftover process, on that port
        holder.listen()
        port = holder.getsockname()[1]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
               "--master-port", str(port), "-m", "dp_helpers.scripts.collectives_demo"]
        proc = run_tree(cmd, timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines = (proc.stdout + proc.stderr).splitlines()
    return "\n".join(ln for ln in lines if "EADDRINUSE" in ln or "already in use" in ln.lower())
