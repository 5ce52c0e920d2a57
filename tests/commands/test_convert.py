"""`widenet-ds convert` on real DeepSpeed checkpoints written by 2 launcher ranks with ep_size 2.

Each checkpoint comes with the engine's own eval logits on a fixed batch per rank (written right after
saving); every conversion must reproduce them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.scripts.convert_make_checkpoint import fixed_batch
from tests.support.launching import REPO, run_deepspeed
from widenet_ds.checkpoint.source import CONVERT, CheckpointSource, load_pretrained
from widenet_ds.commands.convert import cli as convert
from widenet_ds.data.tokenizer import TokenizerFiles
from widenet_ds.errors import CheckpointError
from widenet_ds.formats import current
from widenet_ds.model.widenet import WideNetForPreTraining, WideNetForSequenceClassification
from widenet_ds.portable.format import read_folder, save_folder

pytestmark = [pytest.mark.multirank, pytest.mark.slow, pytest.mark.usefixtures("dist")]  # slow: its fixture's runs
SCRIPT = REPO / "tests/scripts/convert_make_checkpoint.py"
ZERO_STAGES = (0, 1, 2)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[int, Path]:
    """ZeRO stage -> run folder of a 2-rank, ep_size 2 training run saved at step 2."""
    root = tmp_path_factory.mktemp("convert")
    runs = {stage: root / f"zero{stage}" for stage in ZERO_STAGES}
    # one launch: an engine of each stage in turn, each into root/zero<stage>
    run_deepspeed(SCRIPT, ["save", str(root), "2", ",".join(map(str, ZERO_STAGES))], num_ranks=2)
    return runs


def engine_logits(run: Path, rank: int) -> dict[str, torch.Tensor]:
    return load_file(run / f"logits.rank{rank}.safetensors")


def eval_logits(model: WideNetForPreTraining, rank: int) -> dict[str, torch.Tensor]:
    model.ensure_process_groups()
    model.eval()
    batch = fixed_batch(rank)
    with torch.no_grad():
        out = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    return {"mlm_logits": out.mlm_logits, "sop_logits": out.sop_logits}


@pytest.mark.parametrize("stage", ZERO_STAGES)
def test_to_folder_then_one_process_model_gives_the_engines_logits(checkpoints, stage, tmp_path):
    run = checkpoints[stage]
    tokenizer = tmp_path / "vocab.txt"
    # As many tokens as the model's embeddings (VOCAB): convert refuses a tokenizer of another size.
    tokenizer.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n" + "".join(f"word{i}\n" for i in range(300 - 5)))
    assert convert(["to-folder", str(run), str(tmp_path / "folder"), "--tokenizer", str(tokenizer)]) == 0
    config = json.loads((tmp_path / "folder" / "config.json").read_text())
    assert config["format_version"] == current("folder") and config["architecture"] == "WideNetForPreTraining"
    assert "ep_size" not in config["model"]["moe"] and config["provenance"]["step"] == 2
    assert config["provenance"]["trained_with_ep_size"] == 2
    assert config["provenance"]["zero_stage"] == stage
    assert (tmp_path / "folder" / "vocab.txt").read_text() == tokenizer.read_text()
    assert "step: 2" in (tmp_path / "folder" / "README.md").read_text()
    assert not list(tmp_path.glob("folder.tmp-*"))

    model, report = load_pretrained(WideNetForPreTraining, tmp_path / "folder")  # ep_size 1: all 4 experts here
    assert report.saved_ep_size == 2 and report.ep_size == 1 and report.experts_on_this_rank == [0, 1, 2, 3]
    assert not report.new and not report.unused
    for rank in (0, 1):  # rank 1's batch went through experts 2, 3 on rank 1 of the engine
        got, want = eval_logits(model, rank), engine_logits(run, rank)
        assert torch.equal(got["mlm_logits"], want["mlm_logits"]), (got["mlm_logits"] - want["mlm_logits"]).abs().max()
        assert torch.equal(got["sop_logits"], want["sop_logits"])


def test_bf16_folder_stores_bf16_and_loads_close(checkpoints, tmp_path):
    assert convert(["to-folder", str(checkpoints[1]), str(tmp_path / "bf16"), "--dtype", "bf16"]) == 0
    assert all(t.dtype == torch.bfloat16 for t in load_file(tmp_path / "bf16" / "model.safetensors").values())
    model, _ = load_pretrained(WideNetForPreTraining, tmp_path / "bf16")
    got, want = eval_logits(model, 0), engine_logits(checkpoints[1], 0)
    assert (got["mlm_logits"] - want["mlm_logits"]).abs().max() < 0.1  # bf16 rounding of the weights only


def test_raw_checkpoint_of_another_ep_size_starts_a_classifier_and_reports_what_it_loaded(checkpoints):
    run = checkpoints[2]
    model, report = load_pretrained(WideNetForSequenceClassification, run / "checkpoints", num_labels=3,
                                    model_overrides={"hidden_dropout": 0.1, "moe": {"capacity_factor": 2.0}})
    assert report.ep_size == 1 and model.cfg.hidden_dropout == 0.1 and model.cfg.moe.capacity_factor == 2.0
    assert report.new == ["classifier.bias", "classifier.weight"]
    assert report.unused == sorted(["mlm_head.bias", "mlm_head.dense.weight", "mlm_head.dense.bias",
                                    "mlm_head.norm.weight", "mlm_head.norm.bias", "sop_head.weight", "sop_head.bias"])
    summary = report.summary()
    assert "step 2" in summary and "saved with ep_size 2, loaded with ep_size 1" in summary
    assert "newly initialised: classifier.bias, classifier.weight" in summary
    # the encoder is the checkpoint's, tensor for tensor
    saved = CheckpointSource.open(run, "source", purpose=CONVERT).read_weights().state
    for key, tensor in model.state_dict().items():
        if key.startswith("widenet."):
            assert torch.equal(tensor, saved[key]), key


def test_reshard_ep2_to_ep1_to_ep2_loads_in_engines_with_identical_logits(checkpoints, tmp_path):
    run = checkpoints[2]
    assert convert(["reshard", str(run), str(tmp_path / "ep1"), "--ep-size", "1", "--world-size", "1"]) == 0
    meta = json.loads((tmp_path / "ep1" / "step2" / "widenet_checkpoint.json").read_text())
    assert meta["ep_size"] == 1 and "ep_size" not in meta["model_config"]["moe"] and meta["world_size"] == 1
    assert meta["resharded_from"]["ep_size"] == 2
    # The training state comes along, shape-free (a --resume re-lays it out: tests/integration/test_resume_new_shape.py)
    assert meta["optimizer_states"] is True and meta["shape_free_state"] == "shape_free"
    carried = tmp_path / "ep1" / "step2" / "shape_free" / "tensors.safetensors"
    assert load_file(carried).keys() == save_free_state_keys(run)
    run_deepspeed(SCRIPT, ["load", str(tmp_path / "ep1" / "step2"), "1", str(tmp_path / "ep1_logits")], num_ranks=1)
    for name, tensor in load_file(tmp_path / "ep1_logits.rank0.safetensors").items():
        assert torch.equal(tensor, engine_logits(run, 0)[name]), name

    assert convert(["reshard", str(tmp_path / "ep1"), str(tmp_path / "ep2"), "--ep-size", "2", "--world-size", "2"]) == 0
    assert (tmp_path / "ep2" / "step2" / "shape_free" / "tensors.safetensors").read_bytes() == carried.read_bytes()
    assert convert(["to-folder", str(tmp_path / "ep2"), str(tmp_path / "folder")]) == 0
    proc = run_deepspeed(SCRIPT, ["load", str(tmp_path / "ep2" / "step2"), "2", str(tmp_path / "ep2_logits"),
                                  str(tmp_path / "folder")], num_ranks=2)
    assert "this rank holds global experts [2, 3]" in proc.stdout + proc.stderr
    for rank in (0, 1):
        for prefix in ("ep2_logits", "ep2_logits.folder"):  # the resharded checkpoint, and the folder at ep_size 2
            for name, tensor in load_file(tmp_path / f"{prefix}.rank{rank}.safetensors").items():
                assert torch.equal(tensor, engine_logits(run, rank)[name]), (prefix, rank, name)


def save_free_state_keys(run: Path) -> set[str]:
    """The tensors of a checkpoint's shape-free state, read from the checkpoint itself."""
    from widenet_ds.checkpoint.shape_free import read_shape_free
    state = read_shape_free(CheckpointSource.open(run, "source", purpose=CONVERT))
    return {f"master/{n}" for n in state.master} | {f"{k}/{n}" for k, t in state.optimizer.items() for n in t}


def test_reshard_refuses_layouts_that_cannot_hold_the_experts(checkpoints, tmp_path):
    from widenet_ds.errors import ConfigError
    with pytest.raises(ConfigError, match=r"--ep-size 2 does not divide the 3 rank\(s\)"):
        convert(["reshard", str(checkpoints[1]), str(tmp_path / "x"), "--ep-size", "2", "--world-size", "3"])
    with pytest.raises(ConfigError, match="--ep-size 3 does not divide the model's 4 experts"):
        convert(["reshard", str(checkpoints[1]), str(tmp_path / "x"), "--ep-size", "3", "--world-size", "3"])
    assert not (tmp_path / "x").exists()


def test_a_tag_that_does_not_exist_is_named_with_the_ones_that_do(checkpoints, tmp_path):
    with pytest.raises(CheckpointError, match=r"tag 'step7' does not exist .* available tags: step2"):
        convert(["to-folder", str(checkpoints[1]), str(tmp_path / "out"), "--tag", "step7"])
    assert not (tmp_path / "out").exists()


def test_a_moe_checkpoint_is_refused_by_to_albert(checkpoints, tmp_path):
    with pytest.raises(CheckpointError, match="Mixture-of-Experts.*to-folder"):
        convert(["to-albert", str(checkpoints[1]), str(tmp_path / "albert")])
    assert not (tmp_path / "albert").exists() and not list(tmp_path.iterdir())


def test_a_missing_expert_file_is_an_error_naming_it(checkpoints, tmp_path):
    import shutil
    partial = tmp_path / "partial"
    shutil.copytree(checkpoints[1] / "checkpoints" / "step2", partial)
    (partial / "layer_0_expert_3_mp_rank_00_model_states.pt").unlink()
    with pytest.raises(CheckpointError, match=r"layer_0_expert_3_mp_rank_00_model_states\.pt: missing"):
        convert(["to-folder", str(partial), str(tmp_path / "out")])  # named by the marker's records, before reading
    assert not (tmp_path / "out").exists()
    marker = json.loads((partial / "widenet_checkpoint.json").read_text())
    del marker["files"]  # a marker of a version before the records: the reader names the file
    marker["format_version"] = 1
    (partial / "widenet_checkpoint.json").write_text(json.dumps(marker))
    with pytest.raises(CheckpointError, match="layer_0_expert_3_mp_rank_00_model_states.pt does not exist"):
        convert(["to-folder", str(partial), str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_without_a_recorded_model_config_the_converter_asks_for_one(checkpoints, tmp_path):
    import shutil
    bare = tmp_path / "bare"
    shutil.copytree(checkpoints[1] / "checkpoints" / "step2", bare)
    (bare / "widenet_checkpoint.json").unlink()
    with pytest.raises(CheckpointError, match="pass --model-config"):
        convert(["to-folder", str(bare), str(tmp_path / "out")])
    saved = json.loads((checkpoints[1] / "checkpoints" / "step2" / "widenet_checkpoint.json").read_text())
    (tmp_path / "model.json").write_text(json.dumps(saved["model_config"]))
    assert convert(["to-folder", str(bare), str(tmp_path / "out"), "--model-config", str(tmp_path / "model.json")]) == 0
    # a config of another model is refused by the key/shape check, naming the keys
    wrong = {**saved["model_config"], "moe": {**saved["model_config"]["moe"], "num_experts": 8}}
    (tmp_path / "wrong.json").write_text(json.dumps(wrong))
    with pytest.raises(CheckpointError, match="num_experts"):
        convert(["to-folder", str(bare), str(tmp_path / "out2"), "--model-config", str(tmp_path / "wrong.json")])


def test_a_marker_naming_its_architecture_is_read_and_an_unknown_one_refused(checkpoints, tmp_path):
    import shutil
    new = CheckpointSource.open(checkpoints[1], "source", purpose=CONVERT).read_weights()  # markers name it
    marker = json.loads((checkpoints[1] / "checkpoints/step2/widenet_checkpoint.json").read_text())
    assert marker["architecture"] == new.architecture == "WideNetForPreTraining"
    unnamed = tmp_path / "unnamed"  # as text markers before the one trainer (version 1): no architecture, read off
    shutil.copytree(checkpoints[1] / "checkpoints" / "step2", unnamed)  # the heads
    (unnamed / "widenet_checkpoint.json").write_text(json.dumps({**{k: v for k, v in marker.items()
                                                                    if k != "architecture"}, "format_version": 1}))
    old = CheckpointSource.open(unnamed, "source", purpose=CONVERT).read_weights()
    assert new.architecture == old.architecture and new.config == old.config
    assert all(torch.equal(new.state[k], old.state[k]) for k in old.state)
    named = unnamed
    (named / "widenet_checkpoint.json").write_text(json.dumps({**marker, "architecture": "GPTForCausalLM"}))
    with pytest.raises(CheckpointError, match="names architecture 'GPTForCausalLM', which widenet-ds does not know"):
        CheckpointSource.open(named, "source", purpose=CONVERT).read_weights()


def test_a_failure_while_writing_leaves_no_output(checkpoints, tmp_path):
    checkpoint = CheckpointSource.open(checkpoints[1], "source", purpose=CONVERT).read_weights()
    with pytest.raises(FileNotFoundError):
        save_folder(checkpoint, tmp_path / "out", tokenizer=TokenizerFiles((tmp_path / "no-such-tokenizer.json",)))
    assert list(tmp_path.iterdir()) == []
    save_folder(checkpoint, tmp_path / "out")
    with pytest.raises(CheckpointError, match="already exists"):
        save_folder(checkpoint, tmp_path / "out")
    assert read_folder(tmp_path / "out").provenance["step"] == 2


def test_the_command_list_of_widenet_ds_names_every_convert_command():
    from widenet_ds.cli import SUBCOMMANDS
    from widenet_ds.commands.convert import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    listed = SUBCOMMANDS["convert"][1].split(": ", 1)[1].split(", ")
    assert sorted(listed) == sorted(commands)
