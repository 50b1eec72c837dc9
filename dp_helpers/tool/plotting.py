"""Loss curves per rank and across ranks; every function takes ax=None and returns the Axes (used by every notebook).

Their labels are English templates passed through tr(): after set_language("zh-CN") they are drawn in Chinese.
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from pathlib import Path

from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from dp_helpers.tool.i18n import tr, tr_later
from dp_helpers.tool.metrics import read_metrics
from dp_helpers.tool.request import UsageError


def _get_ax(ax):
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(7, 4))
    return ax


def _runs(run_or_runs) -> list:
    """One run (a folder, a RunResult or a list of records) or several, as a list."""
    if isinstance(run_or_runs, (list, tuple)) and run_or_runs and isinstance(run_or_runs[0], dict):
        return [run_or_runs]
    return list(run_or_runs) if isinstance(run_or_runs, (list, tuple)) else [run_or_runs]


def _load(run) -> tuple[str, list[dict]]:
    """(label, records) for a run folder, a RunResult or a list of records."""
    if isinstance(run, list):
        return "run", run
    folder = Path(getattr(run, "run_dir", run))
    return folder.name, read_metrics(folder)


def mean_curve(records: list[dict]) -> tuple[list[int], list[float]]:
    """Per step, the sample-weighted mean of the ranks' losses: the loss of the global batch."""
    sums: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for r in records:
        sums[r["step"]][0] += r["loss"] * r["samples"]
        sums[r["step"]][1] += r["samples"]
    steps = sorted(sums)
    return steps, [sums[s][0] / sums[s][1] for s in steps]


def _mark_nonfinite(ax, label: str, steps: list[int], losses: list[float], color) -> None:
    """Warn about and draw non-finite losses, which matplotlib would otherwise drop without a word."""
    bad = [s for s, v in zip(steps, losses, strict=True) if not math.isfinite(v)]
    if not bad:
        return
    warnings.warn(f"{label}: non-finite loss at {len(bad)} step(s), first at step {bad[0]}; "
                  "marked with x at the top of the plot.", stacklevel=3)
    finite = [v for v in losses if math.isfinite(v)]
    top = max(finite) if finite else 1.0
    ax.plot(bad, [top] * len(bad), "x", color="red", markersize=8, label=tr("{label}: non-finite loss", label=label))


def plot_loss_curves(run_or_runs, ax=None, per_rank: bool = True, labels=None):
    """Draw each run's mean loss (thick) and per-rank losses (thin) against step; returns the Axes."""
    ax = _get_ax(ax)
    runs = _runs(run_or_runs)
    for i, run in enumerate(runs):
        label, records = _load(run)
        label = labels[i] if labels else label
        if not records:
            raise UsageError(f"{label}: no metric records; did training run 0 steps?")
        color = f"C{i}"
        if per_rank:
            by_rank = defaultdict(list)
            for r in records:
                by_rank[r["rank"]].append(r)
            for rank, rows in sorted(by_rank.items()):
                ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], color=color, alpha=0.35,
                        linewidth=0.8, marker=".", markersize=2)
                _mark_nonfinite(ax, tr("{label} rank {rank}", label=label, rank=rank), [r["step"] for r in rows], [r["loss"] for r in rows], color)
        steps, losses = mean_curve(records)
        ax.plot(steps, losses, color=color, linewidth=2, marker="o", markersize=2.5,
                label=tr("{label} (mean of {n} ranks)", label=label, n=records[0]["world_size"]))
        _mark_nonfinite(ax, f"{label} mean", steps, losses, color)
    ax.set_xlabel(tr("step"))
    ax.set_ylabel(tr("loss"))
    ax.set_title(tr("training loss: thin lines are single ranks") if per_rank else tr("training loss"))
    ax.legend(fontsize="small")
    return ax


def epoch_means(records: list[dict]) -> tuple[list[int], list[float]]:
    """Per epoch, the sample-weighted mean loss over all ranks and steps, placed at the epoch's last step."""
    sums: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0, -1])
    for r in records:
        total = sums[r["epoch"]]
        total[0], total[1], total[2] = total[0] + r["loss"] * r["samples"], total[1] + r["samples"], max(total[2], r["step"])
    epochs = sorted(sums)
    return [sums[e][2] for e in epochs], [sums[e][0] / sums[e][1] for e in epochs]


def plot_run(run_dir, ax=None, title: str | None = None):
    """One run in detail: each rank in its own colour, the mean over ranks, and the per-epoch mean; returns the Axes."""
    ax = _get_ax(ax)
    label, records = _load(run_dir)
    if not records:
        raise UsageError(f"{label}: no metric records; did training run 0 steps?")
    by_rank = defaultdict(list)
    for r in records:
        by_rank[r["rank"]].append(r)
    for rank, rows in sorted(by_rank.items()):
        steps, losses = [r["step"] for r in rows], [r["loss"] for r in rows]
        ax.plot(steps, losses, color=f"C{rank % 10}", alpha=0.45, linewidth=0.8, label=tr("rank {rank}", rank=rank))
        _mark_nonfinite(ax, tr("rank {rank}", rank=rank), steps, losses, f"C{rank % 10}")
    steps, losses = mean_curve(records)
    ax.plot(steps, losses, color="black", linewidth=1.6, label=tr("mean of {n} ranks", n=records[0]["world_size"]))
    ax.plot(*epoch_means(records), "s-", color="crimson", linewidth=2, markersize=5, label=tr("epoch mean"))
    ax.set(xlabel=tr("step"), ylabel=tr("loss"), title=title or label)
    ax.legend(fontsize="small", ncol=2)
    return ax


def run_title(summary: dict) -> str:
    """A run's configuration in one line, for its figure."""
    cfg = summary["config"]
    return (f"{summary['world_size']} x {summary['backend']}, batch {cfg['batch_size']} per rank "
            f"(global {summary['global_batch_size']}), lr {cfg['lr']}, model {cfg['model']}")


def save_loss_figure(run_dir, path, title: str | None = None) -> Path:
    """Draw one run on a pyplot-free Figure and save it to `path` (the train job's loss.png)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5))  # no pyplot: no backend switch, no figure left open in a notebook
    plot_run(run_dir, ax=fig.subplots(), title=title)
    fig.tight_layout()
    from dp_helpers.tool.files import write_atomic

    return write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=100, format="png"))  # no half-written png, ever


def plot_chunks(sizes_by_rule: dict[str, list[int]], ax=None):
    """Grouped bars: rows each device receives under each splitting rule; returns the Axes."""
    ax = _get_ax(ax)
    n = max(len(sizes) for sizes in sizes_by_rule.values())
    width = 0.8 / len(sizes_by_rule)
    for i, (rule, sizes) in enumerate(sizes_by_rule.items()):
        padded = sizes + [0] * (n - len(sizes))
        bars = ax.bar([d + i * width for d in range(n)], padded, width, label=rule)
        ax.bar_label(bars, fontsize="small")
    ax.set_xticks([d + 0.4 - width / 2 for d in range(n)], [tr("dev {d}", d=d) for d in range(n)])
    ax.set_ylabel(tr("rows"))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # a row count has no halves
    top = max(max(sizes) for sizes in sizes_by_rule.values())
    ax.set_ylim(0, 1.45 * top + 0.5)  # headroom, so that the legend sits above the bars, not on them
    ax.legend(fontsize="small", loc="upper center", ncol=len(sizes_by_rule), frameon=False)
    return ax


def plot_sampler_grid(table: list[list[int]], samples: int, ax=None, title: str = ""):
    """Rank x position grid coloured by sample index; padded repeats get a red frame; returns the Axes."""
    import numpy as np

    ax = _get_ax(ax)
    grid = np.array(table)
    ax.imshow(grid, cmap="viridis", vmin=0, vmax=max(samples - 1, 1), aspect="auto")
    seen: set[int] = set()
    for pos in range(grid.shape[1]):  # the sampler walks positions across ranks: the 2nd visit is the pad
        for rank in range(grid.shape[0]):
            idx = int(grid[rank, pos])
            color = "black" if idx > 0.6 * samples else "white"  # readable on viridis' light end
            ax.text(pos, rank, str(idx), ha="center", va="center", color=color, fontsize="small")
            if idx in seen:
                ax.add_patch(_frame(pos, rank))
            seen.add(idx)
    ax.set_yticks(range(grid.shape[0]), [tr("rank {rank}", rank=r) for r in range(grid.shape[0])])
    ax.set_xticks(range(grid.shape[1]))
    ax.set_xlabel(tr("position in the rank's shard (red frame: a padded repeat)"))
    ax.set_title(title)
    return ax


def _frame(x: float, y: float):
    from matplotlib.patches import Rectangle

    return Rectangle((x - 0.45, y - 0.45), 0.9, 0.9, fill=False, edgecolor="red", linewidth=2)


def plot_dataparallel_flow(sizes: list[int], ax=None):
    """The data flow of one DataParallel forward: batch -> scatter -> replicas -> gather on device 0."""
    ax = _get_ax(ax)
    n, total = len(sizes), sum(sizes)
    ys = [n - 1 - i for i in range(n)]
    mid = (n - 1) / 2
    _box(ax, 0, mid, tr("batch\n{total} rows\n(device 0)", total=total))
    _box(ax, 4, mid, tr("outputs\n{total} rows\ngathered on\ndevice 0", total=total))
    for i, (y, rows) in enumerate(zip(ys, sizes, strict=True)):
        _box(ax, 2, y, tr("replica {i}\n{rows} rows", i=i, rows=rows))
        ax.annotate("", (1.55, y), (0.45, mid), arrowprops={"arrowstyle": "->", "color": "C0"})
        ax.annotate("", (3.55, mid), (2.45, y), arrowprops={"arrowstyle": "->", "color": "C1"})
    ax.text(1, n - 0.4, tr("scatter\n(+ replicate)"), ha="center", color="C0")
    ax.text(3, n - 0.4, tr("gather"), ha="center", color="C1")
    ax.set_xlim(-0.6, 4.6)
    ax.set_ylim(-0.8, n + 0.2)
    ax.axis("off")
    return ax


def _box(ax, x: float, y: float, text: str) -> None:
    ax.text(x, y, text, ha="center", va="center", fontsize="small",
            bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "gray"})


def plot_backward_timeline(events: list[dict], ax=None):
    """Gantt chart of one backward: its compute, when each layer's gradients are ready, each all-reduce; returns the Axes."""
    ax = _get_ax(ax)
    ready = [e for e in events if e["kind"] == "gradient ready"]
    buckets = sorted((e for e in events if e["kind"] == "all-reduce"), key=lambda e: e["start"])
    if ready:  # the backward computes gradients from its start until the last one is ready
        ax.barh(0, 1e3 * max(e["start"] for e in ready), left=0, color="lightgray", height=0.6)
    layers = defaultdict(list)  # a layer's weight and bias are ready within microseconds: one label for both
    for e in ready:
        ax.plot([1e3 * e["start"]] * 2, [0.7, 1.3], color="C0")
        layers[e["name"].replace("layer ", "L").split(".")[0]].append(1e3 * e["start"])
    named = list(layers.items())
    # the first and last layers only, one above the ticks and one below: close together they would overlap
    for (name, times), y, va in zip([named[0], named[-1]] if len(named) > 1 else named, (0.68, 1.32), ("bottom", "top"),
                                   strict=False):
        ax.text(min(times), y, tr("layer {name}", name=name), ha="center", va=va, fontsize="x-small", color="C0")
    for row, e in enumerate(buckets, start=2):
        ax.barh(row, 1e3 * (e["end"] - e["start"]), left=1e3 * e["start"], color="C1", height=0.6)
        ax.text(1e3 * e["end"], row, f" {_size(e['bytes'])}", va="center", fontsize="x-small")
    done = [e["start"] for e in events if e["kind"] == "backward done"]
    last = max([1e3 * e["end"] for e in buckets] + [1e3 * t for t in done] + [1e3 * e["start"] for e in ready] + [1e-3])
    ax.set_xlim(0, 1.12 * last)  # room for the size labels at the bars' ends
    if done:  # labelled beside the line, inside the axes, rather than in a legend that would hide the last bars
        ax.axvline(1e3 * done[0], color="gray", linestyle=":")
        ax.text(1e3 * done[0], 0, tr(" backward\n returns"), ha="left", va="center", fontsize="x-small", color="gray")
    names = [tr("bucket {k}", k=e["name"].split()[-1]) if e["name"].startswith("bucket ") else e["name"] for e in buckets]
    ax.set_yticks(range(len(buckets) + 2), [tr("backward (compute)"), tr("gradients ready")] + names)
    ax.invert_yaxis()
    ax.set_xlabel(tr("ms since the backward started (an all-reduce's bar: launched to completed, waiting included)"))
    ax.set_title(tr("each all-reduce is launched while the backward still computes"))
    return ax


def plot_buckets(rows: dict[str, list[int]], ax=None):
    """DDP's buckets, one row per setting, each bar ending where its all-reduce starts; returns the Axes."""
    # x: the gradients the backward has produced, last layer first; a bucket starts once its last gradient is ready
    ax = _get_ax(ax)
    for row, sizes in enumerate(rows.values()):
        start = 0.0
        for k, size in enumerate(sizes):
            mib = size / 2**20
            ax.barh(row, mib, left=start, height=0.6, color=f"C{k % 10}", edgecolor="white")
            ax.plot(start + mib, row - 0.42, marker="v", color="black", markersize=5)  # its all-reduce starts
            if mib > 0.45:
                ax.text(start + mib / 2, row, f"{mib:.2f}", ha="center", va="center", fontsize="x-small", color="white")
            start += mib
    ax.set_yticks(range(len(rows)), list(rows))
    ax.invert_yaxis()
    ax.set_xlabel(tr("MiB of gradients the backward has produced, last layer first (▼: a bucket's all-reduce starts)"))
    ax.set_title(tr("DDP's buckets: each is all-reduced once its last gradient is ready"))
    return ax


def _size(n_bytes: int) -> str:
    """16 MiB or 1.5 MiB from a MiB up, 256 KiB below it, 4 B below a KiB."""
    if n_bytes < 2**10:
        return f"{n_bytes} B"
    return f"{n_bytes / 2**20:.3g} MiB" if n_bytes >= 2**20 else f"{n_bytes / 2**10:.0f} KiB"


def plot_bucket_sweep(rows: list[dict], ax=None):
    """All-reduces per step (bars) and step times (a line per name in a dict "step_seconds") per bucket cap; returns the Axes."""
    ax = _get_ax(ax)
    labels = [tr("default") if r["bucket_cap_mb"] is None else f"{r['bucket_cap_mb']:g}" for r in rows]
    ax.bar(range(len(rows)), [r["allreduces_per_step"] for r in rows], color="lightgray", label=tr("all-reduces per step"))
    ax.set_xticks(range(len(rows)), labels)
    ax.set_xlabel("bucket_cap_mb (MiB)")
    ax.set_ylabel(tr("all-reduces per step"))
    right = ax.twinx()
    times = [r["step_seconds"] if isinstance(r["step_seconds"], dict) else {tr("step time"): r["step_seconds"]} for r in rows]
    for i, name in enumerate(times[0]):
        right.plot(range(len(rows)), [1e3 * t[name] for t in times], "o-", color=f"C{i}", label=tr("{name} (measured, not asserted)", name=name))
    right.set_ylabel(tr("ms per step"))
    right.set_ylim(bottom=0)
    right.legend(fontsize="small", loc="upper right")
    return ax


def _int_keys(d: dict) -> dict[int, float]:
    return {int(k): v for k, v in d.items()}


def plot_speedup(result: dict, ax=None):
    """Measured DDP (and DataParallel) speed-up against world size, with the ideal line and the independent-processes ceiling."""
    ax = _get_ax(ax)
    ddp, ceiling = _int_keys(result["speedup"]), _int_keys(result["ceiling_speedup"])
    ws = [1, *sorted(ddp)]
    ax.plot(ws, ws, "k:", label=tr("ideal: S(N) = N"))
    ax.plot(ws, [1.0] + [ceiling[w] for w in ws[1:]], "s--", label=tr("ceiling: N independent processes"))
    ax.plot(ws, [1.0] + [ddp[w] for w in ws[1:]], "o-", label="DDP")
    dp = _int_keys(result.get("dataparallel_speedup", {}))
    if dp:  # the label says when it is the CPU emulation, never to be read as a GPU figure
        emulated = result.get("dataparallel_kind", "").startswith("CPU")
        ax.plot(ws, [1.0] + [dp[w] for w in ws[1:]], "^-.",
                label=tr("DataParallel, CPU emulation (threads)") if emulated else "DataParallel")
    ax.set(xlabel=tr("world size N"), ylabel=tr("speed-up T(N) / T(1)"), xticks=ws,
           title=tr("per-process batch {batch}", batch=result["config"]["default_batch"]))
    ax.legend(fontsize="small")
    return ax


def plot_bandwidth(result: dict, ax=None):
    """Bus bandwidth of dist.all_reduce and of our ring_all_reduce against message size."""
    ax = _get_ax(ax)
    rows = result["allreduce"]
    if not rows:
        raise UsageError("no all-reduce measurements: the benchmark ran with world size 1.")
    mib = [r["bytes"] / 2**20 for r in rows]
    ax.plot(mib, [r["busbw_all_reduce_GBps"] for r in rows], "o-", label="dist.all_reduce")
    ax.plot(mib, [r["busbw_ring_GBps"] for r in rows], "s--", label=tr("ring_all_reduce (ours)"))
    ax.set(xscale="log", xlabel=tr("message size"), ylabel=tr("bus bandwidth (GB/s)"),
           title=tr("all-reduce on {n} ranks", n=rows[0]["world_size"]))
    measured_ticks(ax, mib, [_size(r["bytes"]) for r in rows])
    ax.legend(fontsize="small")
    return ax


def measured_ticks(ax, values: list, labels: list[str] | None = None) -> None:
    """Ticks at the measured values only, labelled plainly: a log axis otherwise labels 6x10^1 and 4x10^2."""
    from matplotlib.ticker import NullFormatter, NullLocator

    ax.set_xticks(values, labels or [f"{v:g}" for v in values])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())


def plot_efficiency_vs_batch(result: dict, ax=None):
    """DDP throughput as a fraction of the ceiling against the per-process batch size."""
    ax = _get_ax(ax)
    rows = result["batch_sweep"]
    for key in (k for k in rows[0] if k.startswith("efficiency_vs_ceiling_")):
        ax.plot([r["batch"] for r in rows], [r[key] for r in rows], "o-", label=f"DDP, N = {key.rsplit('_', 1)[1]}")
    ax.axhline(1.0, color="gray", linestyle=":")
    ax.set(xscale="log", xlabel=tr("per-process batch"), ylabel=tr("DDP / ceiling"), ylim=(0, 1.1),
           title=tr("more compute per step hides the all-reduce"))
    measured_ticks(ax, [r["batch"] for r in rows])
    ax.legend(fontsize="small")
    return ax


def plot_memory_per_rank(held: dict, predicted: dict | None = None, ax=None):
    """A stacked bar per strategy: parameters, gradients, optimizer state (KiB); the formula's total as a marker."""
    ax = _get_ax(ax)
    names, bottom = list(held), [0.0] * len(held)
    for i, part in enumerate(("parameters", "gradients", "optimizer state")):
        values = [held[n][part] / 2**10 for n in names]
        ax.bar(range(len(names)), values, bottom=bottom, color=f"C{i}", label=tr(part))
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    for i, name in enumerate(names):  # the formula as a black frame: it coincides with the bar when they agree
        formula = sum(predicted[name].values()) / 2**10 if predicted and name in predicted else None
        if formula is not None:
            ax.bar(i, formula, fill=False, edgecolor="black", linewidth=1.5, label=tr("formula") if i == 0 else None)
        said = f"{bottom[i]:,.0f}" + ("" if formula is None else tr(" = formula") if abs(formula - bottom[i]) < 0.5 / 2**10
                                      else tr("\n(formula {formula})", formula=f"{formula:,.0f}"))
        ax.text(i, max(bottom[i], formula or 0), said, ha="center", va="bottom", fontsize="x-small")
    ax.set_xticks(range(len(names)), [n.replace("ZeroRedundancyOptimizer", "ZeroRedundancy-\nOptimizer") for n in names])
    ax.set_ylabel(tr("KiB held by one rank"))
    ax.set_ylim(top=1.15 * max(bottom))
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return ax


def plot_ddp_picture(world_size: int = 2, ax=None):
    """DDP in one picture (notebook 00): a batch in shards, a model copy per rank, the all-reduce, the same step."""
    ax = _get_ax(ax)
    rows = [world_size - 1 - r for r in range(world_size)]
    mid = (world_size - 1) / 2
    _box(ax, 0, mid, tr("global batch\n{n} shards", n=world_size))
    for rank, y in enumerate(rows):
        ax.annotate("", (0.95, y), (0.45, mid), arrowprops={"arrowstyle": "->", "color": f"C{rank}"})
        _box(ax, 1.75, y, tr("rank {rank}: a full model copy\nforward + backward\non shard {rank}: gradient g{rank}",
                             rank=rank))
        ax.annotate("", (3.15, mid), (2.6, y), arrowprops={"arrowstyle": "->", "color": f"C{rank}"})
        ax.annotate("", (4.55, y), (4.05, mid), arrowprops={"arrowstyle": "->", "color": "gray"})
        _box(ax, 5.35, y, tr("rank {rank}: optimizer.step()\nwith the average\n→ the same weights", rank=rank))
    mean = " + ".join(f"g{r}" for r in range(world_size))
    _box(ax, 3.6, mid, tr("all-reduce\n({mean}) / {n}\nevery rank gets it", mean=mean, n=world_size))
    ax.text(3.6, mid + 0.45, tr("during backward()"), ha="center", fontsize="small", color="gray")
    ax.text(0, mid - 0.45, tr("(DDP(model) gave every\nrank rank 0's weights)"), ha="center", va="top", fontsize="x-small",
            color="gray")
    ax.set_xlim(-0.6, 6.3)
    ax.set_ylim(-0.5, world_size - 0.5)
    ax.axis("off")
    ax.set_title(tr("one training step of DistributedDataParallel on {n} processes", n=world_size))
    return ax


ZERO_STAGES = [  # what a rank keeps of parameters, gradients and optimizer state (True: a 1/W shard), and what it sends
    ("DDP", (False, False, False), "16 Ψ", tr_later("all-reduce the gradients: 2(W−1)/W · Ψ")),
    ("ZeRO-1", (False, False, True), "8 Ψ + 8 Ψ / W",
     tr_later("reduce-scatter the gradients, all-gather the\nparameters: the same bytes as DDP")),
    ("ZeRO-2", (False, True, True), "4 Ψ + 12 Ψ / W",
     tr_later("the same collectives; the full gradient\nis dropped after its reduce-scatter")),
    ("ZeRO-3", (True, True, True), "16 Ψ / W",
     tr_later("all-gather each layer's parameters in the forward\nand again in the backward: 1.5 × DDP's bytes")),
]


def plot_zero_stages(world_size: int = 4, ax=None):
    """What each rank holds and sends per ZeRO stage (fp32 Adam: 4 + 4 + 8 bytes per parameter); returns the Axes."""
    ax = _get_ax(ax)
    parts = ((tr("parameters"), 4), (tr("gradients"), 4), (tr("optimizer state"), 8))  # bytes per parameter: a bar's height
    unit = 0.6 / sum(size for _, size in parts) / 1.1  # a bar's height per byte, with gaps between the bars
    for row, (name, sharded, held, sent) in enumerate(ZERO_STAGES):
        y = len(ZERO_STAGES) - 1 - row + 0.3  # top of this stage's stack
        for k, ((part, size), shard) in enumerate(zip(parts, sharded, strict=True)):
            height = size * unit
            y -= height / 2
            for rank in range(world_size):
                left, width = (rank + 0.9 * rank / world_size, 0.9 / world_size) if shard else (rank, 0.9)
                ax.barh(y, 0.9, left=rank, height=height, color="none", edgecolor="lightgray")
                ax.barh(y, width, left=left, height=height, color=f"C{k}",
                        label=tr("{part} ({size} B each)", part=part, size=size) if (row, rank) == (0, 0) else None)
            y -= height / 2 + 0.1 * unit * 4
        ax.text(-0.1, len(ZERO_STAGES) - 1 - row, f"{name}\n{held}", ha="right", va="center", fontsize="small")
        ax.text(world_size + 0.05, len(ZERO_STAGES) - 1 - row, tr(sent), ha="left", va="center", fontsize="x-small")
    ax.set_xticks([r + 0.45 for r in range(world_size)], [tr("rank {rank}", rank=r) for r in range(world_size)])
    ax.set_yticks([])
    ax.set_xlim(-1.6, world_size + 3.2)
    ax.set_ylim(-0.6, len(ZERO_STAGES) - 0.4)
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    ax.legend(fontsize="x-small", loc="lower center", bbox_to_anchor=(0.4, 1.0), ncol=3, frameon=False)
    ax.set_title(tr("what each of {n} ranks holds (coloured: kept; grey frame: the whole; height: bytes)", n=world_size),
                 pad=26)
    return ax


def plot_ring_buffers(world_size: int = 4, ax=None):
    """Every rank's buffer, chunk by chunk, after each step of the ring all-reduce: how many ranks' values it sums."""
    import numpy as np

    ax = _get_ax(ax)
    from dp_helpers.scratch.collectives.ring import ring_buffers

    states, w = ring_buffers(world_size), world_size
    grid = np.full((w, len(states) * (w + 1) - 1), np.nan)
    for k, state in enumerate(states):
        for rank, row in enumerate(state):
            for chunk, summed in enumerate(row):
                grid[rank, k * (w + 1) + chunk] = len(summed)
                ax.text(k * (w + 1) + chunk, rank, "Σ" if len(summed) == w else str(len(summed)), ha="center",
                        va="center", fontsize="x-small", color="white" if len(summed) == w else "black")
    ax.imshow(grid, cmap="Blues", vmin=0, vmax=w + 1, aspect="auto")
    names = [tr("start")] + [f"RS {s + 1}" for s in range(w - 1)] + [f"AG {s + 1}" for s in range(w - 1)]
    ax.set_xticks([k * (w + 1) + (w - 1) / 2 for k in range(len(states))], names)
    ax.set_yticks(range(w), [tr("rank {rank}", rank=r) for r in range(w)])
    ax.tick_params(length=0)
    ax.set_title(tr("each rank's {n} chunks after every step: how many ranks' values a chunk sums (Σ: all {n})", n=w))
    return ax


WITHOUT_FEEDBACK = " without error feedback"


def _method_label(method: str) -> str:
    """A method's legend entry: its name, the words after it (PowerSGD's "without error feedback") in the language."""
    if method.endswith(WITHOUT_FEEDBACK):
        return tr("{method} without error feedback", method=method.removesuffix(WITHOUT_FEEDBACK))
    return method


def plot_accuracy_vs_bytes(results: dict, ax=None, title: str | None = None):
    """Held-out accuracy after each epoch against the bytes sent by then, a line per method (notebook 10)."""
    ax = _get_ax(ax)
    others = iter(range(10))
    for method, row in results.items():
        style = "--" if "without" in method else "-"  # the one that is meant to fail
        x, y = [b / 2**20 for b in row["bytes"]], [100 * a for a in row["accuracy"]]
        color = "black" if method == "DDP" else f"C{next(others) % 10}"  # the baseline, the same in every panel
        ax.plot(x, y, style, marker="o", ms=3, color=color, label=_method_label(method))
        if method == "DDP":  # one line's points numbered: each point is the end of an epoch
            for epoch, (xi, yi) in enumerate(zip(x, y, strict=True), start=1):
                ax.annotate(tr("epoch {epoch}", epoch=epoch), (xi, yi), xytext=(4, -9), textcoords="offset points",
                            fontsize="x-small")
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))  # 0.2, 0.5, 1, 2: labels that never collide
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set(xlabel=tr("MiB handed to collectives by one rank (log scale)"), ylabel=tr("held-out accuracy (%)"))
    ax.set_title(title or tr("accuracy against bytes sent: up and to the left is better"))
    ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)  # off the lines
    return ax


OVERLAP_MODES = (tr_later("compute only"), tr_later("after backward"), tr_later("overlapped"))


def plot_overlap(measured: dict, predicted: dict | None = None, ax=None):
    """ms per step for each bucket cap: bars measured per mode, crosses where the cost model put them; returns the Axes."""
    ax = _get_ax(ax)
    caps = list(measured)
    for i, mode in enumerate(OVERLAP_MODES):
        xs = [c + (i - 1) * 0.27 for c in range(len(caps))]
        ax.bar(xs, [1e3 * measured[cap][mode] for cap in caps], width=0.27, color=f"C{i}", label=tr(mode))
        if predicted and mode in predicted[caps[0]]:
            ax.plot(xs, [1e3 * predicted[cap][mode] for cap in caps], "kx", markersize=8,
                    label=tr("cost model") if i == 1 else None)
    ax.set_xticks(range(len(caps)), [f"{float(c):g}" for c in caps])
    ax.set_xlabel("bucket_cap_mb (MiB)")
    ax.set_ylabel(tr("ms per step"))
    ax.legend(fontsize="small", ncols=2)
    return ax


MEMORY_PARTS = (tr_later("parameters"), tr_later("gradients"), tr_later("optimizer state"), tr_later("activations"))


def plot_memory(rows: dict, ax=None):
    """GB per rank for each strategy, stacked by what holds them (parameters, gradients, ...); returns the Axes."""
    ax = _get_ax(ax)
    names = list(rows)
    parts = [k for k in rows[names[0]] if k != "total"]
    bottom = [0.0] * len(names)
    for i, part in enumerate(parts):
        heights = [rows[n][part] / 1e9 for n in names]
        ax.bar(range(len(names)), heights, bottom=bottom, color=f"C{i}", label=tr(part))
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel(tr("GB per rank"))
    ax.legend(fontsize="small")
    return ax


def plot_vs_baseline(measured: dict, predicted: dict | None = None, baseline: str = "ddp", ax=None):
    """Each method's time over the baseline's, grouped by link: bars measured, crosses the cost model; returns the Axes."""
    ax = _get_ax(ax)
    groups = list(measured)
    methods = [m for m in measured[groups[0]] if m != baseline]
    width = 0.8 / len(methods)
    for i, method in enumerate(methods):
        xs = [g + (i - (len(methods) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [measured[g][method] / measured[g][baseline] for g in groups], width=width, color=f"C{i}",
               label=method)
        modelled = [(x, g) for x, g in zip(xs, groups, strict=True) if g in (predicted or {})]  # groups it predicts
        if modelled:
            ax.plot([x for x, _ in modelled], [predicted[g][method] / predicted[g][baseline] for _, g in modelled], "kx",
                    markersize=7, label=tr("cost model") if i == 0 else None)
    ax.axhline(1, color="black", linewidth=1)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(tr("time / {baseline}'s (below 1: faster)", baseline=baseline))
    ax.legend(fontsize="small", ncols=3)
    return ax


def plot_step_trace(step, ax=None):
    """A StepTrace (tool/trace.py): compute on top, each collective on a lane below, exposed communication shaded."""
    ax = _get_ax(ax)
    lanes = len(step.communication)
    ax.broken_barh([(a, b - a) for a, b in step.compute], (lanes, 0.8), color="C0", label=tr("compute"))
    for i, (a, b) in enumerate(step.communication):
        ax.broken_barh([(a, b - a)], (lanes - 1 - i, 0.8), color="C1", label=tr("communication") if i == 0 else None)
    if step.exposed:
        ax.axvspan(*step.exposed, color="C3", alpha=0.2,
                   label=tr("exposed communication ({ms} ms)", ms=f"{step.exposed_ms:.0f}"))
    ax.axvline(step.phases["forward"][1], color="black", linestyle="--", linewidth=1)
    ax.set_yticks([lanes + 0.4, *(lanes - 1 - i + 0.4 for i in range(lanes))],
                  [tr("compute"), *(tr("collective {i}", i=i + 1) for i in range(lanes))])
    ax.set_xlabel(tr("ms from the forward's start (dashed: the backward starts)"))
    ax.legend(fontsize="small", loc="lower left")
    return ax


def plot_members(steps: list[tuple[int, list[int]]], replicas: int, killed: tuple[int, int] | None = None, ax=None):
    """Which replicas each committed step averaged over: a square per (step, member), a row per replica (notebook 11)."""
    ax = _get_ax(ax)
    for r in range(replicas):
        counted = [s for s, members in steps if r in members]
        ax.scatter(counted, [r] * len(counted), marker="s", s=16, color=f"C{r}", label=tr("replica {r}", r=r))
    if killed is not None:
        replica, step = killed
        ax.axvline(step - 0.5, color="black", linestyle=":", linewidth=1)
        ax.annotate(tr("replica {replica} killed before step {step}", replica=replica, step=step), (step - 0.5, replicas - 0.5), xytext=(4, 0),
                    textcoords="offset points", fontsize="small", va="top")
    ax.set(xlabel=tr("step"), ylabel=tr("replica"), yticks=range(replicas), ylim=(replicas - 0.2, -0.8))
    ax.set_title(tr("who each step's average counted: a gap is a step without that replica"))
    return ax
