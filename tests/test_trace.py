"""tool/trace.py: a profiler trace of one step read as compute, communication and exposed communication."""
import json

import pytest
import torch

from dp_helpers.tool.trace import merge, read_step


def write_trace(path, events):
    """A Chrome trace of complete events (ph X), times in µs, as torch.profiler exports one."""
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": n, "tid": tid, "ts": ts, "dur": dur}
                                                for n, tid, ts, dur in events]}))
    return path


def test_a_step_is_read_as_compute_communication_and_the_exposed_rest(tmp_path):
    events = [("forward", 1, 1000, 2000), ("aten::addmm", 1, 1100, 800), ("aten::mul", 1, 1500, 200),
              ("backward", 1, 3000, 9000), ("autograd::engine::evaluate_function: AddmmBackward0", 1, 3000, 4000),
              ("aten::mm", 1, 3100, 1000),  # inside the function: counted once
              ("c10d::allreduce_", 1, 5000, 10), ("link: all_reduce", 1, 5000, 6500),
              ("gloo:all_reduce", 7, 5000, 300),  # gloo's part: not drawn when the link's ranges are there
              ("aten::copy_", 1, 11000, 500)]  # the reducer's copy-back after the wait: not compute
    step = read_step(write_trace(tmp_path / "t.json", events))
    assert step.phases == {"forward": (0.0, 2.0), "backward": (2.0, 11.0)}
    assert step.compute == [(0.1, 0.9), (2.0, 6.0)]  # ms from the forward's start
    assert step.communication == [(4.0, 10.5)]
    assert step.exposed == (6.0, 11.0) and step.exposed_ms == pytest.approx(5.0)


def test_without_a_link_gloos_work_is_the_communication(tmp_path):
    events = [("forward", 1, 0, 10), ("backward", 1, 10, 100), ("autograd::engine::evaluate_function: X", 1, 10, 100),
              ("gloo:all_reduce", 7, 50, 40)]
    step = read_step(write_trace(tmp_path / "t.json", events))
    assert step.communication == [(0.05, 0.09)] and step.exposed is None  # all hidden under the backward


def test_a_trace_without_the_two_ranges_is_refused_in_one_sentence(tmp_path):
    with pytest.raises(ValueError, match="record_function\\('forward'\\)"):
        read_step(write_trace(tmp_path / "t.json", [("aten::mm", 1, 0, 10)]))


def test_merge_unites_nested_and_touching_intervals():
    assert merge([(3, 4), (0, 2), (1, 1.5), (2, 2.5), (5, 6)]) == [(0, 2.5), (3, 4), (5, 6)]


def test_a_transfer_on_the_emulated_link_is_a_range_in_a_running_profiler_trace(tmp_path):
    from torch.profiler import ProfilerActivity, profile, record_function

    from dp_helpers.tool.link import Wire

    class Arrived:
        def wait(self):
            return True

    wire = Wire()
    assert wire.send("all_reduce", 8, 0.0, Arrived(), ["sum"]).wait() == ["sum"]  # no profiler: the value, untraced
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("forward"):
            torch.ones(4).sum()
        with record_function("backward"):
            wire.send("all_reduce", 8, 0.05, Arrived(), [torch.zeros(1)]).wait()
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    (start, end), = read_step(tmp_path / "t.json").communication
    assert end - start >= 50  # ms: from the issue to the end of the modelled 0.05 s
