"""Accuracy per number of branches (ParaFormer compression): a Markdown table and a PNG plot of runs.

    python -m widenet_ds.report.branches runs/pf-3x4 runs/pf-3x4-expanded --plot runs/branches.png

Reads each run folder's results.json, whose `accuracy_by_branches` {"1": acc, ...} the vision trainer
writes for models with branches (the test accuracy of the first k branches, i.e. of the model
`python -m widenet_ds.vision.export compress --branches k` exports). One row per run, one column per k.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display anywhere (CI, clusters); set before anything picks a backend
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from widenet_ds.atomic import atomic_write_text  # noqa: E402
from widenet_ds.errors import ConfigError, exit_status  # noqa: E402

RESULTS_FILE = "results.json"


@dataclass
class BranchAccuracy:
    name: str
    by_branches: dict[int, float]  # k -> test accuracy of the first k branches


def read_run(folder: Path) -> BranchAccuracy:
    path = Path(folder) / RESULTS_FILE
    if not path.is_file():
        raise ConfigError(f"{folder} has no {RESULTS_FILE}; pass the output folder of a finished "
                          f"vision/run_classify.py run.")
    results = json.loads(path.read_text())
    by_branches = results.get("accuracy_by_branches") if isinstance(results, dict) else None
    if not by_branches:
        raise ConfigError(f"{path} has no accuracy_by_branches: the run's model has one branch (num_branches = 1), "
                          f"or the run did not finish.")
    return BranchAccuracy(Path(folder).name, {int(k): float(v) for k, v in by_branches.items()})


def markdown_table(runs: list[BranchAccuracy]) -> str:
    widest = max(max(run.by_branches) for run in runs)
    lines = ["| run | " + " | ".join(f"k = {k}" for k in range(1, widest + 1)) + " |",
             "|---|" + "---:|" * widest]
    for run in runs:
        cells = [f"{run.by_branches[k]:.4f}" if k in run.by_branches else "" for k in range(1, widest + 1)]
        lines.append(f"| {run.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(runs: list[BranchAccuracy], path: Path) -> Path:
    fig = Figure(figsize=(6.5, 4.0), layout="constrained")
    ax = fig.subplots()
    for run in runs:
        ks = sorted(run.by_branches)
        ax.plot(ks, [run.by_branches[k] for k in ks], marker="o", label=run.name)
    ax.set_title("Test accuracy of the first k branches")
    ax.set_xlabel("branches k")
    ax.set_ylabel("test accuracy")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    tmp.replace(path)  # never a half-written PNG under the final name
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m widenet_ds.report.branches", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="vision run output folders (with results.json)")
    parser.add_argument("--plot", type=Path, default=None, help="write the plot to this PNG file")
    parser.add_argument("--table", type=Path, default=None, help="also write the Markdown table to this file")
    args = parser.parse_args(argv)
    return exit_status(parser.prog, lambda: _command(args))


def _command(args: argparse.Namespace) -> None:
    runs = [read_run(folder) for folder in args.runs]
    table = markdown_table(runs)
    print(table, end="")
    if args.table is not None:
        atomic_write_text(args.table, table)
    if args.plot is not None:
        print(f"wrote {plot(runs, args.plot)}")


if __name__ == "__main__":
    sys.exit(main())
