"""What a launch echoes: whole lines, a traceback as its exception line, a peer's disappearance as a consequence."""

from dp_helpers.tool.launch.console import Console, Rejoin, consequence


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


def test_a_line_torchrun_read_in_two_parts_is_one_line_again():
    # print() writes "first" and "\n" apart; torchrun's tail can read between them and prefix each part
    rejoin = Rejoin(world_size=2)
    assert rejoin("[rank 0/2] first[rank 1/2] hello\n") == ["[rank 1/2] hello\n"]
    assert rejoin("[rank 0/2] \n") == ["[rank 0/2] first\n"]
    assert rejoin("[rank 1/2] a[rank 1/2] b[rank 1/2] c\n") == ["[rank 1/2] abc\n"]


def test_rejoining_leaves_other_lines_alone_and_ends_an_unended_line():
    rejoin = Rejoin(world_size=2)
    assert rejoin("torchrun: [rank 0/2] chatter\n") == ["torchrun: [rank 0/2] chatter\n"]
    assert rejoin("[rank 0/2] says [rank 0/4] is another run\n") == ["[rank 0/2] says [rank 0/4] is another run\n"]
    assert rejoin("[rank 1/2] no newline at the end") == []
    assert rejoin.rest() == ["[rank 1/2] no newline at the end\n"] and rejoin.rest() == []
