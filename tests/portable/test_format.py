"""The checkpoint folder format: round trip, and every kind of bad input refused with its name."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch

from widenet_ds.checkpoint.deepspeed import load_torch_file
from widenet_ds.checkpoint.source import load_pretrained
from widenet_ds.errors import CheckpointError
from widenet_ds.formats import upgrade
from widenet_ds.model.config import ModelConfig
from widenet_ds.model.widenet import WideNetForPreTraining, WideNetForQuestionAnswering
from widenet_ds.portable.format import PortableCheckpoint, check_same_model, config_differences, read_folder, save_folder

pytestmark = pytest.mark.usefixtures("dist")


def tiny_config() -> ModelConfig:
    return ModelConfig.from_preset("widenet-tiny-e4", vocab_size=120, max_position_embeddings=32, num_layers=2)


@pytest.fixture
def folder(tmp_path) -> Path:
    torch.manual_seed(0)
    model = WideNetForPreTraining(tiny_config())
    checkpoint = PortableCheckpoint(model.cfg, "WideNetForPreTraining", model.state_dict(), provenance={"step": 7})
    return save_folder(checkpoint, tmp_path / "folder")


class CreatesAFile:
    """A pickle whose loading would run code: `os.system("touch <marker>")`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_folder_round_trip_gives_the_same_logits(folder):
    torch.manual_seed(0)
    original = WideNetForPreTraining(tiny_config())
    loaded, report = load_pretrained(WideNetForPreTraining, folder)
    assert report.loaded == len(original.state_dict()) and report.provenance["step"] == 7
    ids = torch.randint(0, 120, (2, 16))
    for m in (original, loaded):
        m.ensure_process_groups()
        m.eval()
    with torch.no_grad():
        assert torch.equal(original(ids).mlm_logits, loaded(ids).mlm_logits)


def test_a_task_head_differs_but_the_encoder_must_match(folder):
    model, report = load_pretrained(WideNetForQuestionAnswering, folder)
    assert report.new == ["qa_outputs.bias", "qa_outputs.weight"]
    assert "sop_head.weight" in report.unused
    with pytest.raises(CheckpointError, match=r"(?s)fc_in.weight: \(512, 128\) in the checkpoint, \(256, 128\) in the "
                                              r"model.*intermediate_size: 512 \(checkpoint\) vs 256"):
        load_pretrained(WideNetForPreTraining, folder, model_overrides={"intermediate_size": 256})


def test_a_truncated_safetensors_file_is_refused(folder):
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated or damaged"):
        read_folder(folder)


def test_a_config_that_does_not_match_the_weights_names_the_keys(folder):
    config = json.loads((folder / "config.json").read_text())
    config["model"]["intermediate_size"] = 256
    config["model"]["moe"]["num_experts"] = 2
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"unknown key\(s\): widenet.encoder.ffn.0.moe.deepspeed_moe.experts"
                                              r".deepspeed_experts.2.*shape mismatch"):
        read_folder(folder)


def test_a_pickle_given_as_safetensors_is_refused_and_never_run(folder, tmp_path):
    marker = tmp_path / "pwned"
    with open(folder / "model.safetensors", "wb") as fh:
        pickle.dump({"weight": CreatesAFile(marker)}, fh)
    with pytest.raises(CheckpointError, match="is a pickle .* refused"):
        read_folder(folder)
    torch.save({"weight": CreatesAFile(marker)}, folder / "model.safetensors")  # torch's zip pickle
    with pytest.raises(CheckpointError, match="is a pickle"):
        read_folder(folder)
    assert not marker.exists()


def test_a_malicious_deepspeed_file_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "pwned"
    torch.save({"module": {"w": torch.ones(2)}, "payload": CreatesAFile(marker)}, tmp_path / "mp_rank_00_model_states.pt")
    with pytest.raises(CheckpointError, match="refused to read .* never unpickles"):
        load_torch_file(tmp_path / "mp_rank_00_model_states.pt")
    assert not marker.exists()
    torch.save({"module": {"w": torch.ones(2)}}, tmp_path / "ok.pt")  # tensors and containers are fine
    assert torch.equal(load_torch_file(tmp_path / "ok.pt")["module"]["w"], torch.ones(2))


def test_a_folder_of_another_format_version_or_without_weights_is_refused(folder):
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="no model.safetensors .*pytorch_model.bin: pickles are refused"):
        read_folder(folder)
    config = json.loads((folder / "config.json").read_text())
    assert config["format_version"] == 3  # what this version writes
    (folder / "config.json").write_text(json.dumps({**config, "format_version": 4}))
    with pytest.raises(CheckpointError, match=r"config.json \(checkpoint folder's config\) is of format version 4, "
                                              r"newer than this widenet-ds reads \(up to version 3\)"):
        read_folder(folder)
    (folder / "config.json").write_text(json.dumps({**config, "format_version": "2"}))
    with pytest.raises(CheckpointError, match=r"format_version '2', a JSON text, not a whole number, which is no "
                                              r"version"):
        read_folder(folder)


def test_config_differences_name_each_field_with_both_values():
    widenet = ModelConfig.from_preset("widenet-tiny-e4", vocab_size=1000).to_dict()
    albert = ModelConfig.from_preset("albert-tiny", vocab_size=1000).to_dict()
    diffs = config_differences(albert, widenet)
    assert "ffn: 'dense' (checkpoint) vs 'moe' (this run)" in diffs
    assert "share_layernorm: True (checkpoint) vs False (this run)" in diffs
    changed = json.loads(json.dumps(widenet))
    changed["moe"]["num_experts"] = 8
    assert config_differences(widenet, changed) == ["moe.num_experts: 4 (checkpoint) vs 8 (this run)"]
    legacy = json.loads(json.dumps(widenet))  # a checkpoint written before 0.2 records run settings in its config
    legacy["activation_checkpointing"], legacy["moe"]["ep_size"] = True, 2
    del legacy["moe"]["capacity_rounding"]  # a field added later takes its default
    marker = upgrade("marker", {"step": 1, "samples": 8, "world_size": 2, "model_config": legacy}, "ckpt")
    assert marker["ep_size"] == 2  # (formats.py moves the run settings out of the config)
    check_same_model(marker["model_config"], widenet, "ckpt")  # they are not model differences
    with pytest.raises(CheckpointError, match=r"another model config; differing fields:\n  moe.num_experts"):
        check_same_model(widenet, changed, "ckpt")
