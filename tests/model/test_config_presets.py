"""Every preset's stored config is the one recorded before the text and image configs shared one encoder
config (tests/assets/preset_configs.json): the same keys and values, written to the same JSON text, so
every config file, checkpoint marker (its sha256 of the config) and folder written before still compares
equal."""

from __future__ import annotations

import json

import pytest

from tests.support.launching import REPO
from widenet_ds.checkpoint.marker import config_sha256
from widenet_ds.model.config import PRESETS, ModelConfig
from widenet_ds.vision.config import VISION_PRESETS, VisionConfig

RECORDED = json.loads((REPO / "tests" / "assets" / "preset_configs.json").read_text())
FAMILIES = {"text": (ModelConfig, PRESETS), "image": (VisionConfig, VISION_PRESETS)}
CASES = [(family, name) for family, (_, presets) in FAMILIES.items() for name in presets]


def test_every_preset_was_recorded():
    assert {family: sorted(presets) for family, (_, presets) in FAMILIES.items()} == \
        {family: sorted(RECORDED[family]) for family in FAMILIES}


@pytest.mark.parametrize("family, name", CASES, ids=[name for _, name in CASES])
def test_stored_config_is_unchanged(family, name):
    cls, _ = FAMILIES[family]
    recorded = RECORDED[family][name]
    cfg = cls.from_preset(name)
    # the JSON text, not only dict equality: 1 and 1.0 compare equal but are written differently
    assert json.dumps(cfg.to_dict(), sort_keys=True) == json.dumps(recorded, sort_keys=True)
    assert config_sha256(cfg.to_dict()) == config_sha256(recorded)
    assert cls.from_dict(recorded) == cfg
