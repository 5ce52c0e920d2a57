"""The augmentation settings (widenet_ds/vision/augment_config.py): each impossible one refused with the flag to
fix."""

from __future__ import annotations

import pytest

from widenet_ds.errors import ConfigError
from widenet_ds.vision.augment_config import AugmentConfig


@pytest.mark.parametrize(("settings", "flag"), [
    ({"randaugment_ops": -1}, "--randaugment -1,15"), ({"randaugment_magnitude": 31}, "magnitude in 0..30"),
    ({"crop_min_area": 0.0}, "--crop-min-area 0.0"), ({"mixup_alpha": -0.5}, "--mixup-alpha"),
    ({"cutmix_alpha": -1.0}, "--cutmix-alpha"), ({"label_smoothing": 1.0}, "--label-smoothing 1.0")])
def test_impossible_settings_name_their_flag(settings, flag):
    with pytest.raises(ConfigError, match=flag):
        AugmentConfig(**settings)
