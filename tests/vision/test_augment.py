"""Batch augmentation (widenet_ds/vision/augment.py): pixels scaled to [-1, 1], and mixup / CutMix targets that
match the pixels they were mixed from."""

from __future__ import annotations

import torch

from widenet_ds.vision.augment import BatchAugmenter, normalize
from widenet_ds.vision.augment_config import AugmentConfig

CLASSES = 8


def constant_images(count: int = CLASSES, size: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Image i is grey level 30 * i everywhere, of class i: where a pixel came from is its value."""
    pixels = (torch.arange(count, dtype=torch.uint8) * 30).view(count, 1, 1, 1).expand(count, 1, size, size)
    return pixels.contiguous(), torch.arange(count)


def test_pixels_are_scaled_to_minus_one_one_and_labels_kept_without_mixing():
    assert normalize(torch.tensor([0, 255], dtype=torch.uint8)).tolist() == [-1.0, 1.0]
    assert normalize(torch.tensor([0.0, 0.5, 1.0])).tolist() == [-1.0, 0.0, 1.0]
    pixels, labels = constant_images()
    out, targets = BatchAugmenter(AugmentConfig(), 8, CLASSES)(pixels, labels)
    assert targets is labels and out.dtype == torch.float32
    assert torch.allclose(out[:, 0, 0, 0], pixels[:, 0, 0, 0].float() / 127.5 - 1)


def test_mixup_targets_are_the_pixels_mixing_weights():
    torch.manual_seed(0)
    pixels, labels = constant_images()
    out, targets = BatchAugmenter(AugmentConfig(mixup_alpha=0.5), 8, CLASSES)(pixels, labels)
    assert targets.shape == (CLASSES, CLASSES) and torch.allclose(targets.sum(dim=1), torch.ones(CLASSES))
    mixed_somewhere = False
    for i in range(CLASSES):
        weights = {c: w for c, w in enumerate(targets[i].tolist()) if w > 1e-6}
        # each image is its own class at weight lambda and its partner's at 1 - lambda (or itself alone)
        assert i in weights and len(weights) <= 2
        expected = sum(w * (30 * c / 127.5 - 1) for c, w in weights.items())
        assert torch.allclose(out[i], torch.full_like(out[i], expected), atol=1e-5)
        mixed_somewhere |= len(weights) == 2
    assert mixed_somewhere


def test_cutmix_targets_are_the_share_of_pixels_each_image_gave():
    torch.manual_seed(3)
    pixels, labels = constant_images(size=16)
    augment = BatchAugmenter(AugmentConfig(cutmix_alpha=1.0), 16, CLASSES)
    for _ in range(5):  # one box per batch: several batches, several boxes
        out, targets = augment(pixels, labels)
        levels = torch.round((out + 1) * 127.5 / 30).long()  # each pixel's source image
        for i in range(CLASSES):
            shares = torch.bincount(levels[i].flatten(), minlength=CLASSES).float() / levels[i].numel()
            assert torch.allclose(targets[i], shares, atol=1e-6), (i, targets[i], shares)


def test_randaugment_crop_and_flip_keep_grey_images_grey_and_in_range():
    torch.manual_seed(0)
    pixels = torch.randint(0, 256, (4, 1, 16, 16), dtype=torch.uint8)
    augment = BatchAugmenter(AugmentConfig(randaugment_ops=2, inception_crop=True, flip=True), 16, CLASSES)
    out, _ = augment(pixels, torch.zeros(4, dtype=torch.long))
    assert out.shape == (4, 1, 16, 16) and out.min() >= -1 and out.max() <= 1
    assert not torch.allclose(out, normalize(pixels))  # something was applied
