"""The report's PNG plots (matplotlib, no display needed): curves with the runs of a kind overlaid, one
expert-load heatmap per MoE run with a row of panels per routed block, and ParaFormer's compression curves.

Figures are built with `matplotlib.figure.Figure` (Agg canvas), never through pyplot's global state, so
nothing depends on a display or leaks figures between calls.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display anywhere (CI, clusters); set before anything picks a backend
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from widenet_ds.report.branches import BranchCurve, branch_curves, by_measure  # noqa: E402
from widenet_ds.report.metrics import FinetuneRun, ImageRun, LoggedRun, PretrainRun, Run  # noqa: E402

DPI = 100


@dataclass
class Plot:
    """A PNG written beside the page."""

    file: str
    title: str
    caption: str
    section: str  # "pretrain", "classify", "experts", "branches" or "finetune"


@dataclass(frozen=True)
class Curve:
    key: str  # the metrics.jsonl key of the training series
    title: str
    ylabel: str
    valid_key: str | None = None  # the held-out (test) series drawn dashed beside it
    valid_label: str = "held-out"


PRETRAIN_CURVES = (
    Curve("train/mlm_loss", "Masked-LM loss", "loss", "valid/mlm_loss"),
    Curve("train/sop_loss", "Sentence-order prediction loss", "loss", "valid/sop_loss"),
    Curve("optim/lr", "Learning rate", "learning rate"),
    Curve("perf/tokens_per_second", "Throughput (real tokens per second, all ranks)", "tokens / s"),
    Curve("train/balance_loss", "Load-balance loss (summed over routing calls, unweighted)", "balance loss"),
)
IMAGE_CURVES = (
    Curve("train/accuracy", "Accuracy", "accuracy", "test/accuracy", "test"),
    Curve("train/task_loss", "Classification loss (cross-entropy)", "loss", "test/task_loss", "test"),
    Curve("optim/lr", "Learning rate", "learning rate"),
    Curve("perf/samples_per_second", "Throughput (images per second, all ranks)", "images / s"),
    Curve("train/balance_loss", "Load-balance loss (summed over routing calls, unweighted)", "balance loss"),
)
IMAGE_PREFIX = "image_"  # image runs' curve files, beside the pretraining ones of the same names


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "run"


def _colors(n: int) -> list:
    cmap = matplotlib.colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _save(fig: Figure, out_dir: Path, file: str) -> None:
    for ax in fig.axes:
        if ax.get_xlabel() == "step":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    fig.savefig(out_dir / file, dpi=DPI)


def _legend(fig: Figure, ax) -> None:
    """Inside the axes for a few runs; beside them (widening the figure) when it would hide the curves."""
    entries = len(ax.get_legend_handles_labels()[0])
    if entries <= 6:
        ax.legend(fontsize="small")
    else:
        fig.set_figwidth(fig.get_figwidth() + 3.0)
        fig.legend(loc="outside right upper", fontsize="x-small")


def _curve_plot(runs: list[LoggedRun], curve: Curve, out_dir: Path, file: str) -> bool:
    """One figure, every run in its own colour (training solid, held-out dashed with markers)."""
    fig = Figure(figsize=(7.5, 4.2), layout="constrained")
    ax = fig.subplots()
    drawn = False
    for run, color in zip(runs, _colors(len(runs))):
        steps, values = run.series(curve.key)
        if steps:
            ax.plot(steps, values, color=color, label=f"{run.name} (train)" if curve.valid_key else run.name)
            drawn = True
        if curve.valid_key:
            vsteps, vvalues = run.series(curve.valid_key)
            if vsteps:
                ax.plot(vsteps, vvalues, color=color, linestyle="--", marker="o", markersize=4,
                        label=f"{run.name} ({curve.valid_label})")
                drawn = True
    if not drawn:
        return False
    ax.set_title(curve.title)
    ax.set_xlabel("step")
    ax.set_ylabel(curve.ylabel)
    ax.grid(alpha=0.3)
    _legend(fig, ax)
    _save(fig, out_dir, file)
    return True


def _dropped_plot(runs: list[LoggedRun], out_dir: Path, file: str) -> bool:
    fig = Figure(figsize=(7.5, 4.2), layout="constrained")
    ax = fig.subplots()
    drawn = False
    for run, color in zip(runs, _colors(len(runs))):
        steps, values = run.dropped_fraction()
        if steps:
            ax.plot(steps, values, color=color, label=run.name)
            drawn = True
    if not drawn:
        return False
    ax.set_title("Routes dropped by expert capacity (mean over blocks)")
    ax.set_xlabel("step")
    ax.set_ylabel("dropped fraction")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    _legend(fig, ax)
    _save(fig, out_dir, file)
    return True


def _expert_heatmap(run: LoggedRun, out_dir: Path, file: str) -> bool:
    """Rows of panels, one per routed block: experts (y) x logged steps (x), colour = share of routes."""
    blocks = [b for b in run.blocks if run.expert_load(b)[0]]
    if not blocks:
        return False
    experts = run.num_experts
    fig = Figure(figsize=(9, 0.45 * experts * len(blocks) + 1.4), layout="constrained")
    axes = fig.subplots(len(blocks), 1, sharex=True, squeeze=False)[:, 0]
    # One colour scale for all blocks, up to the largest share seen (a collapsed router shows as 1.0).
    top = max(max(max(loads) for loads in run.expert_load(b)[1]) for b in blocks)
    image = None
    for ax, block in zip(axes, blocks):
        steps, loads = run.expert_load(block)
        columns = list(zip(*loads))  # [experts][steps]
        edges = [steps[0] - 0.5] + [(a + b) / 2 for a, b in zip(steps, steps[1:])] + [steps[-1] + 0.5]
        image = ax.pcolormesh(edges, [e - 0.5 for e in range(experts + 1)], columns, cmap="viridis",
                              vmin=0.0, vmax=max(top, 1.0 / experts))
        ax.set_ylabel(f"block {block}", rotation=0, ha="right", va="center")
        ax.set_yticks(range(experts))
        ax.set_yticklabels([f"e{e}" for e in range(experts)], fontsize="x-small")
    axes[-1].set_xlabel("step")
    fig.suptitle(f"Expert load per block over steps: {run.name} (uniform = 1/{experts} = {1 / experts:.3f})")
    fig.colorbar(image, ax=list(axes), label="share of the block's routes", shrink=0.9)
    _save(fig, out_dir, file)
    return True


def _finetune_plot(runs: list[FinetuneRun], out_dir: Path, file: str) -> bool:
    """One panel per task; in each, every run's loss averaged over its seeds (the seeds' spread shaded)."""
    by_task: dict[str, list[FinetuneRun]] = {}
    for run in runs:
        if any(seed.loss()[0] for seed in run.seeds):
            by_task.setdefault(run.task, []).append(run)
    if not by_task:
        return False
    cols = min(3, len(by_task))
    rows = -(-len(by_task) // cols)
    fig = Figure(figsize=(max(7.5, 5.2 * cols), max(4.2, 3.6 * rows)), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).flatten()
    for ax, (task, task_runs) in zip(axes, sorted(by_task.items())):
        for run, color in zip(task_runs, _colors(len(task_runs))):
            curves = [dict(zip(*seed.loss())) for seed in run.seeds if seed.loss()[0]]
            steps = sorted(set().union(*curves))
            values = [[c[s] for c in curves if s in c] for s in steps]
            ax.plot(steps, [sum(v) / len(v) for v in values], color=color,
                    label=f"{run.name} ({len(curves)} seed{'s' if len(curves) > 1 else ''})")
            if len(curves) > 1:
                ax.fill_between(steps, [min(v) for v in values], [max(v) for v in values], color=color, alpha=0.15)
        ax.set_title(task)
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small")
    for ax in axes[len(by_task):]:
        ax.set_visible(False)
    fig.suptitle("Finetuning loss (task + weighted balance loss): mean over seeds, min-max shaded")
    _save(fig, out_dir, file)
    return True


def _branches_plot(curves: list[BranchCurve], out_dir: Path, file: str) -> None:
    """One measure's compression curves: the measure against the number of branches kept, a line per run."""
    fig = Figure(figsize=(7.5, 4.2), layout="constrained")
    ax = fig.subplots()
    for curve, color in zip(curves, _colors(len(curves))):
        ks = sorted(curve.values)
        ax.plot(ks, [curve.values[k] for k in ks], color=color, marker="o", label=curve.run)
    measure = curves[0].measure
    ax.set_title(f"{measure.label.capitalize()} of the first k branches (no retraining)")
    ax.set_xlabel("branches kept (k)")
    ax.set_ylabel(measure.label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    _legend(fig, ax)
    _save(fig, out_dir, file)


def _curves(runs: list[LoggedRun], curves: tuple[Curve, ...], prefix: str, section: str,
            out_dir: Path) -> list[Plot]:
    """The curves of one kind of run (and their dropped routes), files named with `prefix`."""
    plots = []
    for curve in curves:
        file = prefix + slug(curve.key.split("/")[-1]) + ".png"
        if _curve_plot(runs, curve, out_dir, file):
            caption = f"`{curve.key}`" + (f" (solid) and `{curve.valid_key}` (dashed)" if curve.valid_key else "")
            plots.append(Plot(file, curve.title, caption + " from metrics.jsonl, every run overlaid.", section))
    file = prefix + "dropped_fraction.png"
    if _dropped_plot(runs, out_dir, file):
        plots.append(Plot(file, "Dropped routes", "Mean over blocks of `moe/block_NN/dropped_fraction`.", section))
    return plots


def draw_all(runs: list[Run], out_dir: Path) -> list[Plot]:
    """Write every plot the runs have data for; return them in page order."""
    pretrain = [r for r in runs if isinstance(r, PretrainRun)]
    images = [r for r in runs if isinstance(r, ImageRun)]
    finetune = [r for r in runs if isinstance(r, FinetuneRun)]
    plots = _curves(pretrain, PRETRAIN_CURVES, "", "pretrain", out_dir) if pretrain else []
    if images:
        plots += _curves(images, IMAGE_CURVES, IMAGE_PREFIX, "classify", out_dir)
    used: set[str] = set()
    for run in pretrain + images:
        base = slug(run.name)
        file = f"expert_load_{base}.png"
        n = 2
        while file in used:
            file, n = f"expert_load_{base}_{n}.png", n + 1
        if _expert_heatmap(run, out_dir, file):
            used.add(file)
            plots.append(Plot(file, f"Expert load: {run.name}",
                              "`moe/block_NN/expert_EE_load`: the share of each block's routes (top-k "
                              "choices, before capacity dropping) per expert. The router is shared by all "
                              "blocks, yet each block sends its tokens differently.", "experts"))
    for measure, curves in by_measure(branch_curves(runs)):
        _branches_plot(curves, out_dir, measure.plot_file)
        plots.append(Plot(measure.plot_file, f"{measure.label.capitalize()} by branches kept",
                          f"ParaFormer compression: `{measure.key('k')}` of each run's model cut to its first k "
                          f"branches.", "branches"))
    if finetune and _finetune_plot(finetune, out_dir, "finetune_loss.png"):
        plots.append(Plot("finetune_loss.png", "Finetuning loss", "The training loss (`train/loss`) of every seed's metrics.jsonl.",
                          "finetune"))
    return plots
