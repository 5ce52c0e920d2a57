"""The run configurations: building one touches no file, every problem (of the values and of what they name)
reported at once, a saved configuration read back, and what a resumed run may change."""

from __future__ import annotations

from pathlib import Path

import pytest

from widenet_ds.errors import ConfigError
from widenet_ds.tasks.classify.config import ClassifyConfig
from widenet_ds.tasks.pretrain.config import PretrainConfig
from widenet_ds.training.environment import check_run
from widenet_ds.training.run_config import RESUMABLE_SETTINGS, InvalidConfig, setting_changes

REPO = Path(__file__).resolve().parents[2]

def test_every_problem_of_a_configuration_is_reported_at_once(tmp_path):
    with pytest.raises(InvalidConfig) as refused:  # the values, when it is built
        ClassifyConfig(deepspeed_config=tmp_path / "none.json", output_dir=tmp_path / "o", log_interval=0,
                       epochs=-1, workers=-2, randaugment=(2, 99), branch_parallel=0)
    assert str(refused.value).startswith("6 problems with the classify settings:"), str(refused.value)
    with pytest.raises(ConfigError) as caught:  # with what they name, where the run starts (widenet_ds/run/run_task.py)
        check_run(refused.value.config)
    text = str(caught.value)
    assert text.startswith("7 problems with the classify settings:"), text
    for part in ("--log-interval must be positive", "--branch-parallel must be positive", "no model: pass",
                 "none.json does not exist", "--epochs must be positive", "--workers must be >= 0",
                 "a magnitude in 0..30"):
        assert part in text, part


def test_a_resumed_run_may_change_what_is_logged_but_not_what_is_trained(tmp_path):
    base = PretrainConfig(model_config="albert-tiny", deepspeed_config=REPO / "ds_configs/cpu_small.json",
                          data=tmp_path, output_dir=tmp_path / "o")
    logged = PretrainConfig(model_config="albert-tiny", deepspeed_config=REPO / "ds_configs/cpu_small.json",
                            data=tmp_path, output_dir=tmp_path / "o", log_interval=1, max_steps=50, resume="latest",
                            tensorboard=False)
    assert setting_changes(base.record(), logged.record()) == []
    trained = PretrainConfig(model_config="albert-tiny", deepspeed_config=REPO / "ds_configs/cpu_small.json",
                             data=tmp_path, output_dir=tmp_path / "o", overrides=["hidden_dropout=0.2"], seed=3)
    assert setting_changes(base.record(), trained.record()) == [
        "overrides: [] (the run in the folder) vs ['hidden_dropout=0.2'] (now)",
        "seed: 1234 (the run in the folder) vs 3 (now)"]
    assert {"log_interval", "keep_last", "max_steps", "tensorboard"} <= RESUMABLE_SETTINGS


def test_a_saved_configuration_of_another_version_is_refused(tmp_path):
    record = PretrainConfig(model_config="albert-tiny", deepspeed_config="ds.json", data="d", output_dir="o").record()
    with pytest.raises(ConfigError, match="hold data_dir, which this version does not have"):
        PretrainConfig.from_record({**record, "data_dir": "x"})
