"""The image processor of ViT-WideNet folders: widenet-ds's own evaluation preprocessing, for transformers.

Written into every image folder that `widenet-ds convert to-hf` exports; needs torch and transformers (Pillow for
PIL images, which transformers' image pipelines need anyway). Per image, as widenet-ds's loader does it:

    PIL image -> its mode converted to "L" (num_channels 1) or "RGB" (3)  [arrays: uint8 HxW, HxWxC or CxHxW]
    -> resized to size x size if it is not already: bilinear, antialiased, rounded back to uint8
       (torch's F.interpolate, align_corners=False: widenet-ds's resize, not PIL's)
    -> (x * rescale_factor - image_mean) / image_std: with 1/255, 0.5, 0.5 the authors' [-1, 1] scaling.

A custom class because the ViT image processor of transformers knows no greyscale conversion and resizes with PIL.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from transformers.image_processing_utils import BaseImageProcessor, BatchFeature


# Adapted from widenet_ds.vision.loader._Images: transformers' BaseImageProcessor around our evaluation
#   preprocessing (PIL images or arrays converted to the model's channels, our resize, then
#   widenet_ds.vision.augment.normalize as (x * rescale_factor - mean) / std with 1/255, 0.5, 0.5)
class WideNetImageProcessor(BaseImageProcessor):
    model_input_names = ["pixel_values"]

    def __init__(self, size: int = 224, num_channels: int = 3, do_resize: bool = True, resample: str = "bilinear",
                 antialias: bool = True, rescale_factor: float = 1 / 255, image_mean: list[float] | None = None,
                 image_std: list[float] | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        if resample != "bilinear":
            raise ValueError(f"resample {resample!r}: this processor resizes as widenet-ds does, bilinear only.")
        self.size = size
        self.num_channels = num_channels
        self.do_resize = do_resize
        self.resample = resample
        self.antialias = antialias
        self.rescale_factor = rescale_factor
        self.image_mean = image_mean if image_mean is not None else [0.5] * num_channels
        self.image_std = image_std if image_std is not None else [0.5] * num_channels

    def _pixels(self, image) -> torch.Tensor:
        """One image -> uint8 [C, H, W] with this model's channels."""
        if hasattr(image, "convert"):  # a PIL image
            image = np.asarray(image.convert("L" if self.num_channels == 1 else "RGB"))
        if isinstance(image, np.ndarray):
            image = torch.from_numpy(np.array(image, copy=True))
            image = image[None] if image.ndim == 2 else image.permute(2, 0, 1)  # HxW(xC) -> CxHxW
        elif isinstance(image, torch.Tensor) and image.ndim == 2:
            image = image[None]
        if not isinstance(image, torch.Tensor) or image.dtype != torch.uint8 or image.shape[0] != self.num_channels:
            raise ValueError(f"expected PIL images or uint8 arrays with {self.num_channels} channel(s) (HxW, HxWxC or "
                             f"a CxHxW tensor), got {type(image).__name__} "
                             f"{getattr(image, 'dtype', '')} {tuple(getattr(image, 'shape', ()))}.")
        return image

    def preprocess(self, images, return_tensors: str | None = "pt", **kwargs) -> BatchFeature:
        if not isinstance(images, (list, tuple)):
            images = [images]
        out = []
        for image in images:
            pixels = self._pixels(image)
            if self.do_resize and tuple(pixels.shape[1:]) != (self.size, self.size):
                pixels = F.interpolate(pixels[None].float(), size=(self.size, self.size), mode="bilinear",
                                       antialias=self.antialias, align_corners=False)[0].round().clamp(0, 255)
                pixels = pixels.to(torch.uint8)
            mean = torch.tensor(self.image_mean, dtype=torch.float64)[:, None, None]
            std = torch.tensor(self.image_std, dtype=torch.float64)[:, None, None]
            out.append(((pixels.double() * self.rescale_factor - mean) / std).float())
        return BatchFeature(data={"pixel_values": torch.stack(out)}, tensor_type=return_tensors)
