"""`widenet-ds report` on real run folders: a tiny widenet-tiny-e4 pretraining (1 rank, 6 steps) and its
SST-2 finetuning (2 seeds, 4 steps). The page's tables are checked number by number against the runs'
metrics.jsonl and results.json, every plot file is a real image, headless Chromium opens the page without
errors (the screenshot is kept: $WIDENET_REPORT_ARTIFACTS, default the test's tmp folder), and bad,
partial and live folders are reported instead of crashing."""

from __future__ import annotations

import html
import json
import os
import shutil
from pathlib import Path

import pytest
from PIL import Image

from tests.support.golden_curves import VOCAB
from tests.support.headless_browser import find_chromium, open_page
from tests.support.launching import REPO
from tests.support.pretrain_support import BOOKS, CPU_CONFIG, prepare_data, train_in_process, write_model_config
from tests.support.report_page import assert_shows, parse_page, report
from widenet_ds.run_folder import RunFolder
from widenet_ds.tasks.finetune.results import FinetuneResults

pytestmark = pytest.mark.slow  # its fixtures train a pretraining, a finetuning and a ParaFormer run (~100 s of CPU)

FINETUNE_CONFIG = REPO / "ds_configs" / "finetune_cpu_small.json"
PRETRAIN_STEPS, FINETUNE_STEPS = 6, 4
EXPECTED_PLOTS = {"mlm_loss.png", "sop_loss.png", "lr.png", "tokens_per_second.png", "balance_loss.png",
                  "dropped_fraction.png", "expert_load_pretrain.png", "finetune_loss.png"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shared_data, dist):
    """A real pretraining folder and a real finetuning folder started from it (one process, 1 rank)."""
    root = tmp_path_factory.mktemp("report")
    data = prepare_data(root / "data", [shared_data / BOOKS[0]])
    pre = root / "pretrain"
    assert train_in_process("pretrain", [
        "--model-config", "widenet-tiny-e4", "--deepspeed_config", str(CPU_CONFIG), "--data", str(data),
        "--output-dir", str(pre), "--max-steps", str(PRETRAIN_STEPS), "--log-interval", "1",
        "--eval-interval", "3", "--eval-batches", "2", "--save-interval", str(PRETRAIN_STEPS),
        "--no-progress-bar", "--no-tensorboard"]) is not None
    ft = root / "sst2"
    assert train_in_process("glue", [
        "--task", "sst2", "--data", str(shared_data / "glue/SST-2"), "--init-from", str(pre), "--tokenizer", str(data),
        "--deepspeed_config", str(FINETUNE_CONFIG), "--output-dir", str(ft), "--max-steps", str(FINETUNE_STEPS),
        "--seeds", "2", "--max-train-examples", "128", "--max-eval-examples", "64", "--max-seq-length", "64",
        "--log-interval", "1", "--allow-recipe-mismatch", "--no-tensorboard", "--no-progress-bar"]) is not None
    return {"root": root, "pretrain": pre, "finetune": ft}


@pytest.fixture(scope="module")
def rendered(runs):
    out = runs["root"] / "report"
    proc = report(runs["pretrain"], runs["finetune"], "--output", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == f"report: {out / 'index.html'}"
    return out


def test_tables_show_the_runs_numbers(runs, rendered):
    cells = parse_page(rendered / "index.html")
    scalars = RunFolder(runs["pretrain"]).read_metrics().records
    # the last value of each pretraining series, at the step it was logged
    for key in ("train/mlm_loss", "valid/mlm_loss", "train/sop_loss", "valid/sop_loss", "train/mlm_accuracy",
                "train/balance_loss", "optim/lr", "perf/tokens_per_second"):
        last = [r for r in scalars if key in r][-1]
        assert_shows(cells, "pretrain", f"step {last['step']}", key, last[key])
    assert cells.cells[("pretrain", "last", "step")] == str(PRETRAIN_STEPS)
    # expert load of each of the 4 blocks (each routes on its own) at the last step; shares sum to 1
    final = [r for r in scalars if r["step"] == PRETRAIN_STEPS and "moe/block_00/expert_00_load" in r][-1]
    for block in range(4):
        loads = [final[f"moe/block_{block:02d}/expert_{e:02d}_load"] for e in range(4)]
        assert sum(loads) == pytest.approx(1.0)
        for e, load in enumerate(loads):
            assert_shows(cells, "pretrain", f"step {PRETRAIN_STEPS}", f"moe/block_{block:02d}/expert_{e:02d}_load",
                         load)
        key = f"moe/block_{block:02d}/dropped_fraction"
        assert_shows(cells, "pretrain", f"step {PRETRAIN_STEPS}", key, final[key])
    # finetuning: the median, each seed and the majority-class baseline, from results.json
    results = RunFolder(runs["finetune"]).read_results(FinetuneResults)
    assert results.median["dev"]["acc"] is not None
    # the start recorded resolved: the tag folder the run folder's `latest` named, absolute
    assert results.init == str((runs["pretrain"] / "checkpoints" / f"step{PRETRAIN_STEPS}").resolve())
    assert_shows(cells, "sst2", "median", "dev/acc", results.median["dev"]["acc"])
    for seed_run in results.per_seed:
        assert_shows(cells, "sst2", f"seed{seed_run.seed}", "dev/acc", seed_run.metrics["dev"]["acc"])
    assert_shows(cells, "sst2", "baseline", "dev/acc", results.baseline["dev"]["acc"])
    assert cells.cells[("sst2", "last", "step")] == str(FINETUNE_STEPS)


def test_every_plot_is_a_real_image_referenced_by_the_page(rendered):
    summary = json.loads((rendered / "report.json").read_text())
    files = {plot["file"] for plot in summary["plots"]}
    assert files == EXPECTED_PLOTS
    assert sorted(p.name for p in rendered.iterdir()) == sorted(files | {"index.html", "report.json"})
    assert sorted(parse_page(rendered / "index.html").images) == sorted(files)
    for name in files:
        with Image.open(rendered / name) as image:
            assert image.format == "PNG" and image.width >= 600 and image.height >= 300, (name, image.size)
            colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
            assert colours is None or len(colours) > 20, f"{name} looks blank"
    # the heatmap has one panel per routed block: taller than a plain curve plot
    with Image.open(rendered / "expert_load_pretrain.png") as heatmap, Image.open(rendered / "lr.png") as curve:
        assert heatmap.height > curve.height


def test_headless_chromium_opens_the_page_without_errors(rendered, tmp_path):
    if find_chromium() is None:
        pytest.skip("chromium is not installed (`./launcher.sh test` installs Debian's chromium as root)")
    artifacts = Path(os.environ.get("WIDENET_REPORT_ARTIFACTS", tmp_path))
    screenshot = artifacts / "report_screenshot.png"
    visit = open_page(rendered / "index.html", screenshot)
    print(f"\nreport screenshot: {screenshot}")
    assert visit.errors == [] and visit.broken_images == [], visit
    assert visit.title == "WideNet runs"
    with Image.open(screenshot) as image:
        assert image.width == 1280 and image.height == visit.height > 2000


def test_rerun_replaces_a_previous_report_and_refuses_other_folders(runs, rendered, tmp_path):
    stale = rendered / "old_plot.png"
    shutil.copy(rendered / "lr.png", stale)
    proc = report(runs["pretrain"], "--output", rendered)  # a previous report: replaced whole
    assert proc.returncode == 0, proc.stderr
    assert not stale.exists() and not (rendered / "finetune_loss.png").exists()
    rendered_again = report(runs["pretrain"], runs["finetune"], "--output", rendered)
    assert rendered_again.returncode == 0

    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "thesis.tex").write_text("mine")
    proc = report(runs["pretrain"], "--output", mine)
    assert proc.returncode == 2
    assert "not a widenet-ds report" in proc.stderr and "thesis.tex" in proc.stderr
    assert sorted(p.name for p in mine.iterdir()) == ["thesis.tex"] and (mine / "thesis.tex").read_text() == "mine"


def test_bad_and_partial_folders_are_listed_not_fatal(runs, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    broken = tmp_path / "broken_finetune"
    broken.mkdir()
    (broken / "results.json").write_text('{"task": "SST-2", "median": ')
    no_metrics = tmp_path / "no_metrics"
    no_metrics.mkdir()
    shutil.copy(runs["pretrain"] / "model_config.json", no_metrics)
    garbled = tmp_path / "garbled"
    garbled.mkdir()
    (garbled / "metrics.jsonl").write_text("not json\n\x00\x01\n")
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    bad = [empty, broken, no_metrics, garbled, a_file, tmp_path / "missing"]

    out = tmp_path / "report"
    proc = report(runs["pretrain"], *bad, "--output", out)
    assert proc.returncode == 0, proc.stderr
    page = html.unescape((out / "index.html").read_text())
    for path, why in ((empty, "not a run folder"), (broken, "results.json (the run's results) is not valid JSON"),
                      (no_metrics, "without metrics.jsonl"), (garbled, "no readable record"),
                      (a_file, "is not a folder"), (tmp_path / "missing", "does not exist")):
        assert f"{path}: " in proc.stderr and why in proc.stderr, (path, why, proc.stderr)
        assert f"{path.name}</code>: " in page and why in page
    assert str(tmp_path) not in page  # each folder by its path under the runs' common folder, none of this machine
    assert json.loads((out / "report.json").read_text())["runs"][0]["name"] == "pretrain"

    # nothing usable at all: exit 1, and no output written
    proc = report(*bad, "--output", tmp_path / "nothing")
    assert proc.returncode == 1 and "none of the folders holds a readable run" in proc.stderr
    assert not (tmp_path / "nothing").exists()


def test_a_live_run_is_read_up_to_its_partial_last_line(runs, tmp_path):
    lines = (runs["pretrain"] / "metrics.jsonl").read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if json.loads(line)["step"] == 4)
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(runs["pretrain"] / "model_config.json", live)
    (live / "metrics.jsonl").write_text("".join(lines[:cut]) + lines[cut][: len(lines[cut]) // 2])
    out = tmp_path / "report"
    proc = report(live, "--output", out)
    assert proc.returncode == 0, proc.stderr
    assert "still being written" in proc.stderr
    cells = parse_page(out / "index.html")
    assert cells.cells[("live", "last", "step")] == "3"
    last = json.loads(lines[cut - 1]) if "train/mlm_loss" in lines[cut - 1] else None
    shown_mlm = [k for k in cells.cells if k[0] == "live" and k[2] == "train/mlm_loss"]
    assert shown_mlm == [("live", "step 3", "train/mlm_loss")]
    expected = last or [json.loads(x) for x in lines[:cut] if "train/mlm_loss" in x][-1]
    assert_shows(cells, "live", "step 3", "train/mlm_loss", expected["train/mlm_loss"])

    # the run goes on: the rest of the line and the steps after it arrive; the same report folder updates
    (live / "metrics.jsonl").write_text("".join(lines))
    proc = report(live, "--output", out)
    assert proc.returncode == 0 and "still being written" not in proc.stderr
    assert parse_page(out / "index.html").cells[("live", "last", "step")] == str(PRETRAIN_STEPS)


def test_the_same_folder_twice_is_shown_once_with_a_note(runs, tmp_path):
    out = tmp_path / "report"
    # the folder itself, again by another spelling, and through its parent (which also holds the finetuning)
    proc = report(runs["pretrain"], runs["pretrain"].parent / "." / "pretrain", runs["root"], "--output", out)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "report.json").read_text())
    names = [r["name"] for r in summary["runs"]]
    assert names.count("pretrain") == 1 and "sst2" in names, names
    assert "given 3 times" in proc.stderr and "shown once" in proc.stderr
    assert "given 3 times" in (out / "index.html").read_text()
    assert sorted(parse_page(out / "index.html").images).count("expert_load_pretrain.png") == 1


def test_output_below_a_file_and_bad_table_paths_are_one_clear_error(runs, tmp_path):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    for output, why in ((a_file, f"--output {a_file} is a file"),
                        (a_file / "report", f"is below {a_file}, which is a file")):
        proc = report(runs["pretrain"], "--output", output)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("widenet-ds report: error: --output") and why in lines[0], lines
    assert a_file.read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    proc = report(runs["pretrain"], "--output", tmp_path / "report", "--branches-table", a_file / "table.md")
    assert proc.returncode == 2 and "which is a file" in proc.stderr
    # a run without branches has no compression curve: nothing to tabulate, and nothing written
    proc = report(runs["pretrain"], "--output", tmp_path / "report", "--branches-table", tmp_path / "table.md")
    assert proc.returncode == 2 and "none of the runs has a score per number of branches" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


@pytest.fixture(scope="module")
def text_branches(tmp_path_factory, shared_data, dist):
    """A real pretraining of WideNet x ParaFormer (2 branches of 2 blocks): its log ends with the held-out MLM
    loss of the first k branches."""
    # A wide initialisation: with pre-norm blocks at the default 0.02, each branch adds so little to the residual
    # stream that the final LayerNorm of 1 and of 2 summed branches agrees to ~1e-6 after 4 steps (equal to the
    # bit in one full-suite run), and the report's two columns could not be told apart. And a fixed vocabulary:
    # with a trained one (not deterministic: the tokenizers trainer orders equal-count entries by hash) the data,
    # hence the gap between the two losses, changed from run to run (4.8e-3, 1.3e-2, 3.4e-5 in three runs at
    # init 0.5); with this vocabulary it is 1.9e-2 in every run.
    root = tmp_path_factory.mktemp("branches")
    data = prepare_data(root / "data", [shared_data / BOOKS[0]], tokenizer=str(VOCAB))
    model = write_model_config(root / "pf_model.json", "widenet-tiny-e4", norm_position="pre", num_branches=2,
                               initializer_range=0.5)
    out = root / "pf-text"
    assert train_in_process("pretrain", [
        "--model-config", str(model), "--deepspeed_config", str(CPU_CONFIG), "--data", str(data),
        "--output-dir", str(out), "--max-steps", "4", "--log-interval", "2", "--eval-interval", "4",
        "--eval-batches", "2", "--no-progress-bar", "--no-tensorboard"]) is not None
    return out


def test_text_paraformer_shows_the_mlm_loss_of_the_first_k_branches(text_branches, tmp_path):
    out, table = tmp_path / "report", tmp_path / "branches.md"
    proc = report(text_branches, "--output", out, "--branches-table", table)
    assert proc.returncode == 0, proc.stderr
    per_k = {k: RunFolder(text_branches).read_metrics().series(f"valid_branches_{k}/mlm_loss")[4] for k in (1, 2)}
    assert abs(per_k[1] - per_k[2]) > 1e-3  # distinct in the table's 4 decimals
    cells = parse_page(out / "index.html")
    assert "ParaFormer compression: the first k branches" in cells.headings
    for k, loss in per_k.items():
        assert_shows(cells, "pf-text", "step 4", f"valid_branches_{k}/mlm_loss", loss)
    assert "mlm_loss_by_branches.png" in cells.images
    assert table.read_text().splitlines()[2:] == [
        "| run | k = 1 | k = 2 |", "|---|---:|---:|", f"| pf-text | {per_k[1]:.4f} | {per_k[2]:.4f} |"]


def test_squad_scores_show_their_percent_scale_beside_fractions(tmp_path):
    """Item 6: SQuAD's official scores are percentages, GLUE's fractions: the page's columns say which (as each
    run's task, named in its run_config.json, gives the scale)."""
    from widenet_ds.tasks.finetune.results import SeedResults

    for name, task, metrics in (("squad", "SQuAD1.1", {"dev": {"exact_match": 0.3333, "f1": 4.2706}}),
                                ("sst2", "SST-2", {"dev": {"acc": 0.7}})):
        folder = RunFolder(tmp_path / name)
        folder.path.mkdir()
        folder.write_run_config({"task": "squad" if name == "squad" else "glue"})
        seed = SeedResults(1, metrics)
        folder.write_results(FinetuneResults(task, "preset:widenet-tiny-e4", 4, 1, metrics, [seed], seed=1,
                                             primary_metric=next(iter(metrics["dev"]))))
        folder.seed(1).path.mkdir()
        folder.seed(1).write_results(seed)
    proc = report(tmp_path / "squad", tmp_path / "sst2", "--output", tmp_path / "page")
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = (tmp_path / "page" / "index.html").read_text()
    assert "dev/exact_match <small>(0-100)</small>" in page and "dev/f1 <small>(0-100)</small>" in page
    assert "dev/acc <small>(0-1)</small>" in page


def test_edited_results_are_said_not_shown_silently(runs, tmp_path):
    """A finetuning median edited to a text, a seed count of -3, a pretraining results.json whose held-out loss is
    not the one logged: each one note (stderr and page), not a silent gap or a number shown as written."""
    text_median = shutil.copytree(runs["finetune"], tmp_path / "text_median")
    results = json.loads((text_median / "results.json").read_text())
    metric = next(iter(results["median"]["dev"]))
    results["median"]["dev"][metric] = str(results["median"]["dev"][metric])
    (text_median / "results.json").write_text(json.dumps(results))
    negative = shutil.copytree(runs["finetune"], tmp_path / "negative_seeds")
    results = json.loads((negative / "results.json").read_text())
    results["seeds"] = -3
    (negative / "results.json").write_text(json.dumps(results))
    edited = shutil.copytree(runs["pretrain"], tmp_path / "edited_pretrain")
    results = json.loads((edited / "results.json").read_text())
    results["valid/mlm_loss"] = 0.125
    (edited / "results.json").write_text(json.dumps(results))

    out = tmp_path / "report"
    proc = report(text_median, negative, edited, "--output", out)
    assert proc.returncode == 0, proc.stderr
    page = html.unescape((out / "index.html").read_text())
    for why in (f"median dev/{metric} is '", "not a number: not shown",
                "'seeds' is -3, not a count of seeds (1 or more)",
                "valid/mlm_loss 0.125 at step 6 is not the"):
        assert why in proc.stderr and why in page, (why, proc.stderr[-3000:])
