"""scripts/study.py end to end at a tiny scale, on the real corpus and GLUE / SQuAD files: every model pretrained
and finetuned with the same seeds, its tables, paired differences, eq. 9 divergences and plots hold the numbers
its runs wrote, the archive copies them, and a re-run continues instead of redoing finished stages."""

from __future__ import annotations

import importlib.util
import json
import re
import statistics
import sys
from pathlib import Path

import pytest
import torch

from widenet_ds.checkpoint.source import CONVERT, CheckpointSource
from widenet_ds.model.layernorm_divergence import layernorm_divergence
from widenet_ds.report.paired import paired_difference
from widenet_ds.run_folder import RunFolder

from tests.support.launching import REPO

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("dist")]
SEEDS = (1234, 1235)


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
                            "--pretrain-seeds", "2", "--finetune-seeds", "1", "--finetune-budgets", "steps",
                            "--shared-data", str(shared_data), *extra]) == 0
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def study(tmp_path_factory, shared_data):
    module = load_study_script()
    out = tmp_path_factory.mktemp("study")
    run_study(module, out, shared_data, "--archive", str(out / "archive"))
    return module, out, json.loads((out / "study.json").read_text())


def last_record(run_dir, key: str) -> float:
    values = RunFolder(run_dir).read_metrics().series(key)
    return values[max(values)]


def test_every_model_is_pretrained_with_the_same_seeds_at_both_budgets(study):
    module, out, result = study
    runs = {(p["variant"], p["budget"], p["seed"]): p for p in result["pretrain"]}
    assert set(runs) == {(v, b, s) for v in ("widenet", "albert") for b in ("steps", "flops") for s in SEEDS}
    steps = result["sizes"]["pretrain_steps"]
    assert runs["widenet", "steps", 1234]["steps"] == runs["albert", "steps", 1235]["steps"] == steps == 20
    # Equal FLOPs: the dense model gets WideNet's training FLOPs, so proportionally more steps.
    ratio = runs["widenet", "steps", 1234]["train_flops_per_token"] / runs["albert", "steps", 1234]["train_flops_per_token"]
    assert ratio > 1.2
    assert runs["albert", "flops", 1235]["steps"] == round(steps * ratio)
    for seed in SEEDS:  # WideNet's equal-FLOPs run is its equal-steps run
        assert runs["widenet", "flops", seed]["run_dir"] == runs["widenet", "steps", seed]["run_dir"]
    losses = [runs["albert", "steps", s]["valid_mlm_loss"] for s in SEEDS]
    assert losses[0] != losses[1]  # another seed: other initial weights and data order
    tables = (out / "tables.md").read_text()
    for (variant, budget, seed), run in runs.items():
        assert run["valid_mlm_loss"] == last_record(Path(run["run_dir"]), "valid/mlm_loss")
        assert re.fullmatch("[0-9a-f]{40}", run["commit"]) and isinstance(run["changed_files"], list)
        assert Path(run["run_dir"]).name == f"{variant}-{'steps' if run.get('same_run_as_steps') else budget}" + (
            "" if seed == 1234 else f"-seed{seed}")
    for variant in ("widenet", "albert"):
        per_seed = ", ".join(f"{runs[variant, 'steps', s]['valid_mlm_loss']:.3f}" for s in SEEDS)
        assert f"| 20 | 1234, 1235 | {per_seed} |" in tables


def test_finetuning_scores_come_from_every_pretraining_and_finetuning_seed(study):
    _, out, result = study
    scores = {(f["variant"], f["task"], f["seed"]): f for f in result["finetune"] if f["budget"] == "steps"}
    assert set(scores) == {(v, t, s) for v in ("widenet", "albert") for t in ("SST-2", "SQuAD1.1") for s in SEEDS}
    for (variant, task, seed), score in scores.items():
        folder = out / "finetune" / (f"{variant}-steps" + ("" if seed == 1234 else f"-seed{seed}"))
        saved = json.loads((folder / task.lower().replace("-", "") / "results.json").read_text())
        scale = 1.0 if task == "SQuAD1.1" else 100.0
        values = [run["metrics"]["dev"][score["metric"]] * scale for run in saved["per_seed"]]
        assert len(values) == 1 and score["scores"] == values  # (one finetuning seed: the sweep is test_finetune's)
        assert score["median"] == statistics.median(values)
        assert re.fullmatch("[0-9a-f]{40}", score["commit"])


def test_paired_differences_are_those_of_the_runs_seed_by_seed(study):
    _, out, result = study
    pre = {(p["variant"], p["seed"]): p for p in result["pretrain"] if p["budget"] == "steps"}
    rows = {row["metric"]: row for row in result["analysis"]["steps"]["comparisons"]
            if (row["variant"], row["reference"]) == ("widenet", "albert")}
    assert set(rows) == {"held-out MLM loss", "held-out MLM accuracy", "SST-2 acc (x100)", "SQuAD1.1 f1 (%)"}
    expected = paired_difference([pre["widenet", s]["valid_mlm_loss"] for s in SEEDS],
                                 [pre["albert", s]["valid_mlm_loss"] for s in SEEDS])
    row = rows["held-out MLM loss"]
    assert (row["mean"], row["low"], row["high"], row["resolved"]) == (
        expected.mean, expected.low, expected.high, expected.resolved)
    assert row["seeds"] == list(SEEDS)
    verdict = "not resolved" if not expected.resolved else "resolved: " + ("better" if expected.mean < 0 else "worse")
    tables = (out / "tables.md").read_text()
    claim = tables.index(f"#### {row['claim']}: widenet − albert")  # the equal-steps table comes first
    line = f"| held-out MLM loss | {expected.mean:+.3f} [{expected.low:+.3f}, {expected.high:+.3f}] | 2 | {verdict} |"
    assert tables.index(line, claim) < tables.index("####", claim + 1)


def test_layernorm_divergence_is_eq9_on_the_checkpoints(study):
    _, _, result = study
    pre = {(p["variant"], p["seed"]): p for p in result["pretrain"] if p["budget"] == "steps"}
    state = CheckpointSource.open(Path(pre["widenet", 1234]["run_dir"]), "source", purpose=CONVERT).read_weights().state
    gammas = torch.stack([state[f"widenet.encoder.attention_norm.{i}.weight"] for i in range(4)])
    measured = pre["widenet", 1234]["layernorm_divergence"]["before_ffn"]["gamma"]
    assert measured == layernorm_divergence(gammas).mean().item() and measured > 0  # trained: the blocks differ
    for name in ("gamma", "beta"):  # ALBERT's one shared LayerNorm: 0 by construction
        assert pre["albert", 1234]["layernorm_divergence"]["before_ffn"][name] == 0
    paired = [r for r in result["analysis"]["steps"]["layernorm"] if "reference" not in r
              and (r["variant"], r["position"], r["parameter"]) == ("widenet", "before_ffn", "gamma")]
    assert paired[0]["mean"] == statistics.mean(pre["widenet", s]["layernorm_divergence"]["before_ffn"]["gamma"]
                                                for s in SEEDS)


def test_plots_report_and_archive_are_written(study):
    _, out, result = study
    for name in ("study_steps.png", "study_flops.png", "study_layernorm_steps.png", "study_layernorm_flops.png"):
        assert (out / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (out / "archive" / name).read_bytes() == (out / "plots" / name).read_bytes()
    assert json.loads((out / "archive" / "study.json").read_text()) == result
    assert (out / "archive" / "tables.md").read_text() == (out / "tables.md").read_text()
    page = (out / "report" / "index.html").read_text()
    assert "widenet-steps-seed1235" in page and "albert-flops" in page


def test_tables_and_plots_are_redrawn_from_an_archived_study_json_alone(study, tmp_path):
    module, out, _ = study
    assert module.main(["--output", str(tmp_path / "redrawn"), "--from-json", str(out / "archive" / "study.json"),
                        "--archive", str(tmp_path / "archive")]) == 0
    assert (tmp_path / "redrawn" / "tables.md").read_text() == (out / "tables.md").read_text()
    assert sorted(p.name for p in (tmp_path / "archive").iterdir()) == sorted(
        ["tables.md", "study_steps.png", "study_flops.png", "study_layernorm_steps.png", "study_layernorm_flops.png"])
    assert not (tmp_path / "redrawn" / "pretrain").exists()  # nothing trained


def test_a_rerun_continues_instead_of_redoing_finished_stages(study, shared_data):
    module, out, result = study
    written = {p: p.stat().st_mtime_ns for p in out.glob("pretrain/*/metrics.jsonl")}
    written |= {p: p.stat().st_mtime_ns for p in out.glob("finetune/*/*/results.json")}
    assert len(written) == 3 * 2 + 2 * 2 * 2  # widenet's equal-FLOPs runs are its equal-steps runs
    # A finetuning stage stopped after its seeds finished but before results.json: continued, not redone.
    stopped = out / "finetune" / "albert-steps-seed1235" / "sst2" / "results.json"
    stopped.unlink()
    del written[stopped]
    run_study(module, out, shared_data)
    assert {p: p.stat().st_mtime_ns for p in written} == written
    again = json.loads((out / "study.json").read_text())
    assert again["pretrain"] == result["pretrain"] and again["finetune"] == result["finetune"]
    assert again["analysis"] == result["analysis"]
