"""`widenet-ds launch`'s own part: the task's options checked (syntax and values) before any rank starts,
`launch_config(cfg)` for Python callers, and `--config run_config.json` to run a saved configuration again. The
launcher under it: tests/runtime/test_launch.py; real launches: tests/integration/."""

from __future__ import annotations

import json

import pytest

from tests.support.launching import REPO

from widenet_ds import launch_cli
from widenet_ds.errors import LaunchError
from widenet_ds.runtime.launch import LaunchOptions
from widenet_ds.training.run_config import GlueConfig, PretrainConfig

DS = REPO / "ds_configs/cpu_small.json"


@pytest.fixture
def launched(monkeypatch):
    """The options `launch` gets, checked as it checks them; no rank started."""
    seen: list[LaunchOptions] = []

    def launch(options, check_task_options=None):
        if check_task_options is not None:
            check_task_options(options)
        seen.append(options)
        return 0

    monkeypatch.setattr(launch_cli, "launch", launch)
    return seen


def test_a_configuration_is_launched_as_its_command_line(tmp_path, launched):
    cfg = PretrainConfig(model_config="widenet-tiny-e4", deepspeed_config=tmp_path / "on-the-nodes.json",
                         data=tmp_path / "data", output_dir=tmp_path / "run", max_steps=3, overrides=["moe.top_k=1"])
    assert launch_cli.launch_config(cfg, ranks_per_node=2) == 0
    (options,) = launched
    assert (options.task, options.ranks_per_node, options.train_args) == ("pretrain", 2, tuple(cfg.to_argv()))


def test_values_are_refused_before_any_rank_starts(launched):
    with pytest.raises(LaunchError, match=r"the glue options after `--`: 2 problems with the glue settings:(.|\n)*"
                                          r"--log-interval must be positive(.|\n)*--seeds must be positive"):
        launch_cli.cli(["glue", "--", "--task", "sst2", "--data", "hf", "--deepspeed-config", "x.json",
                        "--output-dir", "o", "--model-config", "widenet-tiny-e4", "--seeds", "0", "--log-interval",
                        "0"])
    with pytest.raises(LaunchError, match=r"the glue options after `--`: the following arguments are required"):
        launch_cli.cli(["glue", "--", "--data", "hf"])
    assert launched == []


def test_a_saved_configuration_is_launched_again(tmp_path, launched):
    cfg = GlueConfig(glue_task="sst2", data="hf", deepspeed_config=DS, output_dir=tmp_path / "run", seeds=3,
                     model_config="widenet-tiny-e4", overrides=["hidden_dropout=0.0"])
    run = tmp_path / "run"
    run.mkdir()
    # as the trainer writes it: the settings, the task's name and what the DeepSpeed JSON held
    (run / "run_config.json").write_text(json.dumps({**cfg.record(), "deepspeed_settings": {"train_batch_size": 8}}))
    for given in (run, run / "run_config.json"):
        assert launch_cli.cli(["glue", "--num-ranks", "1", "--config", str(given), "--", "--resume"]) == 0
        options = launched.pop()
        assert options.train_args == (*cfg.to_argv(), "--resume") and options.run_config is None
        assert GlueConfig.from_record(cfg.record()) == cfg
    with pytest.raises(LaunchError, match=r"holds the settings of a glue run; launch `glue`"):
        launch_cli.cli(["squad", "--config", str(run)])
    with pytest.raises(LaunchError, match=r"--config .*nowhere: cannot read the run's settings"):
        launch_cli.cli(["glue", "--config", str(tmp_path / "nowhere")])
