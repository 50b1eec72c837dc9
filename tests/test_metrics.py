"""dp_helpers.tool.metrics: round trip, non-finite values, truncated and malformed lines, the progress tail."""

import json
import math

import pytest

from dp_helpers.tool.metrics import MetricsFormatError, MetricsTail, MetricsWriter, read_metrics
from dp_helpers.tool.request import UsageError


def write_run(run_dir, world_size=2, steps=3):
    for rank in range(world_size):
        with MetricsWriter(run_dir, rank, world_size) as w:
            for step in range(steps):
                w.log(epoch=0, step=step, loss=1.0 / (step + 1) + rank, samples=4)


def test_round_trip_all_ranks(tmp_path):
    write_run(tmp_path)
    records = read_metrics(tmp_path)
    assert [(r["step"], r["rank"]) for r in records] == [(s, r) for s in range(3) for r in range(2)]
    assert records[0] == {**records[0], "rank": 0, "world_size": 2, "epoch": 0, "loss": 1.0, "samples": 4}
    assert all(r["time"] >= 0 for r in records)


def test_non_finite_loss_is_valid_json_and_comes_back(tmp_path):
    with MetricsWriter(tmp_path, 0, 1) as w:
        for step, loss in enumerate([0.5, math.nan, math.inf, -math.inf]):
            w.log(epoch=0, step=step, loss=loss, samples=1)
    lines = (tmp_path / "metrics" / "rank0.jsonl").read_text().splitlines()
    assert all(json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c}")) for line in lines)
    losses = [r["loss"] for r in read_metrics(tmp_path)]
    assert losses[0] == 0.5 and math.isnan(losses[1]) and losses[2:] == [math.inf, -math.inf]


def test_writer_never_overwrites(tmp_path):
    write_run(tmp_path, world_size=1)
    with pytest.raises(FileExistsError):
        MetricsWriter(tmp_path, 0, 1)
    assert len(read_metrics(tmp_path)) == 3


def test_truncated_last_line_is_skipped_with_a_warning(tmp_path):
    write_run(tmp_path, world_size=1)
    path = tmp_path / "metrics" / "rank0.jsonl"
    path.write_text(path.read_text() + '{"rank": 0, "world_size": 1, "ep')
    with pytest.warns(UserWarning, match=r"rank0.jsonl, line 4: truncated last line"):
        assert len(read_metrics(tmp_path)) == 3


@pytest.mark.parametrize("bad, words", [
    ("not json", "line 2: not valid JSON"),
    ("[1, 2]", "line 2: expected a JSON object"),
    ('{"rank": 0}', "line 2: missing world_size, epoch, step, loss, samples, time"),
    ('{"rank": 0, "world_size": 1, "epoch": 0, "step": 9, "loss": "abc", "samples": 1, "time": 0}',
     "line 2: loss must be a number, got 'abc'"),
    ('{"rank": 0, "world_size": 1, "epoch": 0, "step": 9, "loss": null, "samples": 1, "time": 0}',
     "line 2: loss must be a number, got None"),
])
def test_malformed_middle_line_names_file_and_line(tmp_path, bad, words):
    write_run(tmp_path, world_size=1)
    path = tmp_path / "metrics" / "rank0.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], bad, *lines[1:]]) + "\n")
    with pytest.raises(MetricsFormatError, match="rank0.jsonl, " + words.replace("(", r"\(").replace("[", r"\[")):
        read_metrics(tmp_path)


def test_missing_run_folder(tmp_path):
    with pytest.raises(UsageError, match="run folder not found"):
        read_metrics(tmp_path / "nope")


def test_tail_counts_complete_lines_only(tmp_path):
    path = tmp_path / "m.jsonl"
    tail = MetricsTail(path)
    assert tail.new_lines() == 0
    path.write_text('{"a": 1}\n{"a": 2}\n{"a"')
    assert tail.new_lines() == 2
    with path.open("a") as f:
        f.write(': 3}\n')
    assert tail.new_lines() == 1 and tail.new_lines() == 0
