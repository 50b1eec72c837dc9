"""dp_helpers.tool.plotting: returns the Axes, draws the weighted mean, refuses empty runs, marks non-finite losses."""

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from dp_helpers.tool.metrics import MetricsWriter  # noqa: E402
from dp_helpers.tool.plotting import mean_curve, plot_loss_curves, save_loss_figure  # noqa: E402


def make_run(folder, losses_by_rank, samples_by_rank=None):
    for rank, losses in enumerate(losses_by_rank):
        with MetricsWriter(folder, rank, len(losses_by_rank)) as w:
            for step, loss in enumerate(losses):
                w.log(epoch=0, step=step, loss=loss, samples=(samples_by_rank or [4] * 9)[rank])
    return folder


def test_mean_is_sample_weighted(tmp_path):
    run = make_run(tmp_path, [[1.0, 0.5], [0.0, 0.5]], samples_by_rank=[3, 1])
    ax = plot_loss_curves(run)
    mean_line = [ln for ln in ax.get_lines() if ln.get_linewidth() == 2][0]
    assert list(mean_line.get_ydata()) == [0.75, 0.5]
    assert mean_curve([{"step": 0, "loss": 2.0, "samples": 1}, {"step": 0, "loss": 0.0, "samples": 3}]) == ([0], [0.5])
    plt.close("all")


def test_uses_given_axes_and_compares_runs(tmp_path):
    a = make_run(tmp_path / "a", [[1.0, 0.8]])
    b = make_run(tmp_path / "b", [[0.9, 0.7], [0.9, 0.6]])
    fig, ax = plt.subplots()
    assert plot_loss_curves([a, b], ax=ax, per_rank=False) is ax
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["a (mean of 1 ranks)", "b (mean of 2 ranks)"]
    plt.close(fig)


def test_empty_run_says_so(tmp_path):
    (tmp_path / "metrics").mkdir()
    with pytest.raises(ValueError, match="no metric records; did training run 0 steps"):
        plot_loss_curves(tmp_path)
    plt.close("all")


def test_non_finite_loss_is_warned_and_marked(tmp_path):
    run = make_run(tmp_path, [[1.0, 0.5, math.nan, math.inf, 0.2]])
    with pytest.warns(UserWarning, match="non-finite loss at 2 step"):
        ax = plot_loss_curves(run, per_rank=False)
    marks = [ln for ln in ax.get_lines() if ln.get_marker() == "x"]
    assert len(marks) == 1 and list(marks[0].get_xdata()) == [2, 3]
    mean_line = [ln for ln in ax.get_lines() if ln.get_linewidth() == 2][0]
    assert mean_line.get_marker() == "o"  # the isolated 0.2 after the gap is drawn as a point
    plt.close("all")


def test_save_loss_figure_opens_no_pyplot_figure(tmp_path):
    run = make_run(tmp_path / "r", [[1.0, 0.9, 0.8]])
    before = plt.get_fignums()
    path = save_loss_figure(run, tmp_path / "loss.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plt.get_fignums() == before


def test_bucket_sweep_labels_the_default_cap():
    from dp_helpers.tool.plotting import plot_bucket_sweep

    rows = [{"bucket_cap_mb": None, "allreduces_per_step": 2.0, "step_seconds": 0.03},
            {"bucket_cap_mb": 0.25, "allreduces_per_step": 6.0, "step_seconds": 0.02}]
    ax = plot_bucket_sweep(rows)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["default", "0.25"]
    assert [p.get_height() for p in ax.patches] == [2.0, 6.0]
    plt.close("all")


def test_bucket_sweep_draws_a_line_per_wrapper():
    from dp_helpers.tool.plotting import plot_bucket_sweep

    rows = [{"bucket_cap_mb": 1.0, "allreduces_per_step": 2.0, "step_seconds": {"MiniDDP": 0.02, "DDP": 0.01}}]
    ax = plot_bucket_sweep(rows)
    right = ax.figure.axes[1]
    assert [line.get_label().split(" (")[0] for line in right.get_lines()] == ["MiniDDP", "DDP"]
    assert [line.get_ydata()[0] for line in right.get_lines()] == [20.0, 10.0]  # ms
    plt.close("all")


def test_memory_bars_stack_the_three_parts_in_kib():
    from dp_helpers.tool.plotting import plot_memory_per_rank

    held = {"DDP": {"parameters": 1024, "gradients": 1024, "optimizer state": 2048},
            "ZeRO-3": {"parameters": 512, "gradients": 512, "optimizer state": 1024}}
    ax = plot_memory_per_rank(held, {"DDP": held["DDP"], "ZeRO-3": {"parameters": 1024, "gradients": 0,
                                                                   "optimizer state": 0}})
    assert [round(p.get_height(), 3) for p in ax.patches[:6]] == [1.0, 0.5, 1.0, 0.5, 2.0, 1.0]
    assert [round(p.get_y(), 3) for p in ax.patches][4:6] == [2.0, 1.0]  # state on top of parameters + gradients
    frames = [p for p in ax.patches[6:] if not p.get_fill()]  # the formula's totals, drawn as frames
    assert [round(p.get_height(), 3) for p in frames] == [4.0, 1.0]
    assert [t.get_text() for t in ax.texts] == ["4 = formula", "2\n(formula 1)"]  # a disagreement is written out
    plt.close("all")


def test_times_against_the_baseline_are_ratios_per_link_with_the_model_as_crosses():
    from dp_helpers.tool.plotting import plot_vs_baseline

    measured = {"loopback": {"ddp": 2.0, "fp16": 1.0, "local": 4.0}, "slow": {"ddp": 10.0, "fp16": 5.0, "local": 2.0}}
    predicted = {"slow": {"ddp": 8.0, "fp16": 6.0, "local": 2.0}}  # no crosses over loopback: nothing predicted there
    ax = plot_vs_baseline(measured, predicted)
    assert [round(p.get_height(), 3) for p in ax.patches] == [0.5, 0.5, 2.0, 0.2]  # fp16 on each link, then local
    crosses = [line for line in ax.get_lines() if line.get_marker() == "x"]
    assert [list(line.get_ydata()) for line in crosses] == [[0.75], [0.25]]
    assert [list(line.get_xdata()) for line in crosses] == [[0.8], [1.2]]  # on the slow link's bars
    assert [t.get_text() for t in ax.get_xticklabels()] == ["loopback", "slow"]
    assert "ddp" in ax.get_ylabel()
    plt.close("all")


def test_plot_run_colours_ranks_apart_and_draws_epoch_means(tmp_path):
    from matplotlib.figure import Figure

    from dp_helpers.tool.metrics import MetricsWriter
    from dp_helpers.tool.plotting import epoch_means, plot_run

    for rank in range(2):
        with MetricsWriter(tmp_path, rank, 2) as w:
            for step in range(4):
                w.log(epoch=step // 2, step=step, loss=1.0 + rank + step, samples=10)
    ax = plot_run(tmp_path, ax=Figure().subplots(), title="2 x gloo")
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == ["rank 0", "rank 1", "mean of 2 ranks", "epoch mean"] and ax.get_title() == "2 x gloo"
    assert ax.get_lines()[0].get_color() != ax.get_lines()[1].get_color()
    from dp_helpers.tool.metrics import read_metrics

    assert epoch_means(read_metrics(tmp_path)) == ([1, 3], [2.0, 4.0])  # (1+2+2+3)/4 and (3+4+4+5)/4


def test_log_axes_are_labelled_at_the_measured_values():
    from dp_helpers.tool.plotting import plot_bandwidth, plot_efficiency_vs_batch

    ax = plot_efficiency_vs_batch({"batch_sweep": [{"batch": 64, "efficiency_vs_ceiling_2": 0.4},
                                                   {"batch": 512, "efficiency_vs_ceiling_2": 0.8}]})
    assert [t.get_text() for t in ax.get_xticklabels()] == ["64", "512"] and not ax.get_xticklabels(minor=True)
    rows = [{"bytes": n, "busbw_all_reduce_GBps": 1.0, "busbw_ring_GBps": 1.0, "world_size": 2} for n in (2**16, 2**18, 2**20, 3 * 2**19, 2**24)]
    labels = [t.get_text() for t in plot_bandwidth({"allreduce": rows}).get_xticklabels()]
    assert labels == ["64 KiB", "256 KiB", "1 MiB", "1.5 MiB", "16 MiB"]
    plt.close("all")


def test_the_backward_timeline_has_a_compute_row_and_one_label_per_layer():
    from dp_helpers.tool.plotting import plot_backward_timeline

    events = [{"kind": "gradient ready", "name": f"{layer}.{p}", "start": t}
              for layer, t in (("2", 0.001), ("0", 0.003)) for p in ("weight", "bias")]
    events += [{"kind": "all-reduce", "name": "bucket 0", "start": 0.0015, "end": 0.004, "bytes": 2**20}]
    ax = plot_backward_timeline(events)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["backward (compute)", "gradients ready", "bucket 0"]
    assert [t.get_text() for t in ax.texts if t.get_text().startswith("layer")] == ["layer 2", "layer 0"]
    assert round(ax.patches[0].get_width(), 6) == 3.0  # compute: from 0 to the last gradient, in ms
    plt.close("all")


def test_the_zero_stages_picture_shards_one_more_part_per_stage():
    from dp_helpers.tool.plotting import plot_zero_stages

    ax = plot_zero_stages(4)
    kept = [p for p in ax.patches if p.get_facecolor()[3] > 0]  # the coloured bars, a frame behind each
    widths = [round(p.get_width(), 3) for p in kept]
    assert len(kept) == 4 * 4 * 3 and widths.count(0.225) == 4 * (1 + 2 + 3)  # stage s shards s of the 3 parts
    assert [p.get_x() for p in kept if p.get_width() < 0.5][:4] == [0.0, 1.225, 2.45, 3.675]  # rank r: the r-th quarter
    plt.close("all")


def test_the_ring_buffers_follow_the_schedule_to_every_sum_on_every_rank():
    from dp_helpers.scratch.collectives.ring import ring_buffers
    from dp_helpers.tool.plotting import plot_ring_buffers

    for w in (2, 3, 4):
        states = ring_buffers(w)
        after_rs = states[w - 1]  # rank r then holds the whole sum of chunk (r + 1) mod W (notebook 03's claim)
        assert all(after_rs[r][(r + 1) % w] == frozenset(range(w)) for r in range(w))
        assert all(c == frozenset(range(w)) for row in states[-1] for c in row) and len(states) == 2 * (w - 1) + 1
    ax = plot_ring_buffers(3)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["start", "RS 1", "RS 2", "AG 1", "AG 2"]
    plt.close("all")


def test_members_draws_a_square_per_member_and_step_on_the_axes_given():
    from dp_helpers.tool.plotting import plot_members

    fig, ax = plt.subplots()
    steps = [(0, [0, 1, 2]), (1, [0, 2]), (2, [0, 1, 2])]
    assert plot_members(steps, 3, killed=(1, 1), ax=ax) is ax
    assert [len(c.get_offsets()) for c in ax.collections] == [3, 2, 3]  # replica 1 missed step 1
    assert list(ax.get_yticks()) == [0, 1, 2] and "replica 1 killed before step 1" in ax.texts[0].get_text()
    plt.close(fig)


def test_buckets_draws_each_bucket_where_its_all_reduce_starts_in_the_backward():
    from dp_helpers.tool.plotting import plot_buckets

    mib = 2**20
    ax = plot_buckets({"step 0": [5 * mib], "rebuilt": [1 * mib, 4 * mib]})
    bars = [(round(p.get_x(), 6), round(p.get_width(), 6)) for p in ax.patches]
    assert bars == [(0.0, 5.0), (0.0, 1.0), (1.0, 4.0)]  # in MiB, laid end to end in the order they start
    starts = sorted((line.get_xdata()[0], round(line.get_ydata()[0])) for line in ax.lines)
    assert starts == [(1.0, 1), (5.0, 0), (5.0, 1)]  # a marker at each bucket's last gradient
    assert [t.get_text() for t in ax.get_yticklabels()] == ["step 0", "rebuilt"]
    plt.close("all")
