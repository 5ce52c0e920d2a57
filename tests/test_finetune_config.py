"""The finetuning settings in one process: flag validation, recipe overrides reaching the model config,
step count against the schedule, tokenizer resolution, batch shapes for expert parallelism, the median."""

import pytest
import torch
from launching import REPO

from widenet_ds.errors import ConfigError, DataError
from widenet_ds.model.widenet import WideNetForSequenceClassification
from widenet_ds.tasks.recipes import recipe_for
from widenet_ds.training.finetune import _median, resolve_max_steps
from widenet_ds.training.finetune_config import FinetuneConfig
from widenet_ds.training.finetune_weights import build_model, load_tokenizer_for, model_overrides
from widenet_ds.training.predict import Batching

CPU_CONFIG = REPO / "ds_configs/finetune_cpu_small.json"


def _cfg(tmp_path, **fields) -> FinetuneConfig:
    return FinetuneConfig(**{"data": str(tmp_path), "deepspeed_config": CPU_CONFIG, "output_dir": tmp_path / "out",
                             "preset": "widenet-tiny-e4", **fields})


@pytest.mark.parametrize("fields, message", [
    ({"init": "x"}, "exactly one of --init"),
    ({"preset": None}, "exactly one of --init"),
    ({"seeds": 0}, "--seeds must be positive"),
    ({"max_steps": -3}, "--max-steps must be positive"),
    ({"eval_every": -1}, "--eval-every must be >= 0"),
    ({"eval_only": True}, "--eval-only scores pretrained weights"),
])
def test_bad_flags_are_refused_with_the_fix(tmp_path, fields, message):
    with pytest.raises(ConfigError, match=message):
        _cfg(tmp_path, **fields)


def test_missing_data_and_init_paths_are_named(tmp_path):
    with pytest.raises(DataError, match="--data .*nowhere does not exist"):
        _cfg(tmp_path, data=str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="--init .*gone does not exist"):
        _cfg(tmp_path, preset=None, init=str(tmp_path / "gone"))
    assert _cfg(tmp_path, data="hf").data_path is None


def test_recipe_settings_reach_the_model_config_and_flags_win(tmp_path, dist):
    squad = recipe_for("SQuAD1.1")  # Table 7: C 2.0, lambda 0, dropout 0.1
    model, report = build_model(_cfg(tmp_path), WideNetForSequenceClassification, squad, 30522, num_labels=2)
    assert (model.cfg.moe.capacity_factor, model.cfg.moe.balance_loss_weight, model.cfg.hidden_dropout,
            model.cfg.attention_dropout) == (2.0, 0.0, 0.1, 0.1)
    assert "random initialisation" in report
    flags = _cfg(tmp_path, capacity_factor=1.5, balance_loss_weight=0.02, dropout=0.0)
    assert model_overrides(flags, squad) == {
        "hidden_dropout": 0.0, "attention_dropout": 0.0, "classifier_dropout": 0.1,
        "moe": {"capacity_factor": 1.5, "balance_loss_weight": 0.02}}


def test_steps_default_to_the_schedule_and_never_run_past_it(tmp_path):
    recipe = recipe_for("sst2")
    assert resolve_max_steps(_cfg(tmp_path), 200, recipe) == 200
    assert resolve_max_steps(_cfg(tmp_path), None, recipe) == recipe.steps == 5234
    assert resolve_max_steps(_cfg(tmp_path, max_steps=150), 200, recipe) == 150
    with pytest.raises(ConfigError, match="runs past the schedule's total_num_steps 200"):
        resolve_max_steps(_cfg(tmp_path, max_steps=250), 200, recipe)


def test_tokenizer_comes_from_the_init_folder_or_must_be_given(shared_data, tmp_path, dist):
    from widenet_ds.checkpoint.format import PortableCheckpoint, save_folder
    from widenet_ds.model.config import ModelConfig
    from widenet_ds.model.widenet import WideNetForPreTraining

    vocab = tmp_path / "vocab.txt"
    vocab.write_bytes((shared_data / "vocab/bert-base-uncased-vocab.txt").read_bytes())
    cfg = ModelConfig.from_preset("albert-tiny", vocab_size=30522)
    state = WideNetForPreTraining(cfg).state_dict()
    with_vocab = save_folder(PortableCheckpoint(cfg, "WideNetForPreTraining", state), tmp_path / "a",
                             tokenizer_files=(vocab,))
    without = save_folder(PortableCheckpoint(cfg, "WideNetForPreTraining", state), tmp_path / "b")
    tokenizer = load_tokenizer_for(_cfg(tmp_path, preset=None, init=str(with_vocab)))
    assert tokenizer.get_vocab_size() == 30522 and tokenizer.token_to_id("[CLS]") == 101
    with pytest.raises(ConfigError, match="pass --tokenizer"):
        load_tokenizer_for(_cfg(tmp_path, preset=None, init=str(without)))


def test_expert_parallel_batches_have_one_shape_on_every_rank():
    batch = {"input_ids": torch.tensor([[101, 7, 102]]), "token_type_ids": torch.zeros(1, 3, dtype=torch.long),
             "attention_mask": torch.ones(1, 3, dtype=torch.long), "labels": torch.tensor([1])}
    assert Batching(4).shape(batch, pad_id=0) is batch  # ep 1: padded to the longest member only
    fixed = Batching(4, pad_to=6).shape(batch, pad_id=0)
    assert fixed["input_ids"].tolist() == [[101, 7, 102, 0, 0, 0]]
    assert fixed["attention_mask"].tolist() == [[1, 1, 1, 0, 0, 0]] and fixed["labels"].tolist() == [1]


def test_the_median_is_taken_per_metric_over_seeds():
    runs = [{"metrics": {"dev": {"acc": a, "f1": f}}} for a, f in ((0.7, 0.1), (0.9, 0.3), (0.8, 0.2))]
    assert _median(runs) == {"dev": {"acc": 0.8, "f1": 0.2}}
