"""`widenet-ds report RUN_DIR [RUN_DIR ...] --output DIR`: the page and its plots, written all at once.

The output folder is built beside its final place and swapped in, so a reader never sees half a report,
and a previous report there is replaced whole (no stale plots). A folder holding anything else is
refused: the report never overwrites files it did not write. Folders that cannot be used are listed in
the page and on stderr; the exit status is 1 only when none of them could be used.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from widenet_ds.errors import ConfigError
from widenet_ds.report.metrics import load_runs
from widenet_ds.report.page import render
from widenet_ds.report.plots import draw_all

PAGE_FILE = "index.html"
MARKER_FILE = "report.json"  # what this report holds; its presence marks the folder as ours to replace
GENERATOR = "widenet-ds report"


def check_output_dir(out: Path) -> None:
    """Refuse a folder we would have to overwrite that is not a previous report."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ConfigError(f"--output {out} is a file; pass a folder (new, empty, or a previous report).")
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


def _swap_in(built: Path, out: Path) -> None:
    """Put the finished folder `built` at `out` (replacing an empty folder or a previous report)."""
    if not out.exists():
        os.replace(built, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    os.replace(out, old / out.name)
    os.replace(built, out)
    shutil.rmtree(old)


def write_report(sources: list[Path], out: Path, title: str) -> tuple[Path | None, list[str]]:
    """Build the report; returns (the page, or None when no folder was usable; the problems)."""
    out = out.absolute()
    check_output_dir(out)  # before any reading or drawing
    runs, problems = load_runs(sources)
    messages = [str(p) for p in problems] + [f"{run.path}: {note}" for run in runs for note in run.notes]
    if not runs:
        return None, messages
    out.parent.mkdir(parents=True, exist_ok=True)
    built = Path(tempfile.mkdtemp(prefix=f".{out.name}.new-", dir=out.parent))
    try:
        plots = draw_all(runs, built)
        (built / PAGE_FILE).write_text(render(runs, problems, plots, title, [str(s) for s in sources]),
                                       encoding="utf-8")
        summary = {"generator": GENERATOR, "format_version": 1, "page": PAGE_FILE,
                   "runs": [{"name": r.name, "kind": r.kind, "path": str(r.path)} for r in runs],
                   "problems": [{"path": str(p.path), "message": p.message} for p in problems],
                   "plots": [{"file": p.file, "title": p.title, "section": p.section} for p in plots]}
        (built / MARKER_FILE).write_text(json.dumps(summary, indent=2) + "\n")
        os.chmod(built, 0o755)  # mkdtemp's 0700 would hide the report from other users of a shared machine
        _swap_in(built, out)
    except BaseException:
        shutil.rmtree(built, ignore_errors=True)
        raise
    return out / PAGE_FILE, messages


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="widenet-ds report",
        description="An HTML page with plots of pretraining runs (losses, learning rate, throughput, balance "
                    "loss, dropped routes, expert load per block) overlaid, and tables of finetuning results. "
                    "Reads folders while they are written; folders that cannot be used are listed, not fatal.")
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR",
                        help="pretraining or finetuning output folders, or a folder holding such folders")
    parser.add_argument("--output", "-o", required=True, type=Path,
                        help="folder for index.html and the PNGs: new, empty, or a previous report (replaced)")
    parser.add_argument("--title", default="WideNet runs", help="the page's title")
    args = parser.parse_args(argv)
    page, messages = write_report(args.runs, args.output, args.title)
    for message in messages:
        print(f"widenet-ds report: warning: {message}", file=sys.stderr)
    if page is None:
        print("widenet-ds report: error: none of the folders holds a readable run; pass pretraining output "
              "folders (metrics.jsonl) or finetuning output folders (results.json, seed<N>/).", file=sys.stderr)
        return 1
    print(f"report: {page}")
    return 0
