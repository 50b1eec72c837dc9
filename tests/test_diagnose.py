"""Failure diagnosis on canned inputs: the agent's records, torchrun's printed table (with and without error files), signals, victims."""

import json

import pytest
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from dp_helpers.tool.launch.agent import failure_records
from dp_helpers.tool.launch.diagnose import (
    DistributedRunError,
    Failure,
    culprit_first,
    failure,
    parse_table,
)

ENTRY = """[{idx}]:
  time      : 2026-11-30_18:40:01
  host      : box
  rank      : {rank} (local_rank: {rank})
  exitcode  : {code} (pid: {pid})
  error_file: {error_file}
  traceback : {traceback}"""


def table(root: str, others: list[str]) -> str:
    """torchrun's ChildFailedError summary around the given entries."""
    bar, line = "=" * 60, "-" * 60
    failures = "\n".join(others) if others else "  <NO_OTHER_FAILURES>"
    return (f"torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n{bar}\nworker.py FAILED\n{line}\n"
            f"Failures:\n{failures}\n{line}\nRoot Cause (first observed failure):\n{root}\n{bar}\n")


def error_file(tmp_path, rank: int, message: str) -> str:
    """An error file as @record writes it."""
    path = tmp_path / f"error{rank}.json"
    path.write_text(json.dumps({"message": {"message": message, "extraInfo": {"py_callstack": "...", "timestamp": "1"}}}))
    return str(path)


def records(tmp_path, *rows: dict) -> None:
    """A failures.json as the agent writes it."""
    (tmp_path / "failures.json").write_text(json.dumps(list(rows)))


def test_records_name_the_rank_that_raised(tmp_path):
    records(tmp_path, {"rank": 0, "exit_code": -15, "signal": "SIGTERM", "exception": "", "timestamp": 5},
            {"rank": 1, "exit_code": 1, "signal": "", "exception": "ValueError: boom", "timestamp": 5})
    err = failure(1, "[rank 1/2] Traceback ...\n", tmp_path)
    assert err.ranks == (1, 0) and err.exit_code == 1 and err.cause == "ValueError: boom"
    lines = str(err).splitlines()
    assert lines[:2] == ["rank 1 failed with exit code 1: ValueError: boom", "then rank 0 was stopped by torchrun (SIGTERM)"]
    assert lines[2] == f"every rank's full output and tracebacks: {tmp_path / 'console.log'}" and len(lines) == 3


def test_records_win_over_the_printed_table(tmp_path):
    records(tmp_path, {"rank": 1, "exit_code": 1, "exception": "KeyError: 'x'"})
    log = table(ENTRY.format(idx=0, rank=0, code=1, pid=9, error_file="<N/A>", traceback="To enable traceback see: x"), [])
    assert failure(1, log, tmp_path).ranks == (1,)


def test_table_with_an_error_file(tmp_path):
    root = ENTRY.format(idx=0, rank=1, code=1, pid=11, error_file=error_file(tmp_path, 1, "RuntimeError: from the file"),
                        traceback="Traceback (most recent call last):\n    File \"worker.py\", line 3")
    other = ENTRY.format(idx=1, rank=0, code=-15, pid=10, error_file="<N/A>",
                         traceback="Signal 15 (SIGTERM) received by PID 10")
    found = parse_table(table(root, [other]))
    assert found == [Failure(1, 1, "RuntimeError: from the file"), Failure(0, -15, "", "SIGTERM")]


def test_table_without_error_files_takes_the_exception_from_the_ranks_output(tmp_path):
    root = ENTRY.format(idx=0, rank=1, code=1, pid=11, error_file="<N/A>",
                        traceback="To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html")
    log = "[rank 1/2] Traceback (most recent call last):\n[rank 1/2] ZeroDivisionError: division by zero\n"
    err = failure(1, log + table(root, []), tmp_path)
    assert err.ranks == (1,) and err.cause == "ZeroDivisionError: division by zero"


def test_a_signal_death_is_named_and_shows_the_ranks_last_lines(tmp_path):
    records(tmp_path, {"rank": 0, "exit_code": -15, "signal": "SIGTERM"}, {"rank": 1, "exit_code": -11, "signal": "SIGSEGV"})
    err = failure(1, "[rank 1/2] last words\n[rank 0/2] waiting\n" + "torchrun chatter\n" * 50, tmp_path)
    assert err.ranks == (1, 0) and "exit code -11: killed by SIGSEGV" in str(err)
    assert "rank 1's last lines: last words\n" in str(err) and len(str(err).splitlines()) <= 5


def test_a_rank_that_exited_with_its_own_code_is_named_with_its_last_lines(tmp_path):
    records(tmp_path, {"rank": 0, "exit_code": 1, "exception": "RuntimeError: Connection reset by peer"},
            {"rank": 1, "exit_code": 2})
    err = failure(1, "[rank 1/2] train.py: error: unrecognized arguments: yes\n", tmp_path)
    assert str(err).startswith("rank 1 failed with exit code 2: exited without an exception (sys.exit")
    assert "rank 1's last lines: train.py: error: unrecognized arguments: yes" in str(err) and "signal" not in str(err)


def test_a_rank_that_died_of_its_peer_comes_second(tmp_path):
    records(tmp_path, {"rank": 0, "exit_code": 1, "exception": "RuntimeError: Connection closed by peer", "timestamp": 4},
            {"rank": 1, "exit_code": 1, "exception": "ValueError: the real one", "timestamp": 5})
    err = failure(1, "", tmp_path)
    assert err.ranks == (1, 0) and "then rank 0 lost its connection to a failed peer (a consequence)" in str(err)


def test_a_lone_rank_that_lost_its_peers_points_at_a_collective_only_some_ranks_call(tmp_path):
    records(tmp_path, {"rank": 0, "exit_code": 1, "exception": "RuntimeError: Connection closed by peer"})
    assert "a collective that only some ranks call, inside `if rank == 0:`?" in str(failure(1, "", tmp_path))


def test_a_timeout_says_the_hung_rank_may_be_another(tmp_path):
    records(tmp_path, {"rank": 0, "exit_code": 1, "exception": "DistBackendError: Timed out waiting 5000ms"})
    assert "the hung rank may be another one" in str(failure(1, "", tmp_path))


def test_no_failure_reported(tmp_path):
    err = failure(3, "rendezvous failed\n", tmp_path)
    assert isinstance(err, DistributedRunError) and err.ranks == () and err.exit_code == 3
    assert str(err).startswith("torchrun exited with code 3 before any rank reported a failure; last output:\nrendezvous")


@pytest.mark.parametrize("found, first", [
    ([Failure(0, -9, signal="SIGKILL"), Failure(1, -6, signal="SIGABRT")], 1),  # a crash beats a stop
    ([Failure(0, -11, signal="SIGSEGV"), Failure(1, 1, "ValueError: x")], 1),  # an exception beats a crash
    ([Failure(0, 1, "E: a", timestamp=7), Failure(1, 1, "E: b", timestamp=6)], 1),  # then the earlier one
    ([Failure(0, 1, timestamp=1), Failure(1, 1, "ValueError: real", timestamp=5)], 1),  # no known cause comes later
    ([Failure(0, -6, signal="SIGABRT", timestamp=1), Failure(1, -6, "ValueError: x", "SIGABRT", 5)], 1),  # aborted after raising
    ([Failure(0, 1, "RuntimeError: Connection refused", timestamp=1), Failure(1, -6, "ValueError: x", "SIGABRT", 5)], 1),
    # a rank killed from outside (the OOM killer, --fail-at): its peer's "reset by peer" is the consequence
    ([Failure(0, 1, "RuntimeError: Read error: Connection reset by peer", timestamp=3), Failure(1, -9, signal="SIGKILL", timestamp=3)], 1),
    ([Failure(0, -15, signal="SIGTERM", timestamp=2), Failure(1, -9, signal="SIGKILL", timestamp=2)], 1),
    ([Failure(0, -9, signal="SIGKILL", timestamp=2), Failure(1, 1, "ValueError: x", timestamp=2)], 1),  # escalation
    # sys.exit(3) on rank 1 is its own decision; rank 0's lost connection, though earlier, is the consequence
    ([Failure(0, 1, "RuntimeError: Connection reset by peer", timestamp=1), Failure(1, 3, timestamp=2)], 1),
])
def test_culprit_order(found, first):
    assert culprit_first(found)[0].rank == first


def test_agent_turns_torchruns_failures_into_records(tmp_path):
    raised = ProcessFailure(local_rank=0, pid=100, exitcode=1, error_file=error_file(tmp_path, 0, "ValueError: boom"))
    killed = ProcessFailure(local_rank=1, pid=101, exitcode=-11, error_file=str(tmp_path / "none.json"))
    rows = failure_records({3: killed, 2: raised})
    assert [(r["rank"], r["exit_code"], r["signal"], r["exception"]) for r in rows] == [
        (2, 1, "", "ValueError: boom"), (3, -11, "SIGSEGV", "")]
    json.dumps(rows)  # JSON-ready


def test_an_exception_found_in_the_log_keeps_its_timestamp(tmp_path):
    records(tmp_path, {"rank": 0, "exit_code": 1, "timestamp": 9}, {"rank": 1, "exit_code": 1, "timestamp": 3})
    log = "[rank 0/2] KeyError: 'a'\n[rank 1/2] KeyError: 'b'\n"
    assert failure(1, log, tmp_path).ranks == (1, 0)  # both raised: the earlier one first


@pytest.mark.parametrize("out, words", [
    ("", "the output folder is an empty string"),
    ("used", "exists and is not empty"),  # e.g. '.', or a folder an earlier failed run left its failures.json in
])
def test_a_launch_writes_only_into_a_new_or_empty_folder(tmp_path, write_script, out, words):
    from dp_helpers.tool.launch.command import plan_launch
    from dp_helpers.tool.request import UsageError

    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "failures.json").write_text("[]")
    (tmp_path / "empty").mkdir()
    target = out if out == "" else tmp_path / out
    with pytest.raises(UsageError, match=words):
        plan_launch(write_script("print(1)"), (), 2, "gloo", target, 60, 1, 0, None, None, None)
    assert plan_launch(write_script("print(1)"), (), 2, "gloo", tmp_path / "empty", 60, 1, 0, None, None, None)


def test_several_nodes_are_diagnosed_together(tmp_path):
    from dp_helpers.tool.launch.nodes import across_nodes

    for node, rows in (("node0", [{"rank": 0, "exit_code": 1, "exception": "RuntimeError: Connection closed by peer"}]),
                       ("node1", [{"rank": 3, "exit_code": 1, "exception": "ValueError: on node 1"}])):
        (tmp_path / node).mkdir()
        records(tmp_path / node, *rows)
    (tmp_path / "node0" / "console.log").write_text("[rank 0/4] ...\n")
    err = across_nodes(DistributedRunError("node 0's view", ranks=(0,), exit_code=1), tmp_path)
    assert err.ranks == (3, 0) and err.cause == "ValueError: on node 1"


def test_torchrun_stopped_from_outside_is_said_in_one_sentence(tmp_path):
    log = ("torch.distributed.elastic.multiprocessing.api.SignalException: Process 4242 got signal: 15\n")
    err = failure(1, log, tmp_path, found=[])
    assert str(err).startswith("torchrun itself was stopped by SIGTERM from outside") and "no rank failed" in str(err)


@pytest.mark.parametrize("line, listing", [
    ("Extension modules: psutil._psutil_linux, numpy._core._multiarray_umath, torch._C (total: 3)", True),
    (", torch._C, torch._C._dynamo.autograd_compiler, torch._C._fft", True),  # a long line that arrived cut
    ("numpy._core._multi", True),
    ("last words before the crash", False), ("Fatal Python error: Segmentation fault", False),
    ("loss=0.5, acc=0.9", False), ("a, b", False), ("done.", False)])
def test_faulthandlers_module_list_is_not_taken_for_a_ranks_last_words(line, listing):
    from dp_helpers.tool.launch.diagnose import MODULE_LIST

    assert bool(MODULE_LIST.fullmatch(line)) == listing
