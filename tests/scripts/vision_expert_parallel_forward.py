"""Run by the deepspeed launcher: a ViT-WideNet with each given ep_size in turn inside a DeepSpeed engine saves this
rank's eval logits, loss and expert counts on this rank's slice of a fixed batch of images
(`{out_prefix}{ep_size}.rank{rank}.safetensors`)."""

import sys

import deepspeed
import torch
from safetensors.torch import save_file

from widenet_ds.distributed.groups import init_distributed
from widenet_ds.vision.config import VisionConfig
from widenet_ds.vision.model import ViTWideNetForImageClassification


def main(out_prefix: str, preset: str, ep_sizes: list[int]) -> None:
    init_distributed()
    for ep_size in ep_sizes:
        forward(f"{out_prefix}{ep_size}", preset, ep_size)


def forward(out_prefix: str, preset: str, ep_size: int) -> None:
    rank = torch.distributed.get_rank()
    torch.manual_seed(1234)
    model = ViTWideNetForImageClassification(VisionConfig.from_preset(preset), ep_size=ep_size)
    engine, *_ = deepspeed.initialize(model=model, config={"train_micro_batch_size_per_gpu": 6})
    engine.eval()
    cfg = model.cfg
    gen = torch.Generator().manual_seed(100 + rank)
    pixels = torch.rand(6, cfg.num_channels, cfg.image_size, cfg.image_size, generator=gen) * 2 - 1
    labels = torch.randint(0, cfg.num_classes, (6,), generator=gen)
    with torch.no_grad():
        out = engine(pixels, labels)
    save_file({"logits": out.logits.contiguous(), "loss": out.loss.reshape(1),
               "expert_counts": out.routing.expert_counts, "dropped": out.routing.dropped_fraction},
              f"{out_prefix}.rank{rank}.safetensors")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]  # the launcher adds --local_rank
    main(args[0], args[1], [int(ep) for ep in args[2:]])
    # Every rank exits together: a gloo group torn down while a peer still writes aborts that peer at exit.
    torch.distributed.barrier()
