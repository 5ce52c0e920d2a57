"""The trainers' command lines: one ArgumentParser construction site for every trainer, flags generated from the
run configurations' fields with one meaning per name, and docs/flags.md generated from them."""

from __future__ import annotations

import ast
import os
from pathlib import Path

from widenet_ds.tasks import TASKS
from widenet_ds.training.command_line import flags_table, parse

REPO = Path(__file__).resolve().parents[2]
FLAGS_DOC = REPO / "docs" / "flags.md"


def _common(tmp_path) -> list[str]:
    return ["--deepspeed-config", str(REPO / "ds_configs/cpu_small.json"), "--output-dir", str(tmp_path / "out")]


def test_one_argument_parser_construction_site_for_the_trainers():
    sites = []
    for path in (REPO / "widenet_ds" / "training").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == \
                    "ArgumentParser":
                sites.append(f"{path.name}:{node.lineno}")
    assert len(sites) == 1 and sites[0].startswith("command_line.py:"), sites


def test_every_flag_has_one_meaning_and_the_doc_table_is_current():
    table = flags_table([spec.config for spec in TASKS.values()])  # asserts one help text per flag name across the tasks
    if os.environ.get("WIDENET_UPDATE_DOCS") == "1":
        text = FLAGS_DOC.read_text()
        FLAGS_DOC.write_text(text[: text.index("| flag |")] + table)
    assert FLAGS_DOC.read_text().endswith(table), "docs/flags.md is stale: WIDENET_UPDATE_DOCS=1 pytest " + __file__
    for name in ("--resume", "--eval-interval", "--seed", "--keep-last", "--compile", "--optimizer", "--set",
                 "--branch-parallel", "--data", "--model-config", "--init-from"):
        row = next(line for line in table.splitlines() if f"`{name}`" in line.split("|")[1])
        assert row.split("|")[2].strip() == "all", row  # every trainer takes it


def test_the_shared_flags_parse_alike_in_every_task(tmp_path):
    extra = {"pretrain": ["--data", str(tmp_path)], "glue": ["--data", "hf", "--glue-task", "sst2"],
             "squad": ["--data", "hf", "--version", "1.1"], "classify": ["--dataset", "digits"],
             "text-classification": ["--dataset", "imdb"]}
    for task, spec in TASKS.items():
        cfg = parse(spec.config, [*_common(tmp_path), "--model-config", "widenet-tiny-e4", "--set", "moe.top_k=1",
                           "--set", "hidden_dropout=0.1", "--resume", "--compile", "--stage-steps", "3,5",
                           "--no-tensorboard", *extra[task]])
        assert (cfg.resume, cfg.compile, cfg.stage_steps, cfg.tensorboard) == ("latest", "model", [3, 5], False), task
        assert cfg.overrides == ["moe.top_k=1", "hidden_dropout=0.1"] and cfg.seed == 1234 and cfg.keep_last == 3
        assert cfg.eval_interval == 1000 and cfg.TASK == task
        record = cfg.record()
        assert record["task"] == task and record["output_dir"] == str(tmp_path / "out")


def test_a_configuration_written_as_a_command_line_parses_back_to_itself(tmp_path):
    extra = {"pretrain": ["--data", str(tmp_path), "--max-steps", "7"],
             "glue": ["--data", "hf", "--glue-task", "sst2", "--seeds", "2", "--predict-test"],
             "squad": ["--data", "hf", "--version", "2.0", "--doc-stride", "64"],
             "classify": ["--dataset", "digits", "--flip", "--randaugment", "2,15"],
             "text-classification": ["--train-file", "t.csv", "--validation-file", "v.jsonl", "--text-fields", "a,b",
                                     "--label-field", "score", "--regression"]}
    for task, spec in TASKS.items():
        for argv in ([*_common(tmp_path), *extra[task], "--model-config", "widenet-tiny-e4"],
                     [*_common(tmp_path), *extra[task], "--model-config", "widenet-tiny-e4", "--set", "moe.top_k=1",
                      "--set", "hidden_dropout=0.1", "--resume", "--compile", "blocks", "--stage-steps", "3,5",
                      "--no-tensorboard", "--ep-size", "2", "--seed", "7", "--branch-schedule", "staged"]):
            cfg = parse(spec.config, argv)
            assert parse(spec.config, cfg.to_argv()) == cfg, (task, cfg.to_argv())
    cfg = parse(TASKS["pretrain"].config, [*_common(tmp_path), "--data", str(tmp_path), "--resume", "--compile", "--ep-size", "2",
                             "--model-config", "widenet-tiny-e4"])
    # defaults are left out; a flag whose value is its bare form (--resume: latest) is written bare
    assert cfg.to_argv() == ["--deepspeed-config", str(REPO / "ds_configs/cpu_small.json"), "--output-dir",
                             str(tmp_path / "out"), "--model-config", "widenet-tiny-e4", "--resume", "--ep-size", "2",
                             "--compile", "--data", str(tmp_path)]
