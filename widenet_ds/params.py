"""Parameter counts of the presets, counted from instantiated models, by part."""

from __future__ import annotations

import argparse
import json

import torch
from torch import nn

from widenet_ds.config import BASE_PRESETS, PRESETS, ModelConfig

PARTS = ("embeddings", "attention", "experts", "router", "ffn", "norms", "heads")


def _part(name: str) -> str:
    if name.startswith("widenet.embeddings."):
        return "norms" if ".norm." in name else "embeddings"
    if name.startswith("widenet.encoder."):
        if ".gate." in name:
            return "router"
        if ".deepspeed_experts." in name:
            return "experts"
        if name.startswith("widenet.encoder.attention."):
            return "attention"
        if name.startswith("widenet.encoder.ffn."):
            return "ffn"
        return "norms"
    return "heads"  # pooler, MLM, SOP


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Trainable parameters, each shared tensor once, split by part; `total` is their sum."""
    counts = dict.fromkeys(PARTS, 0)
    for name, param in model.named_parameters():  # named_parameters() yields shared tensors once
        if param.requires_grad:
            counts[_part(name)] += param.numel()
    counts["total"] = sum(counts.values())
    return counts


def preset_counts(name: str) -> dict[str, int]:
    from widenet_ds.model import WideNetForPreTraining
    with torch.device("meta"):  # shapes only: the base presets need no memory or init time
        model = WideNetForPreTraining(ModelConfig.from_preset(name))
    return count_parameters(model)


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="widenet-ds params", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--preset", action="append", choices=list(PRESETS),
                        help="limit to these presets (default: the five base presets)")
    parser.add_argument("--all", action="store_true", help="every preset, the small CPU ones included")
    args = parser.parse_args(argv)
    names = args.preset or (list(PRESETS) if args.all else list(BASE_PRESETS))
    result = {name: preset_counts(name) for name in names}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{'preset':<22}" + "".join(f"{p:>12}" for p in (*PARTS, "total")))
    for name, counts in result.items():
        print(f"{name:<22}" + "".join(f"{counts[p]:>12,}" for p in (*PARTS, "total")))
    return 0
