"""`widenet-ds report` (widenet_ds/report/cli.py) in this process: the output folder written whole with its
report.json, a previous report replaced, every other folder refused untouched, the exit status when nothing
is usable, and the ParaFormer table file. (tests/integration/test_report.py runs the command on real runs.)"""

from __future__ import annotations

import json

import pytest

from widenet_ds.errors import ConfigError
from widenet_ds.report.cli import cli

from tests.support.run_folders import finetune_folder, image_folder, write_jsonl


def small_run(path):
    """A pretraining log of one series: one plot to draw."""
    return write_jsonl(path / "metrics.jsonl", [{"step": 1, "optim/lr": 1e-4}, {"step": 2, "optim/lr": 2e-4}]).parent


def test_the_report_folder_holds_the_page_its_plots_and_what_it_shows(tmp_path, capsys):
    run, out = small_run(tmp_path / "pre"), tmp_path / "report"
    assert cli([str(run), str(tmp_path / "missing"), "--output", str(out), "--title", "mine"]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"report: {out / 'index.html'}\n"
    # the folders not used, then the runs' notes
    assert captured.err.splitlines() == [f"widenet-ds report: warning: {tmp_path / 'missing'}: does not exist",
                                         f"widenet-ds report: warning: {run}: no model_config.json: the model is not "
                                         f"shown"]
    assert sorted(p.name for p in out.iterdir()) == ["index.html", "lr.png", "report.json"]
    summary = json.loads((out / "report.json").read_text())
    assert summary["generator"] == "widenet-ds report" and summary["page"] == "index.html"
    assert summary["runs"] == [{"name": "pre", "kind": "pretrain", "path": str(run)}]
    assert summary["problems"] == [{"path": str(tmp_path / "missing"), "message": "does not exist"}]
    assert [p["file"] for p in summary["plots"]] == ["lr.png"]
    assert "<title>mine</title>" in (out / "index.html").read_text()


def test_a_previous_report_is_replaced_whole_and_any_other_folder_refused(tmp_path, capsys):
    run, out = small_run(tmp_path / "pre"), tmp_path / "report"
    assert cli([str(run), "--output", str(out)]) == 0
    (out / "old_plot.png").write_bytes(b"stale")
    assert cli([str(finetune_folder(tmp_path / "ft")), "--output", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["finetune_loss.png", "index.html", "report.json"]

    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "thesis.tex").write_text("mine")
    with pytest.raises(ConfigError, match="is a non-empty folder that is not a widenet-ds report .it holds thesis.tex"):
        cli([str(run), "--output", str(mine)])
    (mine / "report.json").write_text('{"generator": "something else"}')
    with pytest.raises(ConfigError, match="not a widenet-ds report"):
        cli([str(run), "--output", str(mine)])
    assert sorted(p.name for p in mine.iterdir()) == ["report.json", "thesis.tex"]
    for output, why in ((mine / "thesis.tex", "is a file"), (mine / "thesis.tex" / "sub", "which is a file")):
        with pytest.raises(ConfigError, match=why):
            cli([str(run), "--output", str(output)])
    assert (mine / "thesis.tex").read_text() == "mine"


def test_nothing_usable_exits_1_and_writes_nothing(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli([str(empty), "--output", str(tmp_path / "report")]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"widenet-ds report: warning: {empty}: not a run folder")
    assert err[1].startswith("widenet-ds report: error: none of the folders holds a readable run")
    assert not (tmp_path / "report").exists()


def test_the_branches_table_is_written_beside_the_report(tmp_path, capsys):
    images, table = image_folder(tmp_path / "img"), tmp_path / "tables" / "branches.md"
    table.parent.mkdir()
    assert cli([str(images), "--output", str(tmp_path / "report"), "--branches-table", str(table)]) == 0
    assert capsys.readouterr().out.splitlines()[1] == f"branches table: {table}"
    assert table.read_text().splitlines()[2:] == ["| run | k = 1 | k = 2 |", "|---|---:|---:|",
                                                  "| img | 0.1500 | 0.1361 |"]
    # a run without branches has no curve to tabulate; a folder is no table file: refused, nothing written
    with pytest.raises(ConfigError, match="none of the runs has a score per number of branches"):
        cli([str(small_run(tmp_path / "pre")), "--output", str(tmp_path / "r2"), "--branches-table",
             str(tmp_path / "t.md")])
    with pytest.raises(ConfigError, match="is a folder; pass a file name"):
        cli([str(images), "--output", str(tmp_path / "r3"), "--branches-table", str(table.parent)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["img", "pre", "report", "tables"]
