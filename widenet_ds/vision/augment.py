"""Batch augmentation on the training device, after the workers' decode/resize (widenet_ds/vision/loader.py).

The authors' ImageNet pipeline (widenet/train.py), in their order: RandAugment(2 ops, magnitude 15) ->
Inception crop (area 5%..100%) resized back -> random horizontal flip -> scale to [-1, 1] -> mixup of
every batch with a per-sample lambda ~ Beta(alpha, alpha) (alpha 0.5), then label smoothing 0.1 in the
loss. RandAugment and the crop are kornia's (pure PyTorch; torchvision/timm do not run beside this
project's torch build); mixup / CutMix are the few lines of their definitions so that lambda is drawn
per sample from Beta(alpha, alpha) as the authors do. Every draw uses torch's global RNG, which training
checkpoints save.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from widenet_ds.vision.augment_config import AugmentConfig


def normalize(pixels: Tensor) -> Tensor:
    """uint8 (or [0, 1] float) -> [-1, 1], the authors' (x - 127.5) / 127.5."""
    if pixels.dtype == torch.uint8:
        pixels = pixels.float() / 255.0
    return pixels * 2.0 - 1.0


class BatchAugmenter:
    def __init__(self, cfg: AugmentConfig, image_size: int, num_classes: int) -> None:
        import kornia.augmentation as K  # heavy optional package: only training with augmentation needs it
        from kornia.augmentation.auto import RandAugment

        self.cfg = cfg
        self.num_classes = num_classes
        self.randaugment = RandAugment(n=cfg.randaugment_ops, m=cfg.randaugment_magnitude) \
            if cfg.randaugment_ops else None
        self.crop = K.RandomResizedCrop((image_size, image_size), scale=(cfg.crop_min_area, 1.0)) \
            if cfg.inception_crop else None
        self.flip = K.RandomHorizontalFlip() if cfg.flip else None

    def __call__(self, pixels: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """uint8 [B, C, S, S], int [B] -> pixels in [-1, 1] and targets (int [B], or soft [B, classes] when
        mixing)."""
        x = pixels.float() / 255.0
        if self.randaugment is not None:
            gray = x.shape[1] == 1
            # kornia's colour ops need RGB: a grey image as three equal channels, averaged back after.
            x = self.randaugment(x.expand(-1, 3, -1, -1) if gray else x)
            x = x.mean(dim=1, keepdim=True) if gray else x
        if self.crop is not None:
            x = self.crop(x)
        if self.flip is not None:
            x = self.flip(x)
        x = normalize(x.clamp(0.0, 1.0))
        if not self.cfg.mixes:
            return x, labels
        return self._mix(x, labels)

    def _mix(self, x: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        targets = F.one_hot(labels, self.num_classes).float()
        partner = torch.randperm(x.shape[0], device=x.device)
        use_cutmix = self.cfg.cutmix_alpha > 0 and (self.cfg.mixup_alpha == 0 or torch.rand(()) < 0.5)
        if use_cutmix:
            # CutMix: one box per batch, area fraction 1 - lambda, lambda ~ Beta(alpha, alpha).
            lam = torch.distributions.Beta(self.cfg.cutmix_alpha, self.cfg.cutmix_alpha).sample(()).item()
            height, width = x.shape[2:]
            cut_h, cut_w = int(height * (1 - lam) ** 0.5), int(width * (1 - lam) ** 0.5)
            cy, cx = torch.randint(height, ()).item(), torch.randint(width, ()).item()
            top, bottom = max(cy - cut_h // 2, 0), min(cy + cut_h // 2, height)
            left, right = max(cx - cut_w // 2, 0), min(cx + cut_w // 2, width)
            x = x.clone()
            x[:, :, top:bottom, left:right] = x[partner, :, top:bottom, left:right]
            kept = 1 - (bottom - top) * (right - left) / (height * width)
            return x, kept * targets + (1 - kept) * targets[partner]
        lam = torch.distributions.Beta(self.cfg.mixup_alpha, self.cfg.mixup_alpha).sample((x.shape[0],)).to(x.device)
        mixed = lam[:, None, None, None] * x + (1 - lam[:, None, None, None]) * x[partner]
        return mixed, lam[:, None] * targets + (1 - lam[:, None]) * targets[partner]
