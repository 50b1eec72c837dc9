"""The README's transcripts are what the commands print now: each equals the committed output of the notebook cell
that runs the same job (the committed notebooks come from one clean run, and those cells assert what their lines say),
or the CLI's own output."""

import ast
import re
from pathlib import Path

import nbformat

from dp_helpers.tool.cli import main as cli_main

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
README_ZH = (REPO / "README.zh-CN.md").read_text()
PRACTICE = nbformat.read(REPO / "notebooks" / "07_real_jobs.ipynb", as_version=4)


def cell_output(needle: str) -> list[str]:
    """The printed lines of the one code cell whose source holds needle (a peer's 'closed' read as 'reset')."""
    cells = [c for c in PRACTICE.cells if c.cell_type == "code" and needle in c.source]
    assert len(cells) == 1, needle
    text = "".join(o.get("text", "") for o in cells[0].outputs if o.output_type == "stream")
    return raced(text).splitlines()


def raced(text: str) -> str:
    """A transcript with the one word that depends on timing made one: whether the peer's socket was reset or closed."""
    return re.sub(r"Connection (closed|reset) by peer", "Connection reset by peer", text)


def block_after(text: str, marker: str) -> list[str]:
    """The lines of the first code block after the marker."""
    return text.split(marker, 1)[1].split("```\n", 1)[1].split("```", 1)[0].splitlines()


def steady(lines: list[str]) -> list[str]:
    """The lines every run prints: rank 0's lost-connection line appears only when it sees the loss before torchrun
    stops it."""
    return [line for line in lines if "(a consequence: a peer went away" not in line]


def test_the_restart_transcript_is_the_notebooks_run():
    rest = README.split("--checkpoint digits.pt --max-restarts 1 --fail-at 2:1\n", 1)[1].split("```", 1)[0]
    shown = [line for line in rest.splitlines() if line.startswith("[rank ")]  # the command's own block
    ran = [line for line in cell_output("max_restarts=1") if line.startswith("[rank ")]
    assert steady(shown) == steady(ran) and len(steady(shown)) >= 5


def test_the_lost_connection_line_is_what_the_console_prints_for_a_gloo_reset():
    from dp_helpers.tool.launch.console import consequence

    said = [line for line in README.splitlines() if "(a consequence: a peer went away" in line]
    gloo = "[rank 0/2] RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error: Connection reset by peer"
    assert said and set(said) == {consequence(gloo)}


def test_the_failure_transcript_is_the_notebooks_run_in_both_readmes():
    ran = cell_output('fail_at="2:1", **digits)')  # every line of the error but the run folder's path
    for text in (README, README_ZH):
        block = block_after(text, '"status": "failed"')
        errors = [line.removeprefix("error: ") for line in block if not line.startswith("[rank ")]
        # whether rank 0 had died of the lost connection by the time torchrun looked is a race: a line either way
        leading = [line for line in errors[:-1] if not line.endswith("(a consequence)")]
        assert leading == [line for line in ran if not line.endswith("(a consequence)")] and len(leading) >= 2
        assert errors[-1].startswith("every rank's full output and tracebacks: ")
        attempt = cell_output("max_restarts=1")  # the same job's first attempt, up to the fault
        assert all(line in attempt for line in steady(block) if line.startswith("[rank ")) and block[0].startswith("[rank ")


def test_the_refusal_transcript_is_what_the_cli_prints(capsys):
    block = block_after(README, "Bad input stops before anything starts")
    assert block[0].startswith("$ python -m dp_helpers train ")
    assert cli_main(block[0].removeprefix("$ python -m dp_helpers ").split()) == 2
    assert capsys.readouterr().err.splitlines() == block[1:]


def test_the_digits_transcript_is_the_notebooks_run_in_both_readmes():
    from dp_helpers.tool.cli import build_parser
    from dp_helpers.tool.config import TrainConfig, config_from_args

    source = next(c.source for c in PRACTICE.cells if c.cell_type == "code" and c.source.startswith("digits = {"))
    ran = TrainConfig(batch_size=10, **ast.literal_eval(source.splitlines()[0].split("=", 1)[1].strip()))
    epochs = [line for line in cell_output("max_restarts=1") if "] epoch " in line]  # bitwise an uninterrupted run's
    for text in (README, README_ZH):
        command, *shown = block_starting(text, "$ python -m dp_helpers train --data digits --epochs")
        args = build_parser().parse_args(command.split()[4:])  # the README's flags, left-out ones as the CLI fills them
        assert config_from_args(args) == ran and shown == epochs


def block_starting(text: str, first: str) -> list[str]:
    """The lines of the code block whose first line starts with first."""
    return (first + text.split("```\n" + first, 1)[1].split("```", 1)[0]).splitlines()
