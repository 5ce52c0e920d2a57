"""`widenet-ds params`: trainable parameters of every preset, text and image, counted from the instantiated
models (on the meta device: shapes only) and split by part (widenet_ds/model/counts.py).

Text presets are counted as `WideNetForPreTraining` (MLM and SOP heads), image presets as
`ViTWideNetForImageClassification` (their classifier, with pre-logits where the preset has it). By default the
paper's models: the five base text presets and the eight ImageNet ones; `--all` adds the CPU presets and
ParaFormer's.
"""

from __future__ import annotations

import argparse
import json
from typing import Callable

import torch
from torch import nn

from widenet_ds.model.config import BASE_PRESETS, PRESETS, ModelConfig
from widenet_ds.model.counts import PARTS, count_parameters
from widenet_ds.model.widenet import WideNetForPreTraining
from widenet_ds.vision.config import PAPER_PRESETS, VISION_PRESETS, VisionConfig
from widenet_ds.vision.model import ViTWideNetForImageClassification


def _text(name: str) -> nn.Module:
    return WideNetForPreTraining(ModelConfig.from_preset(name))


def _image(name: str) -> nn.Module:
    return ViTWideNetForImageClassification(VisionConfig.from_preset(name))


# preset -> its model; a name is a text or an image preset, never both (tests/commands/test_params.py)
BUILDERS: dict[str, Callable[[str], nn.Module]] = {**dict.fromkeys(PRESETS, _text),
                                                   **dict.fromkeys(VISION_PRESETS, _image)}
DEFAULT = (*BASE_PRESETS, *PAPER_PRESETS)


def preset_counts(name: str) -> dict[str, int]:
    with torch.device("meta"):  # shapes only: the base presets need no memory or init time
        return count_parameters(BUILDERS[name](name))


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="widenet-ds params", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--preset", action="append", choices=list(BUILDERS), metavar="PRESET",
                        help="limit to these presets, text or image (default: the paper's models)")
    parser.add_argument("--all", action="store_true", help="every preset, the CPU and ParaFormer ones included")
    args = parser.parse_args(argv)
    names = args.preset or (list(BUILDERS) if args.all else list(DEFAULT))
    result = {name: preset_counts(name) for name in names}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    width = max(len("preset"), *map(len, result)) + 2
    print(f"{'preset':<{width}}{'model':<7}" + "".join(f"{p:>12}" for p in (*PARTS, "total")))
    for name, counts in result.items():
        kind = "text" if name in PRESETS else "image"
        print(f"{name:<{width}}{kind:<7}" + "".join(f"{counts[p]:>12,}" for p in (*PARTS, "total")))
    return 0
