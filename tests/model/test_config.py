import json

import pytest

from widenet_ds.errors import ConfigError
from widenet_ds.model.config import PRESETS, ModelConfig, MoEConfig


def test_presets_round_trip_through_json(tmp_path):
    for name in PRESETS:
        cfg = ModelConfig.from_preset(name)
        cfg.to_json(tmp_path / f"{name}.json")
        assert ModelConfig.from_json(tmp_path / f"{name}.json") == cfg


def test_overrides_reach_nested_moe():
    cfg = ModelConfig.from_preset("widenet-tiny-e4", vocab_size=123, moe={"top_k": 1, "combine_weights": "renormalize"})
    assert cfg.vocab_size == 123 and cfg.moe.top_k == 1 and cfg.moe.num_experts == 4
    assert cfg.moe.combine_weights == "renormalize"


# Each bad configuration gives one ConfigError whose message names the field (and so the fix).
BAD = [
    (dict(moe={"ep_size": 2}), "'ep_size' is a run setting, not part of the model config; remove it and pass --ep-size"),
    (dict(activation_checkpointing=True), "'activation_checkpointing' is a run setting.*--activation-checkpointing"),
    (dict(moe={"top_k": 5}), "top_k = 5 exceeds num_experts"),
    (dict(hidden_size=129), "not divisible by num_heads"),
    (dict(moe={"capacity_factor": 0}), "capacity_factor"),
    (dict(moe={"noise": "gumbel"}), "noise"),
    (dict(moe={"combine_weights": "softmax"}), "combine_weights"),
    (dict(routing_groups=3), "routing_groups = 3 must divide num_layers"),
    (dict(routing_groups=2, share_ffn=False), "needs share_ffn"),
    (dict(hidden_dropout=1.5), "hidden_dropout"),
    (dict(activation="relu"), "activation"),
    (dict(norm_position="middle"), "norm_position"),
    (dict(share_layernorm=True, share_attention=False), "share_layernorm"),
    (dict(moe={"noise": "rsample"}), "rsample"),
    (dict(vocab_size=0), "vocab_size"),
    (dict(moe={"balance_loss_weight": -1.0}), "balance_loss_weight"),
    (dict(moe={"min_capacity": -2}), "min_capacity"),
]


@pytest.mark.parametrize("overrides,message", BAD, ids=[m for _, m in BAD])
def test_bad_configs_raise_one_clear_error(overrides, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_preset("widenet-tiny-e4", **overrides)


def test_unknown_keys_are_refused_with_a_suggestion(tmp_path):
    data = ModelConfig.from_preset("widenet-tiny-e4").to_dict()
    data["hiden_size"] = data.pop("hidden_size")
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="unknown key 'hiden_size'.*Did you mean 'hidden_size'"):
        ModelConfig.from_json(path)
    data = ModelConfig.from_preset("widenet-tiny-e4").to_dict()
    data["moe"]["capacity"] = 2
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="ModelConfig.moe: unknown key 'capacity'"):
        ModelConfig.from_json(path)


def test_unknown_preset_and_missing_file():
    with pytest.raises(ConfigError, match="Did you mean 'widenet-base-e8'"):
        ModelConfig.from_preset("widenet-base-e08")
    with pytest.raises(ConfigError, match="does not exist"):
        ModelConfig.load("/nonexistent/model.json")


def test_moe_config_defaults_are_the_papers():
    moe = MoEConfig()
    assert (moe.top_k, moe.capacity_factor, moe.balance_loss_weight, moe.noise) == (2, 1.2, 0.01, "gaussian")
    assert moe.second_expert_sampling is False


def test_model_config_cli_writes_overrides_and_refuses_bad_ones(tmp_path, capsys):
    from widenet_ds.cli import main
    out = tmp_path / "m.json"
    assert main(["model-config", "widenet-tiny-e4", "--set", "vocab_size=8000", "--set", "moe.num_experts=8",
                 "--set", "norm_position=pre", "--output", str(out)]) == 0
    cfg = ModelConfig.from_json(out)
    assert (cfg.vocab_size, cfg.moe.num_experts, cfg.norm_position) == (8000, 8, "pre")
    assert main(["model-config", "widenet-tiny-e4", "--set", "moe.ep_size=2", "--output", str(tmp_path / "x.json")]) == 2
    assert "is a run setting" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
