"""scripts/image_study.py end to end at a few steps on the real Fashion-MNIST files: every model trained with the
same seeds, the schedules really run (prefix: nested prefixes; joint: every branch), the compression curve's last
point is the full model's accuracy, the paired differences and tables hold the numbers the runs wrote, the archive
copies them, and a re-run continues instead of retraining."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from tests.support.launching import REPO
from widenet_ds.report.paired import format_interval, paired_difference
from widenet_ds.run_folder import RunFolder
from widenet_ds.tasks.classify.config import ClassifyConfig
from widenet_ds.tasks.classify.results import ClassifyResults
from widenet_ds.training.command_line import parse
from widenet_ds.vision.datasets import DEBIAN_FASHION_MNIST

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not DEBIAN_FASHION_MNIST.is_dir(), reason="Debian's dataset-fashion-mnist is not installed "
    "(`./launcher.sh test` installs it)")]
SEEDS = (1234, 1235)
MODELS = ("widenet", "widenet-shared-ln", "vit12", "pf-3x4-prefix", "pf-3x4-joint")
STEPS = 8


def load_image_study():
    sys.path.insert(0, str(REPO / "scripts"))  # it imports study.py beside it, as when run as a script
    spec = importlib.util.spec_from_file_location("image_study_script", REPO / "scripts" / "image_study.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def run(module, out) -> None:
    assert module.main(["--output", str(out), "--steps", str(STEPS), "--paraformer-steps", str(STEPS), "--seeds",
                        str(len(SEEDS)), "--jobs", "2", "--max-eval-examples", "128", "--models", *MODELS,
                        "--archive", str(out / "archive")]) == 0


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    module = load_image_study()
    out = tmp_path_factory.mktemp("image_study")
    run(module, out)
    return module, out, json.loads((out / "image_study.json").read_text())


def results(out, part: str, model: str, seed: int) -> ClassifyResults:
    return RunFolder(out / part / f"{model}-seed{seed}").read_results(ClassifyResults)


def test_every_model_is_trained_with_every_seed_and_reports_its_runs_numbers(study):
    _, out, data = study
    assert sorted((r["model"], r["seed"]) for r in data["runs"]) == sorted((m, s) for m in MODELS for s in SEEDS)
    for run in data["runs"]:
        # the recorded command (defaults left out) parses back to the run's settings
        assert run["command"][:3] == ["-m", "widenet_ds.train", "classify"]
        assert parse(ClassifyConfig, run["command"][3:]).seed == run["seed"]
        assert run["test_accuracy"] == pytest.approx(100 * results(out, run["part"], run["model"], run["seed"])
                                                     .accuracy)
        assert run["commit"] != "unknown"


def test_table3_models_are_tested_four_times_and_the_last_point_is_the_final_accuracy(study):
    _, _, data = study
    for run in (r for r in data["runs"] if r["part"] == "table3"):
        assert [step for step, _ in run["curve"]] == [2, 4, 6, 8]
        assert run["curve"][-1][1] == pytest.approx(run["test_accuracy"])


def test_schedules_run_as_named_and_the_compression_curve_ends_at_the_full_model(study):
    _, out, data = study
    for run in (r for r in data["runs"] if r["model"].startswith("pf-")):
        active = set(RunFolder(run["run_dir"]).read_metrics().series("branches/active").values())
        assert active == ({1, 2, 3} if run["schedule"] == "prefix" else {3})
        assert sorted(run["accuracy_by_branches"], key=int) == ["1", "2", "3"]
        assert run["accuracy_by_branches"]["3"] == pytest.approx(run["test_accuracy"])  # all branches: the model
    sequential = [r for r in data["runs"] if r["model"] == "vit12"]
    assert all(r["branches"] == 1 and not r["accuracy_by_branches"] for r in sequential)


def test_paired_differences_are_recomputed_from_the_runs_files(study):
    module, out, data = study
    rows = {(r["claim"], r["metric"]): r for r in data["comparisons"]}
    expected = [("Table 3: shared LayerNorm hurts", "test accuracy (%)", "widenet-shared-ln", "widenet", "table3", None),
                ("ParaFormer Table 1: PF 3x4 (prefix) vs ViT12", "test accuracy (%)", "pf-3x4-prefix", "vit12",
                 "paraformer", None),
                ("Progressive training: PF 3x4, prefix vs joint", "first branch alone: test accuracy (%)",
                 "pf-3x4-prefix", "pf-3x4-joint", "paraformer", 1)]
    tables = (out / "image_tables.md").read_text()
    for claim, metric, variant, reference, part, k in expected:
        def value(model: str, seed: int) -> float:
            found = results(out, part, model, seed)
            return 100 * (found.accuracy_by_branches[k] if k else found.accuracy)
        diff = paired_difference([value(variant, s) for s in SEEDS], [value(reference, s) for s in SEEDS])
        row = rows[(claim, metric)]
        assert (row["mean"], row["low"], row["high"]) == pytest.approx((diff.mean, diff.low, diff.high))
        assert row["seeds"] == list(SEEDS) and row["resolved"] == diff.resolved
        assert format_interval(diff.mean, diff.low, diff.high, 2) in tables
    # claims whose models did not run are left out, not reported empty
    assert not any(r["variant"] == "vit-moe" or r["reference"] == "vit" for r in data["comparisons"])


def test_archive_holds_the_json_tables_and_plots(study):
    _, out, data = study
    archived = sorted(p.name for p in (out / "archive").iterdir())
    assert archived == ["image_study.json", "image_study_paraformer.png", "image_study_table3.png", "image_tables.md"]
    assert json.loads((out / "archive" / "image_study.json").read_text()) == data
    assert all((out / "archive" / name).read_bytes()[:4] == b"\x89PNG" for name in archived if name.endswith(".png"))


def test_a_rerun_continues_without_training_again(study):
    module, out, data = study
    before = {p: p.stat().st_mtime_ns for p in out.glob("*/*-seed*/metrics.jsonl")}
    run(module, out)
    again = json.loads((out / "image_study.json").read_text())
    assert {p: p.stat().st_mtime_ns for p in out.glob("*/*-seed*/metrics.jsonl")} == before
    assert again["runs"] == data["runs"] and again["comparisons"] == data["comparisons"]


def test_a_folder_of_other_step_counts_is_refused_before_anything_runs(study, capsys):
    module, out, _ = study
    before = sorted(p.name for p in (out / "table3").iterdir())
    with pytest.raises(SystemExit):
        module.main(["--output", str(out), "--steps", str(2 * STEPS), "--seeds", "1", "--models", "vit", "widenet"])
    error = capsys.readouterr().err
    assert f"holds a run of {STEPS} steps, this study asks for {2 * STEPS}" in error and "another --output" in error
    assert sorted(p.name for p in (out / "table3").iterdir()) == before  # vit (not run before) did not start


def test_compression_curves_are_ordered_by_branch_count_past_nine(study):
    # results.json keys are strings: "10" must follow "9", not "1"
    module, _, data = study
    runs = [{**run, "model": "pf-12x1-joint", "branches": 12,
             "accuracy_by_branches": {str(k): float(k) for k in range(1, 13)}}
            for run in data["runs"] if run["model"] == "pf-3x4-joint"]
    rows = module.model_rows(runs, module.PARAFORMER)
    assert [c["k"] for c in rows[0]["compression"]] == list(range(1, 13))
    assert [c["mean"] for c in rows[0]["compression"]] == [float(k) for k in range(1, 13)]
