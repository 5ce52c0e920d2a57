"""The pretraining entry point in one process: each bad input fails with one clear error before any
training starts (nothing written), and phase 2 starts from phase 1's weights on new, longer data, from
its DeepSpeed checkpoint or from its portable folder."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support.open_counts import counted_opens
from tests.support.pretrain_support import (
    BOOKS,
    CPU_CONFIG,
    events,
    prepare_data,
    train_in_process,
    train_losses,
    write_ds_config,
)
from widenet_ds.cli import main as widenet_ds
from widenet_ds.errors import CheckpointError, ConfigError, DataError
from widenet_ds.portable.format import read_folder


def run(argv):
    return train_in_process("pretrain", argv)


@pytest.fixture(scope="module")
def data(tmp_path_factory, shared_data):
    root = tmp_path_factory.mktemp("pretrain")
    seq64 = prepare_data(root / "seq64", [shared_data / BOOKS[0]])
    # Phase-2 data: longer sequences, the same tokenizer.
    seq128 = prepare_data(root / "seq128", [shared_data / BOOKS[1]], seq_length=128,
                          tokenizer=str(seq64 / "tokenizer.json"))
    return {"root": root, "seq64": seq64, "seq128": seq128}


def args(data, output_dir, *extra, model="albert-tiny", ds=CPU_CONFIG, data_dir=None):
    return ["--model-config", model, "--deepspeed_config", str(ds), "--data", str(data_dir or data["seq64"]),
            "--output-dir", str(output_dir), "--max-steps", "2", "--log-interval", "1", "--eval-interval", "0",
            "--no-progress-bar", "--no-tensorboard", *extra]


@pytest.fixture(scope="module")
def albert_run(data, dist):
    """A finished 2-step albert-tiny run: a real output folder with a real checkpoint."""
    out = data["root"] / "albert"
    assert run((args(data, out))) is not None
    return out


def assert_fails_before_training(argv, error, pattern, output_dir):
    before = sorted(p.relative_to(output_dir) for p in output_dir.rglob("*")) if output_dir.exists() else None
    with pytest.raises(error, match=pattern):
        run((argv))
    after = sorted(p.relative_to(output_dir) for p in output_dir.rglob("*")) if output_dir.exists() else None
    assert after == before, "a failed start must not write anything"


def test_batch_sizes_disagreeing_with_the_world_size(data, tmp_path, dist):
    ds = write_ds_config(tmp_path / "ds.json", gradient_accumulation_steps=1)  # 16 != 8 x 1 x 1 rank
    assert_fails_before_training(args(data, tmp_path / "out", ds=ds), ConfigError,
                                 r"batch sizes disagree with the world size.*set gradient_accumulation_steps to 2",
                                 tmp_path / "out")


def test_zero3_with_moe(data, tmp_path, dist):
    ds = write_ds_config(tmp_path / "ds.json", zero_optimization={"stage": 3})
    assert_fails_before_training(args(data, tmp_path / "out", ds=ds, model="widenet-tiny-e4"), ConfigError,
                                 r"ZeRO stage 3, but DeepSpeed's MoE supports ZeRO stage 1 and 2 only",
                                 tmp_path / "out")


def test_fp16_on_cpu(data, tmp_path, dist):
    ds = write_ds_config(tmp_path / "ds.json", fp16={"enabled": True})
    assert_fails_before_training(args(data, tmp_path / "out", ds=ds), ConfigError,
                                 r"fp16 needs a CUDA device; use ds_configs/cpu_small.json", tmp_path / "out")


def test_missing_data_manifest(data, tmp_path, dist):
    (tmp_path / "data").mkdir()
    assert_fails_before_training(args(data, tmp_path / "out", data_dir=tmp_path / "data"), DataError,
                                 r"has no manifest.json.*prepare-data", tmp_path / "out")


def test_resume_in_an_output_dir_holding_another_models_checkpoints(data, albert_run, dist):
    assert_fails_before_training(args(data, albert_run, "--resume", model="widenet-tiny-e4"), CheckpointError,
                                 r"of another model config; differing fields:(.|\n)*ffn: 'dense' \(checkpoint\) "
                                 r"vs 'moe' \(this run\)", albert_run)


def test_a_used_output_dir_needs_resume(data, albert_run, dist):
    for model in ("albert-tiny", "widenet-tiny-e4"):
        assert_fails_before_training(args(data, albert_run, model=model), ConfigError,
                                     r"already holds a run \(run_config.json, results.json, checkpoints/\); pass "
                                     r"--resume", albert_run)


def test_resume_with_changed_settings_needs_accept(data, albert_run, dist):
    assert_fails_before_training(args(data, albert_run, "--resume", "--seed", "7", "--max-steps", "3"), ConfigError,
                                 r"settings that change it:\n  seed: 1234 \(the run in the folder\) vs 7 \(now\)",
                                 albert_run)


def test_resume_from_a_checkpoint_of_another_model_config(data, albert_run, tmp_path, dist):
    checkpoint = albert_run / "checkpoints" / "step2"
    assert_fails_before_training(args(data, tmp_path / "out", "--resume", str(checkpoint), model="bert-tiny-factorized"),
                                 CheckpointError, r"share_attention: True \(checkpoint\) vs False \(this run\)",
                                 tmp_path / "out")


def test_resume_latest_in_an_empty_output_dir_starts_from_step_zero(data, tmp_path, dist):
    # What a requeued Slurm job does on its first start: --resume with nothing saved yet.
    assert run((args(data, tmp_path / "out", "--resume", "--max-steps", "1"))) is not None
    assert sorted(train_losses(tmp_path / "out")) == [1]


def test_phase2_starts_from_phase1_weights_with_new_sequence_length(data, albert_run, tmp_path, dist):
    out = tmp_path / "phase2"
    phase1 = albert_run / "checkpoints"
    # One step: WarmupDecayLR's first step runs at warmup_min_lr = 0, so the weights stay phase 1's.
    assert run((args(data, out, "--init-from", str(phase1), "--max-steps", "1",
                               data_dir=data["seq128"]))) is not None
    from widenet_ds.checkpoint.marker import CheckpointMeta

    meta = CheckpointMeta.read(out / "checkpoints" / "step1")
    assert meta.run["data_manifest"]["seq_length"] == 128 and meta.step == 1
    assert (meta.task, meta.architecture) == ("pretrain", "WideNetForPreTraining")
    old = torch.load(phase1 / "step2" / "mp_rank_00_model_states.pt", weights_only=True)["module"]
    new = torch.load(out / "checkpoints" / "step1" / "mp_rank_00_model_states.pt", weights_only=True)["module"]
    assert old.keys() == new.keys()
    for name in old:
        assert torch.equal(old[name], new[name]), name


def test_init_from_a_checkpoint_folder_starts_from_its_weights(data, albert_run, tmp_path, dist):
    # A portable folder (what convert to-folder, reshard and branches expand write) is as good a start as
    # the DeepSpeed checkpoint it came from: the model config is read from it and the weights are its own.
    folder = tmp_path / "folder"
    assert widenet_ds(["convert", "to-folder", str(albert_run), str(folder)]) == 0
    out = tmp_path / "from-folder"
    assert run((args(data, out, "--init-from", str(folder), "--max-steps", "1", model=str(folder),
                               data_dir=data["seq128"]))) is not None
    assert any(e.startswith(f"loaded {len(read_folder(folder).state)} tensors from {folder}") for e in events(out))
    # One step at WarmupDecayLR's warm-up lr 0: the weights stay the folder's, which are phase 1's.
    old = torch.load(albert_run / "checkpoints" / "step2" / "mp_rank_00_model_states.pt", weights_only=True)["module"]
    new = torch.load(out / "checkpoints" / "step1" / "mp_rank_00_model_states.pt", weights_only=True)["module"]
    assert old.keys() == new.keys()
    for name in old:
        assert torch.equal(old[name], new[name]), name


@pytest.mark.slow  # a run and its resume (36 s of CPU, measured)
def test_a_run_saved_with_the_capacity_buffers_resumes_with_them_under_the_compact_default(data, tmp_path, dist):
    # A run from before `compact` became the default: its marker records dispatch "deepspeed", its settings no
    # --set. Resumed with the same preset (whose default is now compact), it continues with its own dispatch.
    import json

    from widenet_ds.checkpoint.marker import CheckpointMeta

    out = tmp_path / "old"
    assert run(args(data, out, "--set", "moe.dispatch=deepspeed", "--max-steps", "1", model="widenet-tiny-e4")) is not None
    settings = json.loads((out / "run_config.json").read_text())
    assert settings["overrides"] == ["moe.dispatch=deepspeed"]
    (out / "run_config.json").write_text(json.dumps({**settings, "overrides": []}))
    assert run(args(data, out, "--resume", model="widenet-tiny-e4")) is not None
    assert sorted(train_losses(out)) == [1, 2]
    assert CheckpointMeta.read(out / "checkpoints" / "step2").model_config["moe"]["dispatch"] == "deepspeed"


def test_a_checkpoint_written_before_the_format_versions_resumes_exactly(data, tmp_path, dist):
    """Its files as widenet-ds wrote them before widenet_ds/formats.py: the marker of format version 1 (here without
    the file records, as the oldest), run_config.json and the ranks' loader states without a version. They are
    upgraded on reading, and the resumed run gives the uninterrupted run's losses."""
    import json

    whole, part = tmp_path / "whole", tmp_path / "part"
    assert run(args(data, whole, "--max-steps", "3")) is not None
    assert run(args(data, part)) is not None
    tag = part / "checkpoints" / "step2"
    marker = json.loads((tag / "widenet_checkpoint.json").read_text())
    assert marker["format_version"] == 3
    del marker["files"]  # (the entries of versions 2 and 3 stay: they say how this run trained)
    (tag / "widenet_checkpoint.json").write_text(json.dumps({**marker, "format_version": 1}))
    settings = json.loads((part / "run_config.json").read_text())
    assert settings.pop("format_version") == 2
    (part / "run_config.json").write_text(json.dumps(settings))
    rank_state = torch.load(tag / "rank_00000_state.pt", weights_only=True)
    assert rank_state["loader"].pop("format_version") == 2
    torch.save(rank_state, tag / "rank_00000_state.pt")
    assert run(args(data, part, "--max-steps", "3", "--resume")) is not None
    assert train_losses(part) == train_losses(whole) and sorted(train_losses(part)) == [1, 2, 3]


def test_a_run_opens_its_data_and_its_init_from_checkpoint_once(data, albert_run, tmp_path, dist):
    """Start-up resolves its inputs once (issue 40): the task, the train and valid loaders and the --init-from
    tokenizer check share one PreparedData (before: manifest.json opened 6 times, tokenizer.json 4), and the
    model config, the tokenizer check and the weights one CheckpointSource (before: config.json 5 times)."""
    folder = tmp_path / "folder"
    assert widenet_ds(["convert", "to-folder", str(albert_run), str(folder)]) == 0
    seq128 = data["seq128"]
    with counted_opens(seq128 / "manifest.json", seq128 / "tokenizer.json", *sorted(folder.iterdir())) as opens:
        assert run(args(data, tmp_path / "out", "--init-from", str(folder), "--max-steps", "1", model=str(folder),
                        data_dir=seq128)) is not None
    counts = {str(Path(path).relative_to(data["root"].parent)): n for path, n in opens.items()}
    # the data's tokenizer.json: read for its hash, and copied into the run folder (where finetuning and convert
    # find it); each file of the --init-from folder: hashed against its record, then read once
    assert opens[str(seq128 / "manifest.json")] == 1 and opens[str(seq128 / "tokenizer.json")] == 2, counts
    assert opens[str(folder / "config.json")] == 1, counts
    assert all(opens[str(p)] <= 2 for p in folder.iterdir()), counts


def test_a_branch_parallel_run_with_random_draws_or_per_rank_routing_says_it_differs_from_one_rank():
    from widenet_ds.distributed.parallel import ParallelPlan
    from widenet_ds.training.plan import branch_parallel_notes
    from widenet_ds.vision.config import VisionConfig

    model = VisionConfig.from_preset("widenet-paraformer-tiny-3x4")
    two = ParallelPlan.plan(2, 0, 1, 2, model)
    (note,) = branch_parallel_notes(two, model)
    assert f"hidden_dropout {model.hidden_dropout}" in note and "--set hidden_dropout=0" in note
    assert "moe.noise gaussian" in note and "--set moe.noise=none" in note
    # the shared MoE routes each rank's branches: the preset's balance loss and capacity are each rank's own
    assert ("the balance loss (moe.balance_loss_weight 0.01) and the expert capacity (moe.dispatch compact) are each "
            "rank's own branches'" in note and note.endswith("--set moe.balance_loss_weight=0 --set "
                                                             "moe.dispatch=dropless)."))
    quiet = model.replace(hidden_dropout=0.0, attention_dropout=0.0, moe={"noise": "none", "balance_loss_weight": 0.0,
                                                                        "dispatch": "dropless"})
    assert branch_parallel_notes(two, quiet) == () == branch_parallel_notes(ParallelPlan.plan(1, 0, 1, 1, model), model)
