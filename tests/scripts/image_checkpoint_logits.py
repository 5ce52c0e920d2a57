"""Run by the deepspeed launcher for the image conversion tests:

    TAG_DIR FOLDER OUT_PREFIX   an engine built as the run built it (its marker's model config, ep_size and
                                DeepSpeed JSON) loads the training checkpoint TAG_DIR with DeepSpeed's own
                                loader and writes this rank's eval logits on its fixed batch to
                                OUT_PREFIX.rank<r>; then a model from the portable FOLDER (`load_pretrained`,
                                the run's ep_size: this rank's experts only) writes its logits on the same
                                batch to OUT_PREFIX.folder.rank<r>
"""

import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from widenet_ds.checkpoint.marker import CheckpointMeta
from widenet_ds.checkpoint.source import load_pretrained
from widenet_ds.distributed.groups import init_distributed
from widenet_ds.engine.build import build_engine
from widenet_ds.engine.ds_config import validate_ds_config
from widenet_ds.vision.config import VisionConfig
from widenet_ds.vision.model import ViTWideNetForImageClassification

BATCH = 6


def fixed_pixels(cfg: VisionConfig, rank: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(300 + rank)
    return torch.rand(BATCH, cfg.num_channels, cfg.image_size, cfg.image_size, generator=gen) * 2 - 1


def main(tag_dir: Path, folder: Path, out_prefix: str) -> None:
    init_distributed()
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    meta = CheckpointMeta.read(tag_dir)
    cfg = VisionConfig.from_dict(meta.model_config)
    settings = validate_ds_config(meta.deepspeed_config, world_size=world, has_moe=cfg.is_moe, cuda_available=False)
    engine, _ = build_engine(ViTWideNetForImageClassification(cfg, ep_size=meta.ep_size), settings)
    path, _ = engine.load_checkpoint(str(tag_dir.parent), tag=tag_dir.name, load_optimizer_states=False,
                                     load_lr_scheduler_states=False, load_module_only=True)
    assert path is not None, f"DeepSpeed loaded nothing from {tag_dir}"
    engine.eval()
    pixels = fixed_pixels(cfg, rank)
    with torch.no_grad():
        save_file({"logits": engine(pixels).logits.contiguous()}, f"{out_prefix}.rank{rank}.safetensors")
    model, report = load_pretrained(ViTWideNetForImageClassification, folder, ep_size=meta.ep_size)
    print(f"rank {rank}: {report.summary()}", flush=True)
    model.ensure_process_groups()
    with torch.no_grad():
        save_file({"logits": model.eval()(pixels).logits.contiguous()}, f"{out_prefix}.folder.rank{rank}.safetensors")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]  # the launcher adds --local_rank
    main(Path(args[0]), Path(args[1]), args[2])
    # Every rank exits together: a gloo group torn down while a peer still writes aborts that peer at exit.
    torch.distributed.barrier()
