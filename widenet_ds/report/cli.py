"""`widenet-ds report RUN_DIR [RUN_DIR ...] --output DIR`: the page and its plots, written all at once.

The output folder is built beside its final place and swapped in (`atomic_folder`), so a reader never
sees half a report, and a previous report there is replaced whole (no stale plots). A folder holding
anything else is refused: the report never overwrites files it did not write. Folders that cannot be used
are listed in the page and on stderr; the exit status is 1 only when none of them could be used.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from widenet_ds.errors import ConfigError
from widenet_ds.formats import VERSION_KEY, current
from widenet_ds.fs.atomic import atomic_folder, atomic_write_text
from widenet_ds.fs.run_lock import output_lock
from widenet_ds.report.branches import branch_curves, markdown_table
from widenet_ds.report.metrics import load_runs
from widenet_ds.report.page import render
from widenet_ds.report.plots import draw_all

PAGE_FILE = "index.html"
MARKER_FILE = "report.json"  # what this report holds; its presence marks the folder as ours to replace
GENERATOR = "widenet-ds report"


def _file_in_the_way(path: Path) -> Path | None:
    """The file at `path` or at the nearest of its parents that exists (a folder cannot be made there)."""
    nearest = next((p for p in (path, *path.parents) if p.exists()), None)
    return nearest if nearest is not None and not nearest.is_dir() else None


def check_output_dir(out: Path) -> None:
    """Refuse a path where no folder can be made, and a folder we would have to overwrite that is not a
    previous report."""
    if (blocking := _file_in_the_way(out)) is not None:
        where = "is a file" if blocking == out else f"is below {blocking}, which is a file"
        raise ConfigError(f"--output {out} {where}; pass a folder (new, empty, or a previous report).")
    if not out.exists():
        return
    entries = sorted(p.name for p in out.iterdir())
    if not entries or _is_report(out):
        return
    shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
    raise ConfigError(f"--output {out} is a non-empty folder that is not a widenet-ds report (it holds {shown}); "
                      f"pass a new or empty folder, or a previous report's folder.")


def _is_report(folder: Path) -> bool:
    try:
        return json.loads((folder / MARKER_FILE).read_text()).get("generator") == GENERATOR
    except (OSError, ValueError, AttributeError):
        return False


def check_table_file(path: Path) -> None:
    if path.is_dir():
        raise ConfigError(f"--branches-table {path} is a folder; pass a file name (Markdown, written whole).")
    if (blocking := _file_in_the_way(path.parent)) is not None:
        raise ConfigError(f"--branches-table {path} is below {blocking}, which is a file; pass a file name in a "
                          f"folder.")


def write_report(sources: list[Path], out: Path, title: str,
                 branches_table: Path | None = None) -> tuple[Path | None, list[str]]:
    """Build the report (and, when asked, the Markdown table of the runs' ParaFormer compression curves);
    returns (the page, or None when no folder was usable; the problems)."""
    out = out.absolute()
    check_output_dir(out)  # before any reading or drawing
    if branches_table is not None:
        check_table_file(branches_table)
    try:
        lock = output_lock(out, GENERATOR).acquire()  # two reports into one folder would swap in each other's
    except OSError as err:
        raise ConfigError(f"--output {out}: cannot create its parent folder ({err.strerror}).") from None
    if lock.takeover_message:
        print(f"{GENERATOR}: {lock.takeover_message}", file=sys.stderr)
    try:
        return _write_report(sources, out, title, branches_table)
    finally:
        lock.release()


def _write_report(sources: list[Path], out: Path, title: str,
                  branches_table: Path | None) -> tuple[Path | None, list[str]]:
    runs, problems = load_runs(sources)
    messages = [str(p) for p in problems] + [f"{run.path}: {note}" for run in runs for note in run.notes]
    if not runs:
        return None, messages
    curves = branch_curves(runs)
    if branches_table is not None and not curves:
        raise ConfigError(f"--branches-table: none of the runs has a score per number of branches (image runs of "
                          f"models with num_branches > 1 write accuracy_by_branches to results.json when they "
                          f"finish; pretraining runs log valid_branches_k/mlm_loss at their end).")
    with atomic_folder(out, overwrite=True) as built:
        plots = draw_all(runs, built)
        (built / PAGE_FILE).write_text(render(runs, problems, plots, title, [str(s) for s in sources]),
                                       encoding="utf-8")
        summary = {"generator": GENERATOR, VERSION_KEY: current("report"), "page": PAGE_FILE,
                   "runs": [{"name": r.name, "kind": r.kind, "path": str(r.path)} for r in runs],
                   "problems": [{"path": str(p.path), "message": p.message} for p in problems],
                   "plots": [{"file": p.file, "title": p.title, "section": p.section} for p in plots]}
        (built / MARKER_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    if branches_table is not None:
        atomic_write_text(branches_table, markdown_table(curves))
    return out / PAGE_FILE, messages


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="widenet-ds report",
        description="An HTML page with plots of pretraining and image-classification runs (losses, accuracy, "
                    "learning rate, throughput, balance loss, dropped routes, expert load per block) overlaid, "
                    "tables of image and finetuning results, and ParaFormer's accuracy (or MLM loss) per number "
                    "of branches kept. Reads folders while they are written; folders that cannot be used are "
                    "listed, not fatal.")
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR",
                        help="pretraining, image-classification or finetuning output folders, or a folder holding "
                             "such folders")
    parser.add_argument("--output", "-o", required=True, type=Path,
                        help="folder for index.html and the PNGs: new, empty, or a previous report (replaced)")
    parser.add_argument("--title", default="WideNet runs", help="the page's title")
    parser.add_argument("--branches-table", type=Path, default=None, metavar="FILE",
                        help="also write the ParaFormer compression curves (test accuracy, or held-out MLM loss, of "
                             "the first k branches; one row per run) to FILE as Markdown tables")
    args = parser.parse_args(argv)
    page, messages = write_report(args.runs, args.output, args.title, args.branches_table)
    for message in messages:
        print(f"widenet-ds report: warning: {message}", file=sys.stderr)
    if page is None:
        print("widenet-ds report: error: none of the folders holds a readable run; pass pretraining or image output "
              "folders (metrics.jsonl) or finetuning output folders (results.json, seed<N>/).", file=sys.stderr)
        return 1
    print(f"report: {page}")
    if args.branches_table is not None:
        print(f"branches table: {args.branches_table}")
    return 0
