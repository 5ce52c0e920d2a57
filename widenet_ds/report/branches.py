"""ParaFormer's compression curve: how a model cut to its first k branches (k = 1..N, no retraining) scores.

- Image runs: the test accuracy per k that the trainer writes to results.json (`accuracy_by_branches`)
  when a model with branches finishes: the accuracy of what `widenet-ds branches compress --branches k`
  exports.
- Pretraining runs: the held-out MLM loss per k that the trainer logs at its end
  (`valid_branches_k/mlm_loss`).

The page shows one table and one plot per measure; `widenet-ds report --branches-table FILE` also writes
the tables as Markdown.
"""

from __future__ import annotations

from dataclasses import dataclass

from widenet_ds.report.metrics import ImageRun, PretrainRun, Run


@dataclass(frozen=True)
class Measure:
    label: str
    key_format: str  # where the value of k comes from (results.json key path or metrics.jsonl key)
    plot_file: str

    def key(self, k: int) -> str:
        return self.key_format.format(k=k)


ACCURACY = Measure("test accuracy", "accuracy_by_branches/{k}", "accuracy_by_branches.png")
MLM_LOSS = Measure("held-out MLM loss", "valid_branches_{k}/mlm_loss", "mlm_loss_by_branches.png")


@dataclass
class BranchCurve:
    run: str
    measure: Measure
    source: str  # "results" (results.json) or "step N" (the evaluation it was logged at)
    values: dict[int, float]  # k -> the measure with the first k branches


def branch_curves(runs: list[Run]) -> list[BranchCurve]:
    """The curves of the runs that have one, in run order."""
    curves = []
    for run in runs:
        if isinstance(run, ImageRun) and (values := run.accuracy_by_branches()):
            curves.append(BranchCurve(run.name, ACCURACY, "results", values))
        elif isinstance(run, PretrainRun) and (found := run.mlm_loss_by_branches()):
            step, values = found
            curves.append(BranchCurve(run.name, MLM_LOSS, f"step {step}", values))
    return curves


def by_measure(curves: list[BranchCurve]) -> list[tuple[Measure, list[BranchCurve]]]:
    return [(m, [c for c in curves if c.measure == m]) for m in (ACCURACY, MLM_LOSS)
            if any(c.measure == m for c in curves)]


def widest(curves: list[BranchCurve]) -> int:
    return max(max(c.values) for c in curves)


def markdown_table(curves: list[BranchCurve]) -> str:
    """One Markdown table per measure: a row per run, a column per k (empty where a run has fewer branches)."""
    parts = []
    for measure, group in by_measure(curves):
        ks = range(1, widest(group) + 1)
        lines = [f"{measure.label.capitalize()} of the first k branches (`{measure.key('k')}`):", "",
                 "| run | " + " | ".join(f"k = {k}" for k in ks) + " |", "|---|" + "---:|" * len(ks)]
        for curve in group:
            cells = [f"{curve.values[k]:.4f}" if k in curve.values else "" for k in ks]
            lines.append(f"| {curve.run} | " + " | ".join(cells) + " |")
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)
