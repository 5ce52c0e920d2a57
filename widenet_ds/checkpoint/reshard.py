"""`convert reshard`: a DeepSpeed checkpoint saved with ep_size a on w ranks -> one for ep_size b on v ranks.

Model states only. The non-expert weights and the per-expert files are independent of the layout
(experts are filed by global index), so they are carried over byte for byte and the metadata is
rewritten for the new world size; `widenet_checkpoint.json` records the new ep_size and world size.
Optimizer states are NOT carried: ZeRO partitions flat buffers by world size and DeepSpeed has no
re-partitioning for MoE expert groups (DeepSpeed #4497, #5716), so a resharded checkpoint starts a new
optimizer. Load it with

    engine.load_checkpoint(dir, tag, load_optimizer_states=False, load_lr_scheduler_states=False,
                           load_module_only=True)

which is what `pretrain --init-from` does (widenet_ds.checkpoint.training.load_weights_only). Text and image
checkpoints alike (the marker's architecture and every other entry are carried over).
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import torch

from widenet_ds.atomic import atomic_folder
from widenet_ds.checksums import record_files
from widenet_ds.checkpoint.deepspeed import expert_file, load_torch_file, read_deepspeed_checkpoint
from widenet_ds.checkpoint.marker import LATEST_FILE, CheckpointMeta
from widenet_ds.checkpoint.training import MODEL_STATES, resolve_tag_dir
from widenet_ds.errors import CheckpointError, ConfigError
from widenet_ds.runtime.distributed import check_ep_size

# Entries of the model-states file that describe the optimizer partitioning of the old layout.
_OPTIMIZER_LAYOUT = ("optimizer", "param_shapes", "shared_params", "frozen_param_shapes", "frozen_param_fragments")


def reshard(source: Path, target: Path, *, ep_size: int, world_size: int, tag: str | None = None,
            model_config: Path | None = None, overwrite: bool = False) -> Path:
    """Write `<target>/<tag>/` + `<target>/latest`; returns the new tag folder."""
    tag_dir = resolve_tag_dir(source, tag, require_marker=False)
    checkpoint = read_deepspeed_checkpoint(tag_dir, model_config=model_config)  # complete and consistent
    cfg = checkpoint.config
    if world_size <= 0:
        raise ConfigError(f"--world-size {world_size} must be positive.")
    check_ep_size(ep_size, world_size, cfg.moe.num_experts if cfg.is_moe else None)

    states = load_torch_file(tag_dir / MODEL_STATES)
    states.update({name: None for name in _OPTIMIZER_LAYOUT if name in states})
    states["dp_world_size"] = world_size
    # Every entry of the source's marker is carried over (a marker-less source: another program's checkpoint).
    meta = CheckpointMeta.read(tag_dir, required=False) or CheckpointMeta(
        step=0, samples=states.get("global_samples"), world_size=0, ep_size=0, model_config={}, deepspeed_config={})
    resharded_from = {"source": str(tag_dir.resolve()), "ep_size": checkpoint.provenance["trained_with_ep_size"],
                      "world_size": checkpoint.provenance["world_size"]}

    with atomic_folder(target, overwrite, CheckpointError) as tmp:
        out = tmp / tag_dir.name
        out.mkdir()
        torch.save(states, out / MODEL_STATES)
        if cfg.is_moe:
            for layer in range(cfg.num_moe_layers):
                for expert in range(cfg.moe.num_experts):
                    shutil.copyfile(expert_file(tag_dir, layer, expert), expert_file(out, layer, expert))
        dataclasses.replace(meta, step=checkpoint.provenance["step"], world_size=world_size, ep_size=ep_size,
                            model_config=cfg.to_dict(), optimizer_states=False,
                            files=record_files(out),  # this tag's files (the source's records describe the source's)
                            run={**meta.run, "resharded_from": resharded_from}).write(out)
        (tmp / LATEST_FILE).write_text(tag_dir.name)
    return Path(target) / tag_dir.name
