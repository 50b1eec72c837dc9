"""dp_helpers.course.show: the text a notebook puts on screen is the source that runs, with where it lives."""

import inspect

from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

from dp_helpers.course import show
from dp_helpers.scratch.collectives.ring import GlobalBatchNorm1d
from dp_helpers.tool.training import accumulate_step


def test_a_package_function_is_shown_with_its_file_and_line():
    text = show.source(accumulate_step)
    line = inspect.getsourcelines(accumulate_step)[1]
    assert text.startswith(f"# dp_helpers/tool/training.py, line {line}\ndef accumulate_step(")
    assert inspect.getsource(accumulate_step) in text


def test_a_method_is_dedented_and_torch_code_is_named_by_module():
    assert "\ndef forward(self, x" in show.source(GlobalBatchNorm1d.forward)
    torch_text = show.source(fp16_compress_hook)
    assert torch_text.startswith("# torch.distributed.algorithms.ddp_comm_hooks.default_hooks.fp16_compress_hook\n")


def test_files_and_several_objects(tmp_path):
    script = show.PACKAGE_ROOT / "dp_helpers" / "scripts" / "article_torchrun.py"
    assert show.source(script) == f"# dp_helpers/scripts/article_torchrun.py\n{script.read_text().rstrip()}\n"
    outside = tmp_path / "mine.py"
    outside.write_text("x = 1\n")
    assert show.source(outside, accumulate_step).startswith("# mine.py\nx = 1\n\n# dp_helpers/tool/training.py")


def test_show_returns_highlighted_code_for_jupyter():
    shown = show.show(accumulate_step)
    assert type(shown).__name__ == "Code" and "def accumulate_step(" in shown.data
    assert "<pre" in shown._repr_html_()


def test_a_diff_pairs_each_changed_line_with_its_counterpart():
    rows = show.paired(["    loss.backward()", "    order.manual_seed(0)", "    print(x)"],
                       ["    loss.backward()  # DDP averages here", "    sampler.set_epoch(0)", "    if rank == 0:",
                        "        print(x)"])
    assert rows[0] == ("    loss.backward()", "    loss.backward()  # DDP averages here", True)  # a comment added
    assert rows[1][:2] == ("    order.manual_seed(0)", "    sampler.set_epoch(0)")  # replaced: side by side
    assert ("", "    if rank == 0:", True) in rows and rows[-1][:2] == ("    print(x)", "        print(x)")


def test_a_diff_reads_as_a_unified_diff_outside_jupyter(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("x = 1\ny = 2\n")
    b.write_text("x = 1\ny = 3\n")
    diff = show.show_diff(a, b)
    assert "-y = 2\n+y = 3" in repr(diff) and "<mark>y = 3</mark>" in diff._repr_html_()
