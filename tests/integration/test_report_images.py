"""`widenet-ds report` on real image-classification runs: widenet-vit-digits (MoE, 20 steps) and a ParaFormer
of 2 branches on digits, each trained on 1 rank (in the test's process, as `widenet_ds.train classify` trains).
The page shows them as image runs: accuracy and loss curves (train and test), learning rate, expert load
per block, results.json's test accuracy, dataset and parameters, and the ParaFormer's accuracy of the first
k branches, number by number against the runs' files, in the HTML and in headless Chromium. A live image
run (no results.json yet) is still an image run."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from PIL import Image

from tests.support.headless_browser import find_chromium, open_page
from tests.support.launching import REPO
from tests.support.pretrain_support import train_in_process
from tests.support.report_page import assert_shows, parse_page, report
from widenet_ds.run_folder import OLD_VISION_CONFIG_FILE, RunFolder
from widenet_ds.tasks.classify.results import ClassifyResults

pytestmark = pytest.mark.slow  # its fixture trains two image runs (~35 s of CPU)

STEPS = 20
IMAGE_PLOTS = {"image_accuracy.png", "image_task_loss.png", "image_lr.png", "image_samples_per_second.png",
               "image_balance_loss.png", "image_dropped_fraction.png", "expert_load_vit.png",
               "accuracy_by_branches.png"}
PARAFORMER = ["--model-config", "paraformer-tiny-3x4", "--set", "image_size=8", "--set", "patch_size=2",
              "--set", "num_layers=4", "--set", "num_branches=2", "--branch-schedule", "prefix",
              "--prefix-cycle-batches", "2"]


def ds_config(template: str, path: Path) -> Path:
    """The CPU config with its schedule fitted to the run (warm-up 2 steps, then decay to 0 at the end)."""
    config = json.loads((REPO / "ds_configs" / template).read_text())
    config["scheduler"]["params"].update(total_num_steps=STEPS, warmup_num_steps=2)
    path.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory, dist):
    """Two 1-rank runs, in this process (the `dist` fixture's group): the report is the subject, not the launcher."""
    root = tmp_path_factory.mktemp("report_images")
    common = ["--dataset", "digits", "--max-steps", str(STEPS), "--log-interval", "5", "--eval-interval", "10",
              "--workers", "0", "--no-progress-bar", "--no-tensorboard"]
    assert train_in_process("classify", [
        "--model-config", "widenet-vit-digits", "--output-dir", str(root / "vit"),
        "--deepspeed_config", str(ds_config("vision_cpu_small.json", root / "ds_vit.json")), *common]) is not None
    assert train_in_process("classify", [
        *PARAFORMER, "--output-dir", str(root / "pf"), "--deepspeed_config",
        str(ds_config("paraformer_cpu_small.json", root / "ds_pf.json")), *common]) is not None
    return {"root": root, "vit": root / "vit", "pf": root / "pf"}


@pytest.fixture(scope="module")
def rendered(runs):
    out = runs["root"] / "report"
    proc = report(runs["vit"], runs["pf"], "--output", out, "--branches-table", runs["root"] / "branches.md")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0] == f"report: {out / 'index.html'}"
    return out


def test_image_runs_are_shown_as_image_runs_with_their_results(runs, rendered):
    summary = json.loads((rendered / "report.json").read_text())
    assert [(r["name"], r["kind"]) for r in summary["runs"]] == [("vit", "classify"), ("pf", "classify")]
    cells = parse_page(rendered / "index.html")
    assert "Image classification" in cells.headings and "Pretraining" not in cells.headings
    assert "Finetuning" not in cells.headings
    for name in ("vit", "pf"):
        results = RunFolder(runs[name]).read_results(ClassifyResults)
        assert results.dataset == "digits" and results.step == STEPS
        for key in ("test/accuracy", "test/task_loss", "test/balance_loss"):
            assert_shows(cells, name, "results", key, results.test[key])
        assert cells.cells[(name, "results", "parameters")] == str(results.parameters)
        assert cells.cells[(name, "last", "step")] == str(STEPS)
        # the last logged value of each series, at the step it was logged
        metrics = RunFolder(runs[name]).read_metrics()
        for key in ("train/accuracy", "test/accuracy", "train/task_loss", "test/task_loss", "optim/lr",
                    "optim/grad_norm", "perf/samples_per_second", "data/epoch"):
            series = metrics.series(key)
            step = max(series)
            assert_shows(cells, name, f"step {step}", key, series[step])
        # two evaluations (step 10 and the end): the test curve has two points
        assert sorted(metrics.series("test/accuracy")) == [10, STEPS]
    page = (rendered / "index.html").read_text()
    assert "digits, widenet-vit-digits: 4 blocks, H 64, patch 2 of 8 px, MoE E=4 K=2" in page
    assert "digits, paraformer-tiny-3x4: 2 branches x 2 blocks, H 64, patch 2 of 8 px, dense FFN" in page


def test_expert_load_per_block_of_the_moe_image_run(runs, rendered):
    cells = parse_page(rendered / "index.html")
    final = [r for r in RunFolder(runs["vit"]).read_metrics().records
             if r["step"] == STEPS and "moe/block_00/expert_00_load" in r][-1]
    for block in range(4):
        loads = [final[f"moe/block_{block:02d}/expert_{e:02d}_load"] for e in range(4)]
        assert sum(loads) == pytest.approx(1.0)
        for e, load in enumerate(loads):
            assert_shows(cells, "vit", f"step {STEPS}", f"moe/block_{block:02d}/expert_{e:02d}_load", load)
    assert not any(key[0] == "pf" and key[2].startswith("moe/") for key in cells.cells)  # dense: no experts


def test_the_paraformer_runs_accuracy_by_branches(runs, rendered):
    cells = parse_page(rendered / "index.html")
    results = RunFolder(runs["pf"]).read_results(ClassifyResults)
    by_branches = results.accuracy_by_branches
    assert sorted(by_branches) == [1, 2] and results.branch_schedule == "prefix"
    assert by_branches[2] == results.accuracy  # all branches: the model
    assert "ParaFormer compression: the first k branches" in cells.headings
    for k in (1, 2):
        assert_shows(cells, "pf", "results", f"accuracy_by_branches/{k}", by_branches[k])
    assert not any(key[0] == "vit" and key[2].startswith("accuracy_by_branches") for key in cells.cells)
    table = (runs["root"] / "branches.md").read_text().splitlines()
    assert table[2:] == ["| run | k = 1 | k = 2 |", "|---|---:|---:|",
                         f"| pf | {by_branches[1]:.4f} | {by_branches[2]:.4f} |"]


def test_every_plot_is_a_real_image_referenced_by_the_page(rendered):
    summary = json.loads((rendered / "report.json").read_text())
    files = {plot["file"] for plot in summary["plots"]}
    assert files == IMAGE_PLOTS
    assert sorted(p.name for p in rendered.iterdir()) == sorted(files | {"index.html", "report.json"})
    assert sorted(parse_page(rendered / "index.html").images) == sorted(files)
    for name in files:
        with Image.open(rendered / name) as image:
            assert image.format == "PNG" and image.width >= 600 and image.height >= 300, (name, image.size)
            colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
            assert colours is None or len(colours) > 20, f"{name} looks blank"
    captions = {p["file"]: p["title"] for p in summary["plots"]}
    assert captions["image_accuracy.png"] == "Accuracy"
    assert 'train/accuracy (solid) and test/accuracy (dashed)' in (rendered / "index.html").read_text()


def test_headless_chromium_shows_the_image_runs(runs, rendered, tmp_path):
    if find_chromium() is None:
        pytest.skip("chromium is not installed (`./launcher.sh test` installs Debian's chromium as root)")
    artifacts = Path(os.environ.get("WIDENET_REPORT_ARTIFACTS", tmp_path))
    screenshot = artifacts / "report_images_screenshot.png"
    visit = open_page(rendered / "index.html", screenshot)
    print(f"\nreport screenshot: {screenshot}")
    assert visit.errors == [] and visit.broken_images == [], visit
    for heading in ("Image classification", "Expert load per block", "ParaFormer compression: the first k branches"):
        assert heading in visit.text
    assert "Pretraining" not in visit.text and "image classification" in visit.text  # the runs table's kind
    for name in ("vit", "pf"):
        accuracy = RunFolder(runs[name]).read_results(ClassifyResults).accuracy
        assert f"{accuracy:.4f}" in visit.text
    with Image.open(screenshot) as image:
        assert image.width == 1280 and image.height == visit.height > 2000


def test_a_live_image_run_is_an_image_run_with_its_last_evaluation(runs, tmp_path):
    """Before results.json: the task comes from run_config.json (or, in older folders, vision_config.json)
    and the test accuracy from the last evaluation logged."""
    lines = RunFolder(runs["vit"]).metrics.read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if json.loads(line).get("step") == 15)
    for layout in ("old", "new"):
        live = RunFolder(tmp_path / f"live-{layout}")
        live.path.mkdir()
        if layout == "old":  # an image run of an older version: the model config was vision_config.json
            shutil.copy(RunFolder(runs["vit"]).model_config, live.path / OLD_VISION_CONFIG_FILE)
        else:  # this version's: model_config.json, and the task and settings in run_config.json
            for file in (RunFolder(runs["vit"]).model_config, RunFolder(runs["vit"]).run_config):
                shutil.copy(file, live.path)
        live.metrics.write_text("".join(lines[:cut]) + lines[cut][: len(lines[cut]) // 2])
        out = tmp_path / f"report-{layout}"
        proc = report(live.path, "--output", out)
        assert proc.returncode == 0, proc.stderr
        assert "still being written" in proc.stderr and "no results.json yet" in proc.stderr
        summary = json.loads((out / "report.json").read_text())
        assert summary["runs"] == [{"name": live.path.name, "kind": "classify", "path": str(live.path)}]
        cells = parse_page(out / "index.html")
        evaluation = [r for r in RunFolder(runs["vit"]).read_metrics().records if r["step"] == 10
                      and "test/accuracy" in r][-1]
        assert_shows(cells, live.path.name, "step 10", "test/accuracy", evaluation["test/accuracy"])
        assert cells.cells[(live.path.name, "last", "step")] == "10"
        page = (out / "index.html").read_text()
        assert "being written (live)" in page
        if layout == "new":  # what the run was started with, before results.json says it
            assert "digits, widenet-vit-digits: 4 blocks" in page
        assert "image_accuracy.png" in cells.images


def test_a_hand_edited_image_folder_is_reported_not_fatal(runs, tmp_path):
    """A value of the wrong type in results.json: a note naming the file and the key, and the run shown from its
    log as before results.json; a model config of wrong types: the model is not described. Never a crash."""
    edited = RunFolder(tmp_path / "edited")
    shutil.copytree(runs["pf"], edited.path)
    written = json.loads(edited.results.read_text())
    edited.results.write_text(json.dumps({**written, "test/accuracy": "high"}))
    edited.model_config.write_text(json.dumps({"num_branches": "2", "num_layers": 4, "moe": 1}))
    out = tmp_path / "report"
    proc = report(edited.path, "--output", out)
    assert proc.returncode == 0, proc.stderr
    assert f"{edited.results}: image-classification results: 'test/accuracy' is 'high', not a number" in proc.stderr
    cells = parse_page(out / "index.html")
    assert not any(key[0] == "edited" and key[1] == "results" for key in cells.cells)
    logged = edited.read_metrics().series("test/accuracy")
    assert_shows(cells, "edited", f"step {STEPS}", "test/accuracy", logged[STEPS])
    assert "edited" in (out / "index.html").read_text() and "2 branches x" not in (out / "index.html").read_text()
