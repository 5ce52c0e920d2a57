"""Run by the deepspeed launcher: every rank builds the same ParaFormer-layout model, computes only its
branches (`BranchParallel.contiguous`), and saves its logits and, after the backward of a cross-entropy and
the shared gradients' all-reduce, every gradient it holds. tests/model/test_branches_parallel.py compares them with
the one-process model. The cases are defined here and imported by the test, so both build the same models."""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import Tensor, nn

from widenet_ds.distributed.groups import init_distributed
from widenet_ds.model.branches import BranchParallel
from widenet_ds.model.config import ModelConfig
from widenet_ds.model.widenet import WideNetForSequenceClassification
from widenet_ds.vision.config import VisionConfig
from widenet_ds.vision.model import ViTWideNetForImageClassification

SEED = 1234
BATCH = 4

# name -> (model preset, overrides, branches run: None = all)
CASES = {
    "paraformer-3x4": ("paraformer-tiny-3x4", {}, None),          # 3 branches on 2 ranks: 2 + 1
    "paraformer-3x4-prefix2": ("paraformer-tiny-3x4", {}, 2),     # rank 1's only branch is inactive
    # Shared attention + shared MoE. Dropless: a rank routes only its branches' tokens, so a capacity (the
    # preset's 1.2 drops 7-18% of the routes on this batch) would be per rank (widenet_ds/model/branches.py).
    "widenet-paraformer-3x4": ("widenet-paraformer-tiny-3x4", {"moe": {"dispatch": "dropless"}}, None),
    "text-2x2": ("bert-tiny-factorized", {}, None),                # post-LN text body, padding mask
}


def build(case: str) -> nn.Module:
    preset, overrides, _ = CASES[case]
    torch.manual_seed(SEED)
    if preset.startswith("bert"):
        cfg = ModelConfig.from_preset(preset, vocab_size=64, num_layers=4, num_branches=2, **overrides)
        return WideNetForSequenceClassification(cfg, num_labels=3).eval()
    return ViTWideNetForImageClassification(VisionConfig.from_preset(preset, **overrides)).eval()


def run(case: str, model: nn.Module) -> tuple[Tensor, Tensor, Tensor | None]:
    """Logits and cross-entropy on a fixed batch (the same on every rank), and the MoE's dropped fractions."""
    branches = CASES[case][2]
    gen = torch.Generator().manual_seed(SEED + 1)
    if isinstance(model, WideNetForSequenceClassification):
        ids = torch.randint(0, 64, (BATCH, 9), generator=gen)
        mask = torch.ones_like(ids)
        mask[0, 6:] = 0
        out = model(ids, attention_mask=mask, branches=branches)
        labels = torch.randint(0, 3, (BATCH,), generator=gen)
    else:
        cfg = model.cfg
        pixels = torch.rand(BATCH, cfg.num_channels, cfg.image_size, cfg.image_size, generator=gen) * 2 - 1
        out = model(pixels, branches=branches)
        labels = torch.randint(0, cfg.num_classes, (BATCH,), generator=gen)
    dropped = out.routing.dropped_fraction if out.routing is not None else None
    return out.logits, F.cross_entropy(out.logits, labels), dropped


def main(out_prefix: str) -> None:
    init_distributed()
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    for case in CASES:
        model = build(case)
        parallel = BranchParallel.contiguous(model.encoder.cfg.num_branches, rank, world)
        model.encoder.branch_parallel = parallel
        logits, loss, dropped = run(case, model)
        loss.backward()
        parallel.all_reduce_shared_gradients(model.encoder)
        tensors = {"logits": logits.detach().contiguous(), "loss": loss.detach().reshape(1),
                   "branches": torch.tensor(parallel.branches, dtype=torch.int64)}
        if dropped is not None:
            tensors["dropped"] = dropped
        tensors.update({f"grad/{name}": p.grad.contiguous() for name, p in model.named_parameters()
                        if p.grad is not None})
        save_file(tensors, f"{out_prefix}.{case}.rank{rank}.safetensors")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]  # the launcher adds --local_rank
    main(args[0])
    # Every rank exits together: a gloo group torn down while a peer still writes aborts that peer at exit.
    torch.distributed.barrier()
