"""scripts/study.py end to end at a tiny scale, on the real corpus and GLUE / SQuAD files: its tables and
plots hold the numbers its runs wrote, a re-run continues instead of redoing finished stages, and further
pretraining seeds give the spread of the held-out loss."""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
from pathlib import Path

import pytest
import torch

from widenet_ds.run_folder import RunFolder

from launching import REPO

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("dist")]


def load_study_script():
    spec = importlib.util.spec_from_file_location("study_script", REPO / "scripts" / "study.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def run_study(module, out, shared_data, *extra: str) -> None:
    threads = torch.get_num_threads()
    try:  # the script sets the process's torch threads: give them back to the other tests
        assert module.main(["--output", str(out), "--scale", "0.01", "--threads", str(threads),
                            "--variants", "widenet", "albert", "--tasks", "SST-2", "SQuAD1.1",
                            "--finetune-budgets", "steps", "--shared-data", str(shared_data), *extra]) == 0
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def study(tmp_path_factory, shared_data):
    module = load_study_script()
    out = tmp_path_factory.mktemp("study")
    run_study(module, out, shared_data)
    return module, out, json.loads((out / "study.json").read_text())


def last_record(run_dir, key: str) -> float:
    values = RunFolder(run_dir).read_metrics().series(key)
    return values[max(values)]


def test_pretraining_budgets_and_losses_come_from_the_runs(study):
    module, out, result = study
    runs = {(p["variant"], p["budget"]): p for p in result["pretrain"]}
    assert set(runs) == {("widenet", "steps"), ("widenet", "flops"), ("albert", "steps"), ("albert", "flops")}
    steps = result["sizes"]["pretrain_steps"]
    assert runs["widenet", "steps"]["steps"] == runs["albert", "steps"]["steps"] == steps == 20
    # Equal FLOPs: the dense model gets WideNet's training FLOPs, so proportionally more steps.
    ratio = runs["widenet", "steps"]["train_flops_per_token"] / runs["albert", "steps"]["train_flops_per_token"]
    assert ratio > 1.2
    assert runs["albert", "flops"]["steps"] == round(steps * ratio)
    assert runs["widenet", "flops"]["valid_mlm_loss"] == runs["widenet", "steps"]["valid_mlm_loss"]  # one run
    tables = (out / "tables.md").read_text()
    for (variant, _), run in runs.items():
        assert run["valid_mlm_loss"] == last_record(Path(run["run_dir"]), "valid/mlm_loss")
        row = f"| {variant} | {run['params'] / 1e6:.2f}M | {run['train_flops_per_token'] / 1e6:.2f} | {run['steps']} | " \
              f"{run['valid_mlm_loss']:.3f} |"
        assert row in tables, row


def test_finetuning_medians_come_from_every_seed(study):
    _, out, result = study
    tables = (out / "tables.md").read_text()
    assert {(f["variant"], f["task"]) for f in result["finetune"] if f["budget"] == "steps"} == {
        ("widenet", "SST-2"), ("widenet", "SQuAD1.1"), ("albert", "SST-2"), ("albert", "SQuAD1.1")}
    for score in result["finetune"]:
        saved = json.loads((out / "finetune" / f"{score['variant']}-steps" / score["task"].lower().replace("-", "")
                            / "results.json").read_text())
        scale = 1.0 if score["task"] == "SQuAD1.1" else 100.0
        seeds = [run["metrics"]["dev"][score["metric"]] * scale for run in saved["per_seed"]]
        assert len(seeds) == 3 and score["seeds"] == seeds
        assert score["median"] == statistics.median(seeds)
    for variant in ("widenet", "albert"):
        cells = {f["task"]: f"{f['median']:.1f}" for f in result["finetune"]
                 if f["variant"] == variant and f["budget"] == "steps"}
        assert f"| {variant} | {cells['SST-2']} | {cells['SQuAD1.1']} |" in tables


def test_plots_and_report_are_written(study):
    _, out, _ = study
    for name in ("study_steps.png", "study_flops.png"):
        assert (out / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "report" / "index.html").read_text()
    assert "widenet-steps" in page and "albert-flops" in page


def test_a_rerun_continues_instead_of_redoing_finished_stages(study, shared_data):
    module, out, result = study
    written = {p: p.stat().st_mtime_ns for p in out.glob("*/*/metrics.jsonl")}
    written |= {p: p.stat().st_mtime_ns for p in out.glob("finetune/*/*/results.json")}
    assert len(written) == 3 + 4  # widenet's equal-FLOPs run is its equal-steps run
    # A finetuning stage stopped after its seeds finished but before results.json: continued, not redone.
    stopped = out / "finetune" / "albert-steps" / "sst2" / "results.json"
    stopped.unlink()
    del written[stopped]
    run_study(module, out, shared_data)
    assert {p: p.stat().st_mtime_ns for p in written} == written
    again = json.loads((out / "study.json").read_text())
    assert again["pretrain"] == result["pretrain"] and again["finetune"] == result["finetune"]


def test_more_pretraining_seeds_give_the_spread_of_the_loss(study, shared_data):
    module, out, result = study
    run_study(module, out, shared_data, "--variants", "albert", "--pretrain-seeds", "2")
    first = {p["budget"]: p for p in result["pretrain"] if p["variant"] == "albert"}
    seeds = {p["budget"]: p for p in json.loads((out / "study.json").read_text())["pretrain_seeds"]}
    assert set(seeds) == {"steps", "flops"} and all(p["seed"] == 1235 for p in seeds.values())
    tables = (out / "tables.md").read_text()
    for budget, run in seeds.items():
        assert Path(run["run_dir"]).name == f"albert-{budget}-seed1235"
        assert run["valid_mlm_loss"] == last_record(Path(run["run_dir"]), "valid/mlm_loss")
        losses = [first[budget]["valid_mlm_loss"], run["valid_mlm_loss"]]
        assert losses[0] != losses[1]  # another seed: other initial weights and data order
        assert (f"| albert | {budget} | 1234, 1235 | {losses[0]:.3f}, {losses[1]:.3f} | "
                f"{statistics.mean(losses):.3f} | {statistics.stdev(losses):.3f} |") in tables
