"""Run folders as the trainers write them, built by hand and small: a pretraining, an image and a finetuning folder
whose results.json are the ones the writers wrote (tests/assets/results_before/), for the report's unit tests
(tests/report/). Each builder writes the files of a finished run; a test then removes or damages what it needs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

BEFORE = Path(__file__).resolve().parents[1] / "assets" / "results_before"
MODEL = {"num_layers": 4, "hidden_size": 128, "ffn": "moe", "moe": {"num_experts": 2, "top_k": 1},
         "share_attention": True, "share_ffn": True, "share_layernorm": False}


def write_jsonl(path: Path, lines: list) -> Path:
    """Records (dicts, written as JSON) and raw lines (str, written as they are) of a metrics.jsonl."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def routed(step: int, loads: list[list[float]], dropped: list[float], **scalars: float) -> dict:
    """A pretraining record with the routing of each block: loads[block][expert], dropped[block]."""
    record = {"step": step, "time": 1.0 + step, **scalars}
    for block, block_loads in enumerate(loads):
        record |= {f"moe/block_{block:02d}/expert_{e:02d}_load": load for e, load in enumerate(block_loads)}
        record[f"moe/block_{block:02d}/dropped_fraction"] = dropped[block]
    return record


def pretrain_folder(path: Path, task_file: bool = True) -> Path:
    """Two logged steps of two routed blocks, a checkpoint event, the final held-out evaluation of
    results_before/pretrain.json (ParaFormer's 2 branches) logged as the trainer logs it."""
    final = json.loads((BEFORE / "pretrain.json").read_text())
    write_jsonl(path / "metrics.jsonl", [
        routed(2, [[0.75, 0.25], [0.5, 0.5]], [0.0, 0.125], **{"train/mlm_loss": 9.5, "optim/lr": 1e-4}),
        routed(4, [[0.625, 0.375], [0.25, 0.75]], [0.25, 0.0], **{"train/mlm_loss": 8.25, "optim/lr": 2e-4}),
        {"time": 6.0, **final},
        {"event": "checkpoint saved (global_step4)", "step": 4, "time": 7.0},
    ])
    (path / "model_config.json").write_text(json.dumps(MODEL))
    if task_file:
        (path / "run_config.json").write_text(json.dumps({"task": "pretrain"}))
    return path


def image_folder(path: Path, results: str | None = "classify.json") -> Path:
    write_jsonl(path / "metrics.jsonl", [{"step": 2, "time": 1.0, "train/accuracy": 0.25},
                                         {"step": 4, "time": 2.0, "test/accuracy": 0.5}])
    (path / "run_config.json").write_text(json.dumps({"task": "classify", "dataset": "digits",
                                                      "model_config": "widenet-vit-digits"}))
    (path / "model_config.json").write_text(json.dumps({**MODEL, "num_branches": 2, "patch_size": 4,
                                                        "image_size": 8}))
    if results:
        shutil.copy(BEFORE / results, path / "results.json")
    return path


def finetune_folder(path: Path, results: bool = True, loss_key: str = "train/loss") -> Path:
    """results_before/finetune.json (SST-2, seeds 1234 and 1235) and each seed's log."""
    for seed, acc in ((1234, 0.4375), (1235, 0.5625)):
        write_jsonl(path / f"seed{seed}" / "metrics.jsonl", [
            {"step": 1, "time": 1.0, loss_key: 0.75},
            {"step": 2, "time": 2.0, loss_key: 0.5, "eval/dev/acc": acc, "eval/dev/f1": acc / 2}])
    (path / "run_config.json").write_text(json.dumps({"task": "glue"}))
    if results:
        shutil.copy(BEFORE / "finetune.json", path / "results.json")
    return path


def make_tag(root: Path, step: int, complete: bool = True) -> Path:
    """A checkpoint tag `step<step>` under `root` with a stand-in model file; `complete`: with its marker, as a
    finished save leaves it (without: a save killed half-way)."""
    from widenet_ds.checkpoint.marker import META_FILE

    tag = root / f"step{step}"
    tag.mkdir(parents=True)
    (tag / "mp_rank_00_model_states.pt").write_bytes(b"x")
    if complete:
        (tag / META_FILE).write_text(json.dumps({"step": step}))
    return tag
