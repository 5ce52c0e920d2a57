"""The augmentation settings of an image run (`--randaugment`, `--inception-crop`, `--mixup-alpha`, ...), checked
when built: plain values, so that a run configuration holding them imports no torch (the augmentation itself:
widenet_ds/vision/augment.py)."""

from __future__ import annotations

from dataclasses import dataclass

from widenet_ds.errors import ConfigError


@dataclass
class AugmentConfig:
    randaugment_ops: int = 0          # 0: off; the authors: 2
    randaugment_magnitude: int = 15   # kornia's 0..30 scale
    inception_crop: bool = False      # RandomResizedCrop(scale=(crop_min_area, 1))
    crop_min_area: float = 0.05
    flip: bool = False
    mixup_alpha: float = 0.0          # 0: off; the authors: 0.5, every batch, lambda per sample
    cutmix_alpha: float = 0.0         # 0: off; with both, each batch picks one of the two at random
    label_smoothing: float = 0.0      # the authors: 0.1

    def __post_init__(self) -> None:
        if self.randaugment_ops < 0 or not 0 <= self.randaugment_magnitude <= 30:
            raise ConfigError(f"--randaugment {self.randaugment_ops},{self.randaugment_magnitude}: needs ops >= 0 and "
                              f"a magnitude in 0..30 (kornia's scale), e.g. 2,15.")
        if not 0 < self.crop_min_area <= 1:
            raise ConfigError(f"--crop-min-area {self.crop_min_area} must be in (0, 1].")
        if self.mixup_alpha < 0 or self.cutmix_alpha < 0:
            raise ConfigError("--mixup-alpha and --cutmix-alpha must be >= 0 (0 turns them off).")
        if not 0 <= self.label_smoothing < 1:
            raise ConfigError(f"--label-smoothing {self.label_smoothing} must be in [0, 1).")

    @property
    def mixes(self) -> bool:
        return self.mixup_alpha > 0 or self.cutmix_alpha > 0
