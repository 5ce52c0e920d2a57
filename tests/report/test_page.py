"""The report's HTML (widenet_ds/report/page.py) rendered from run folders built here: every number cell read
back by its (run, row, key) and compared with the folder's files, the runs' states, the folders not used, and
names that need escaping."""

from __future__ import annotations

import json
import math

import pytest

from widenet_ds.report.metrics import load_runs
from widenet_ds.report.page import fmt, render
from widenet_ds.report.plots import Plot
from widenet_ds.run_folder import RunFolder
from widenet_ds.tasks.finetune.results import FinetuneResults, SeedResults

from tests.support.report_page import Cells, assert_shows
from tests.support.run_folders import BEFORE, finetune_folder, image_folder, pretrain_folder


def page(paths, plots=(), title="runs") -> tuple[str, Cells]:
    runs, problems = load_runs(paths)
    text = render(runs, problems, list(plots), title, [str(p) for p in paths])
    cells = Cells()
    cells.feed(text)
    return text, cells


@pytest.mark.parametrize(("value", "shown"), [
    (3, "3"), (135370, "135370"), (0.5, "0.5000"), (2.0e-4, "2.000e-04"), (0.0, "0.0000"), (1234.56, "1234.6"),
    (-0.25, "-0.2500"), (None, "–"), (True, "–"), ("0.5", "–"), (math.nan, "nan")])
def test_numbers_are_shown_to_4_decimals_or_4_significant_digits(value, shown):
    assert fmt(value) == shown


def test_every_number_cell_is_the_value_of_its_run_row_and_key(tmp_path):
    pre, img, ft = pretrain_folder(tmp_path / "pre"), image_folder(tmp_path / "img"), finetune_folder(tmp_path / "ft")
    _, cells = page([pre, img, ft])
    # pretraining: the last value of each series at its step; expert load and drops at the last routed step
    assert_shows(cells, "pre", "step 4", "train/mlm_loss", 8.25)
    assert cells.cells[("pre", "step 4", "optim/lr")] == "2.000e-04"
    assert cells.cells[("pre", "none", "train/sop_loss")] == "–"
    assert_shows(cells, "pre", "step 4", "moe/block_01/expert_01_load", 0.75)
    assert_shows(cells, "pre", "step 4", "moe/block_00/dropped_fraction", 0.25)
    # the image run's results.json (results_before/classify.json)
    classify = json.loads((BEFORE / "classify.json").read_text())
    for key in ("test/accuracy", "test/task_loss", "test/balance_loss"):
        assert_shows(cells, "img", "results", key, classify[key])
    assert cells.cells[("img", "results", "parameters")] == "135370"
    assert_shows(cells, "img", "results", "accuracy_by_branches/1", 0.15)
    # finetuning (results_before/finetune.json): the median, each seed, the majority-class baseline
    assert_shows(cells, "ft", "median", "dev/acc", 0.5)
    assert_shows(cells, "ft", "seed1234", "dev/acc", 0.4375)
    assert_shows(cells, "ft", "seed1235", "dev/acc", 0.5625)
    assert_shows(cells, "ft", "baseline", "dev/acc", 0.5625)
    assert [cells.cells[(run, "last", "step")] for run in ("pre", "img", "ft")] == ["4", "4", "2"]
    assert cells.headings == ["Runs", "Pretraining", "Image classification", "Expert load per block",
                              "ParaFormer compression: the first k branches", "Test accuracy",
                              "Held-out mlm loss", "Finetuning", "ft: SST-2"]


def test_a_running_finetuning_run_shows_the_median_so_far(tmp_path):
    _, cells = page([finetune_folder(tmp_path / "ft", results=False)])
    assert_shows(cells, "ft", "median", "dev/acc", 0.5)  # of 0.4375 and 0.5625
    assert_shows(cells, "ft", "median", "dev/f1", 0.25)
    assert ("ft", "baseline", "dev/acc") not in cells.cells
    assert cells.cells[("ft", "last", "step")] == "2"


def test_states_problems_and_notes_are_shown_escaped(tmp_path):
    finished = pretrain_folder(tmp_path / "a<b>")
    live = pretrain_folder(tmp_path / "live")
    with open(live / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 5, "tra')
    stopped = pretrain_folder(tmp_path / "stopped")
    lines = (stopped / "metrics.jsonl").read_text().splitlines()
    (stopped / "metrics.jsonl").write_text("\n".join(line for line in lines if "checkpoint saved" not in line) + "\n")
    text, cells = page([finished, live, stopped, tmp_path / "missing"], title="<mine>")
    assert "<title>&lt;mine&gt;</title>" in text and "<h1>&lt;mine&gt;</h1>" in text
    assert "a<b>" not in text and "<td>a&lt;b&gt;</td><td>pretraining</td>" in text
    assert ("a<b>", "step 4", "train/mlm_loss") in cells.cells  # parsed back to the run's own name
    rows = {name: text.split(f"<td>{name}</td><td>pretraining</td>")[1].split("</tr>")[0]
            for name in ("a&lt;b&gt;", "live", "stopped")}
    assert "<td>finished" in rows["a&lt;b&gt;"] and "<td>being written (live)" in rows["live"]
    assert "<td>running or stopped" in rows["stopped"]
    assert "the last line is still being written" in rows["live"]
    assert '<div class="problems" id="problems"><b>Folders not used:</b><ul><li><code>missing' \
           "</code>: does not exist</li></ul></div>" in text  # (the runs' common folder is the test's own)
    assert str(tmp_path) not in text


def test_each_plot_is_a_figure_in_its_own_section(tmp_path):
    plots = [Plot("mlm_loss.png", "Masked-LM loss", "`train/mlm_loss` <solid>", "pretrain"),
             Plot("image_accuracy.png", "Accuracy", "test", "classify"),
             Plot("expert_load_pre.png", "Expert load: pre", "load", "experts"),
             Plot("finetune_loss.png", "Finetuning loss", "loss", "finetune")]
    text, cells = page([pretrain_folder(tmp_path / "pre"), image_folder(tmp_path / "img"),
                        finetune_folder(tmp_path / "ft")], plots)
    assert cells.images == ["mlm_loss.png", "image_accuracy.png", "expert_load_pre.png", "finetune_loss.png"]
    sections = {h: text.index(f">{h}</h2>") for h in ("Pretraining", "Image classification",
                                                        "Expert load per block", "Finetuning")}
    assert sections["Pretraining"] < text.index("mlm_loss.png") < sections["Image classification"]
    assert sections["Expert load per block"] < text.index("expert_load_pre.png")
    assert sections["Finetuning"] < text.index("finetune_loss.png")
    # the caption without its backticks, escaped
    assert "<figcaption>train/mlm_loss &lt;solid&gt;</figcaption>" in text
    # the pretraining run's expert-load table follows its figure; the image run logged no routing: neither
    assert text.index("expert_load_pre.png") < text.index("<p>pre, step 4: share of each block's routes")
    assert "<p>img, step" not in text and not any(key[0] == "img" and "moe/" in key[2] for key in cells.cells)


def test_one_checkpoint_named_two_ways_is_one_row_and_no_machine_path_is_shown(tmp_path):
    """The demo names its start checkpoint absolute, a user's command relative (an older run recorded it as typed;
    its run_config.json holds it absolute): one model, one row of the Finetuning table; every path on the page is
    relative to the folder holding the runs, never this machine's."""
    start = tmp_path / "runs" / "demo" / "pretrain-300steps"
    for name, task, kind, init, metrics in (
            ("sst2", "SST-2", "glue", str(start), {"dev": {"acc": 0.7}}),
            ("squad", "SQuAD1.1", "squad", "runs/demo/pretrain-300steps", {"dev": {"exact_match": 3.0, "f1": 7.0}})):
        folder = RunFolder(tmp_path / "runs" / name)
        folder.path.mkdir(parents=True)
        folder.write_run_config({"task": kind, "init_from": str(start)})
        seed = SeedResults(1, metrics)
        folder.write_results(FinetuneResults(task, init, 4, 1, metrics, [seed], seed=1,
                                             primary_metric=next(iter(metrics["dev"]))))
    runs, problems = load_runs([tmp_path / "runs" / "sst2", tmp_path / "runs" / "squad"])
    assert [run.init for run in runs] == [str(start)] * 2
    text = render(runs, problems, [], "runs", [str(tmp_path / "runs" / "sst2"), str(tmp_path / "runs" / "squad")])
    summary = text.split("by initialisation.</p>", 1)[1].split("</table>", 1)[0]
    assert summary.count("<tr><td><code>") == 1 and "<code>demo/pretrain-300steps</code>" in summary, summary
    assert str(tmp_path) not in text and "(paths in runs/)" in text
    assert "<td><code>sst2</code></td>" in text  # the runs' folders, by name
