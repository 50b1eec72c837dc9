"""What a launch echoes: a traceback as its exception line, a peer's disappearance as a consequence, nothing else hidden."""

from dp_helpers.tool.launch.console import Console, consequence


def echoed(lines: list[str]) -> list[str]:
    """The lines a Console shows of these worker lines."""
    console = Console.__new__(Console)  # only the folding state: no run folder, no log file
    console.folding = {}
    return [line for line in lines if console.shown(line)]


def test_a_traceback_shows_its_exception_line_and_nothing_else_is_hidden():
    lines = ["[rank 0/2] epoch 1 loss 0.5", "[rank 1/2] Traceback (most recent call last):",
             '[rank 1/2]   File "train.py", line 3, in <module>', "[rank 0/2] epoch 2 loss 0.4",
             "[rank 1/2]     boom()", "[rank 1/2] ValueError: boom", "[rank 1/2] ", "[rank 1/2] At:",
             "[rank 1/2]   hooks.py(31): <lambda>", "[rank 1/2] after the traceback"]
    assert echoed(lines) == ["[rank 0/2] epoch 1 loss 0.5", "[rank 0/2] epoch 2 loss 0.4", "[rank 1/2] ValueError: boom",
                             "[rank 1/2] after the traceback"]


def test_a_traceback_cut_off_by_a_stop_does_not_hide_what_the_rank_prints_next():
    lines = ["[rank 0/2] Traceback (most recent call last):", '[rank 0/2]   File "train.py", line 3',
             "[rank 0/2] restart 1: the group was started again", "[rank 0/2] epoch 2/3  loss=0.2"]
    assert echoed(lines) == lines[2:]


def test_an_error_from_a_peer_that_went_away_is_named_a_consequence():
    line = "[rank 0/2] RuntimeError: [pair.cc:537] Read error [127.0.0.1]:8889: Connection reset by peer. GLHF!"
    assert consequence(line) == ("[rank 0/2] RuntimeError: … Connection reset by peer (a consequence: a peer went away; "
                                 "console.log has it all)")
    assert consequence("[rank 0/2] ValueError: boom") == "[rank 0/2] ValueError: boom"
