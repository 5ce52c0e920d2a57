"""The run configurations: every problem reported at once, and what a resumed run may change."""

from __future__ import annotations

from pathlib import Path

import pytest

from widenet_ds.errors import ConfigError
from widenet_ds.training.run_config import RESUMABLE_SETTINGS, ClassifyConfig, PretrainConfig, setting_changes

REPO = Path(__file__).resolve().parents[2]

def test_every_problem_of_a_configuration_is_reported_at_once(tmp_path):
    with pytest.raises(ConfigError) as caught:
        ClassifyConfig(deepspeed_config=tmp_path / "none.json", output_dir=tmp_path / "o", log_interval=0,
                       epochs=-1, workers=-2, randaugment=(2, 99), branch_parallel=0)
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
