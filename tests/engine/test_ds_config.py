"""DeepSpeed JSON validation: unknown keys, batch arithmetic, ZeRO with MoE, precision, optimizer, and
every shipped config in ds_configs/ (validated, and read by DeepSpeed's own config parser)."""

from __future__ import annotations

import json

import pytest

from tests.support.launching import REPO
from widenet_ds.engine.ds_config import load_ds_config, validate_ds_config
from widenet_ds.errors import ConfigError

# The pretraining configs (the finetuning ones, finetune_*.json, are tested with finetuning).
CPU_SIZED = ("cpu_small.json", "cpu_small_bf16.json")
SHIPPED = sorted((REPO / "ds_configs").glob("pretrain_*.json")) + [REPO / "ds_configs" / name for name in CPU_SIZED]
BASE = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 8,
        "optimizer": {"type": "Lamb", "params": {"lr": 0.01}}, "zero_allow_untested_optimizer": True}


def check(config, world_size=1, has_moe=True, cuda_available=False):
    return validate_ds_config(config, world_size=world_size, has_moe=has_moe, cuda_available=cuda_available)


def test_misspelled_top_level_key_is_refused_with_a_suggestion():
    with pytest.raises(ConfigError, match=r"unknown key 'gradient_cliping'.*Did you mean 'gradient_clipping'"):
        check({**BASE, "gradient_cliping": 1.0})


def test_accumulation_is_derived_from_the_world_size():
    assert check(BASE, world_size=1).batch.gradient_accumulation_steps == 2
    assert check(BASE, world_size=2).batch.gradient_accumulation_steps == 1


def test_batch_sizes_disagreeing_with_the_world_size_name_the_fix():
    config = {**BASE, "gradient_accumulation_steps": 2}
    assert check(config, world_size=1).batch.train_batch_size == 16
    with pytest.raises(ConfigError, match=r"16 != train_micro_batch_size_per_gpu 8 x gradient_accumulation_steps "
                                          r"2 x 2 data-parallel rank\(s\) = 32.*set gradient_accumulation_steps to 1"):
        check(config, world_size=2)


def test_batch_that_no_whole_accumulation_fits_is_refused():
    # DeepSpeed would floor 16 // (8 * 3) to 0 and fail later on a bare assert.
    with pytest.raises(ConfigError, match=r"not a multiple of train_micro_batch_size_per_gpu 8 x 3"):
        check(BASE, world_size=3)


def test_zero3_with_moe_is_refused_but_allowed_for_dense_models():
    config = {**BASE, "zero_optimization": {"stage": 3}}
    with pytest.raises(ConfigError, match=r"ZeRO stage 3.*MoE supports ZeRO stage 1 and 2 only"):
        check(config, has_moe=True)
    assert check(config, has_moe=False).zero_stage == 3


def test_fp16_without_cuda_names_the_cpu_config_and_bf16_runs_on_cpu():
    with pytest.raises(ConfigError, match=r"fp16 needs a CUDA device; use ds_configs/cpu_small.json or remove fp16"):
        check({**BASE, "fp16": {"enabled": True}})
    assert check({**BASE, "fp16": {"enabled": True}}, cuda_available=True).precision == "fp16"
    assert check({**BASE, "bf16": {"enabled": True}}).precision == "bf16"
    with pytest.raises(ConfigError, match="both fp16 and bf16"):
        check({**BASE, "fp16": {"enabled": True}, "bf16": {"enabled": True}}, cuda_available=True)


def test_unknown_optimizer_and_lamb_parameter_are_refused():
    with pytest.raises(ConfigError, match=r"unknown optimizer type 'Lamd'.*Did you mean"):
        check({**BASE, "optimizer": {"type": "Lamd", "params": {}}})
    with pytest.raises(ConfigError, match=r"Lamb has no parameter 'weight_decy'.*Did you mean 'weight_decay'"):
        check({**BASE, "optimizer": {"type": "Lamb", "params": {"weight_decy": 0.01}}})
    assert check({**BASE, "optimizer": {"type": "AdamW", "params": {}}}).optimizer_type == "AdamW"


def test_lamb_under_zero_needs_the_untested_optimizer_switch():
    config = {**BASE, "zero_optimization": {"stage": 1}}
    del config["zero_allow_untested_optimizer"]
    with pytest.raises(ConfigError, match=r"add \"zero_allow_untested_optimizer\": true"):
        check(config)


def test_scheduler_peak_must_equal_the_optimizer_lr():
    config = {**BASE, "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 10,
                                                                        "warmup_max_lr": 0.02}}}
    with pytest.raises(ConfigError, match=r"optimizer.params.lr 0.01 differs from scheduler.params.warmup_max_lr"):
        check(config)
    with pytest.raises(ConfigError, match=r"unknown scheduler type 'WarmupDecay'.*Did you mean 'WarmupDecayLR'"):
        check({**BASE, "scheduler": {"type": "WarmupDecay", "params": {}}})


def test_broken_json_names_the_position(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"train_batch_size": 16,\n "optimizer": }')
    with pytest.raises(ConfigError, match=r"not valid JSON: .* line 2"):
        load_ds_config(path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_ds_config(tmp_path / "missing.json")


def test_every_shipped_config_has_docs_and_fits_its_stated_world_sizes():
    readme = (REPO / "ds_configs" / "README.md").read_text()
    assert len(SHIPPED) >= 10
    for path in SHIPPED:
        config = load_ds_config(path)
        assert config["_comment"], path
        assert path.name in readme, f"{path.name} is not described in ds_configs/README.md"
        worlds = (1, 2) if path.name in CPU_SIZED else (1, 8, 64)
        for world in worlds:
            settings = check(config, world_size=world, cuda_available=True)
            assert settings.batch.train_batch_size == config["train_batch_size"]
        if path.name.startswith("pretrain_phase"):
            assert config["train_batch_size"] == 4096
            assert config["optimizer"] == {"type": "Lamb", "params": {"lr": 0.00176, "betas": [0.9, 0.999],
                                                                      "eps": 1e-6, "weight_decay": 0.01}}
            assert config["scheduler"]["params"]["warmup_type"] == "linear"


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_deepspeed_itself_accepts_each_shipped_config(path):
    """DeepSpeed's own parser (pydantic sub-configs forbid unknown keys) reads each file as it is."""
    from deepspeed.runtime.config import DeepSpeedConfig

    config = json.loads(path.read_text())
    parsed = DeepSpeedConfig(config)  # no process group: world size 1
    assert parsed.train_batch_size == config["train_batch_size"]
    assert parsed.zero_optimization_stage == config["zero_optimization"]["stage"]
