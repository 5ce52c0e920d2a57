"""ParaFormer's compression curves as the report gathers them (widenet_ds/report/branches.py): an image run's
accuracy per number of branches from its results.json (tests/assets/results_before/classify.json), a pretraining
run's held-out MLM loss per number of branches from its log, and the Markdown table of both."""

from __future__ import annotations

import json

from widenet_ds.report.branches import ACCURACY, MLM_LOSS, branch_curves, by_measure, markdown_table, widest
from widenet_ds.report.metrics import load_runs

from tests.support.run_folders import BEFORE, finetune_folder, image_folder, pretrain_folder, write_jsonl


def test_each_run_with_branches_gives_one_curve_of_its_measure(tmp_path):
    runs, _ = load_runs([image_folder(tmp_path / "img"), pretrain_folder(tmp_path / "pre"),
                         finetune_folder(tmp_path / "ft"), image_folder(tmp_path / "running", results=None)])
    curves = branch_curves(runs)
    # the finetuning run and the unfinished image run have none
    assert [(c.run, c.measure, c.source) for c in curves] == [("img", ACCURACY, "results"),
                                                              ("pre", MLM_LOSS, "step 4")]
    assert curves[0].values == {1: 0.15, 2: 0.1361111111111111}
    final = json.loads((BEFORE / "pretrain.json").read_text())
    assert curves[1].values == {k: final[f"valid_branches_{k}/mlm_loss"] for k in (1, 2)}
    assert [(m, [c.run for c in group]) for m, group in by_measure(curves)] == [(ACCURACY, ["img"]),
                                                                                (MLM_LOSS, ["pre"])]
    assert ACCURACY.key(2) == "accuracy_by_branches/2" and MLM_LOSS.key(1) == "valid_branches_1/mlm_loss"


def test_the_markdown_table_has_a_column_per_branch_count_of_the_widest_run(tmp_path):
    narrow = pretrain_folder(tmp_path / "narrow")
    wide = tmp_path / "wide"
    write_jsonl(wide / "metrics.jsonl", [{"step": 8, **{f"valid_branches_{k}/mlm_loss": 7.0 - k for k in (1, 2, 3)}}])
    curves = branch_curves(load_runs([narrow, wide])[0])
    assert widest(curves) == 3
    final = json.loads((BEFORE / "pretrain.json").read_text())
    heading, *table = markdown_table(curves).splitlines()
    # (the heading is the measure's label, capitalised: "Held-out mlm loss" today)
    assert heading.lower() == "held-out mlm loss of the first k branches (`valid_branches_k/mlm_loss`):"
    assert table == [
        "", "| run | k = 1 | k = 2 | k = 3 |", "|---|---:|---:|---:|",
        f"| narrow | {final['valid_branches_1/mlm_loss']:.4f} | {final['valid_branches_2/mlm_loss']:.4f} |  |",
        "| wide | 6.0000 | 5.0000 | 4.0000 |"]
    # both measures: one table each, images first
    both = markdown_table(branch_curves(load_runs([narrow, image_folder(tmp_path / "img")])[0]))
    assert both.index("Test accuracy of the first k branches") < both.lower().index("held-out mlm loss")
    assert "| img | 0.1500 | 0.1361 |" in both
    assert markdown_table([]) == ""
