"""dp_helpers.tool.launch.elastic and examples/train_elastic.py: a job on two torchrun agents loses one, goes on with
one, takes it back, and ends with the weights one process reaches with the same global batch."""

import os
import re
import subprocess
import sys

import pytest
import torch

from dp_helpers.tool.launch.elastic import agent_command, run_elastic
from tests.conftest import REPO

SCRIPT = REPO / "examples" / "train_elastic.py"


def test_every_node_runs_one_plain_torchrun_line_with_a_range_of_nodes():
    line = agent_command(SCRIPT, ["--steps", "5"], 3, "127.0.0.1:1234", 2)
    assert line[1:3] == ["-m", "torch.distributed.run"] and line[-2:] == ["--steps", "5"]
    assert {"--nnodes": "1:3", "--max-restarts": "2", "--rdzv-endpoint": "127.0.0.1:1234"}.items() <= \
        dict(zip(line[3::2], line[4::2], strict=False)).items()


def test_a_run_that_cannot_shrink_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(ValueError, match="nodes >= 2"):
        run_elastic(SCRIPT, nodes=1, out_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def elastic_settings() -> list[str]:
    """The settings the agents' line changes from torch's defaults, as `key=value` or `--flag value`."""
    line = agent_command(SCRIPT, [], 2, "HOST:PORT", 1)
    conf = line[line.index("--rdzv-conf") + 1].split(",")
    return [*conf, f"--monitor-interval {line[line.index('--monitor-interval') + 1]}"]


@pytest.mark.parametrize("name", ["11_training_that_keeps_going.ipynb", "11_training_that_keeps_going.zh-CN.ipynb"])
def test_notebook_11_states_the_rendezvous_settings_the_agents_run_with(name):
    import nbformat

    prose = " ".join(c.source for c in nbformat.read(REPO / "notebooks" / name, as_version=4).cells
                     if c.cell_type == "markdown")
    assert [s for s in elastic_settings() if s not in prose] == []


def test_the_take_home_scripts_command_line_states_the_same_settings():
    docstring = " ".join(SCRIPT.read_text().split('"""')[1].split())  # its lines joined
    assert [s for s in elastic_settings() if s not in docstring] == []


def test_notebook_11_shows_the_quorum_the_new_group_the_healing_and_the_agents_line():
    import nbformat

    code = " ".join(c.source for c in nbformat.read(REPO / "notebooks" / "11_training_that_keeps_going.ipynb",
                                                    as_version=4).cells if c.cell_type == "code")
    shown = set(re.findall(r"show\(([^)]*)\)", code))
    names = {name.strip() for call in shown for name in call.split(",")}
    assert {"Quorum.meet", "Quorum.wait_for", "Replica.join", "Replica.heal", "agent_command"} <= names


def segments(printed: str) -> list[tuple[int, int, int]]:
    """(first step, last step, world size) of each stretch rank 0 announced."""
    return [(int(a), int(b), int(w)) for a, b, w in re.findall(r"steps (\d+)-(\d+) on (\d+) ranks", printed)]


@pytest.mark.long
@pytest.mark.slow
def test_a_killed_node_costs_one_step_and_the_job_ends_as_one_process_would(tmp_path):
    run = run_elastic(SCRIPT, "--steps", "40", "--step-seconds", "0.25", "--out", "final.pt", kill_after_step=8,
                      out_dir=tmp_path / "elastic")
    printed = run.output(0) + run.output(1)
    starts = sorted(segments(printed))
    assert [w for _, _, w in starts] == [2, 1, 2], starts  # two nodes, one, two again
    done = [int(s) for s in re.findall(r"step (\d+)/40 on 1 ranks", printed)]
    assert starts[1][0] == min(done) <= 9  # resumed right after the last step saved: step 8, or 9 if 9 was saved
    # each agent counts its own restarts: the survivor's workers were restarted once for the failure and not
    # again to let the node back in; the node started again is a new agent that has restarted nothing
    def restarts(node):
        return re.findall(r"restarted its workers (\d+) times", run.output(node))

    assert restarts(0) == ["0", "1", "1"] and restarts(1) == ["0", "0"], (restarts(0), restarts(1))
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    one = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                          str(SCRIPT), "--steps", "40", "--checkpoint", "one.pt", "--out", "one-final.pt"], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert one.returncode == 0, one.stderr[-2000:]
    torch.testing.assert_close(torch.load(run.run_dir / "final.pt"), torch.load(tmp_path / "one-final.pt"))
