"""The environment check of a run: what its configuration names on this machine, looked at where the run starts
(building a configuration looks at nothing); the values' problems with it in training/test_run_config.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from widenet_ds.tasks.classify.config import ClassifyConfig
from widenet_ds.tasks.glue.config import GlueConfig
from widenet_ds.tasks.pretrain.config import PretrainConfig
from widenet_ds.tasks.squad.config import SquadConfig
from widenet_ds.training.environment import environment_problems


def test_building_a_configuration_touches_no_file(tmp_path, monkeypatch):
    """Paths that do not exist (they may exist on the nodes alone): built fine, named by the environment check."""
    gone = tmp_path / "gone"
    monkeypatch.setattr(Path, "stat", lambda *a, **k: pytest.fail("a RunConfig looked at a file"))
    configs = [
        PretrainConfig(model_config="albert-tiny", deepspeed_config=gone / "ds.json", data=gone / "data",
                       output_dir=gone / "o", init_from=gone / "ckpt", compile="model"),
        GlueConfig(glue_task="sst2", data=str(gone / "SST-2"), deepspeed_config=gone / "ds.json", output_dir=gone / "o",
                   init_from=gone / "ckpt", predict_test=True),
        SquadConfig(version="1.1", data=str(gone / "squad"), train_file=str(gone / "t.json"),
                    deepspeed_config=gone / "ds.json", output_dir=gone / "o", model_config="widenet-tiny-e4"),
        ClassifyConfig(model_config="widenet-vit-tiny", deepspeed_config=gone / "ds.json", output_dir=gone / "o")]
    for cfg in configs:
        assert cfg.from_record(cfg.record()) == cfg  # a run's run_config.json reads back
    monkeypatch.undo()
    pretrain, glue, squad, classify = map(environment_problems, configs)
    assert [p.split(" ", 2)[:2] for p in pretrain] == [["--init-from", str(gone / "ckpt")],
                                                      ["DeepSpeed", "config"], ["--data", str(gone / "data")]]
    assert any("--data " in p and "SST-2 does not exist" in p for p in glue)
    assert any(p.startswith("--train-file: ") and "t.json does not exist" in p for p in squad)
    assert len(classify) == 1 and "ds.json does not exist" in classify[0]

