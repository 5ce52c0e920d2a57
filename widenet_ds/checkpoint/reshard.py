"""`convert reshard`: a DeepSpeed checkpoint saved with ep_size a on w ranks -> one for ep_size b on v ranks.

The non-expert weights and the per-expert files are independent of the layout (experts are filed by global
index), so they are carried over byte for byte and the metadata is rewritten for the new world size;
`widenet_checkpoint.json` records the new ep_size and world size. The optimizer state is carried as the
checkpoint's shape-free training state (checkpoint/shape_free.py: every fp32 master weight and optimizer state
tensor whole, of fp32 and bf16 runs alike, the schedule, the data position) in `shape_free/` of the new tag:
DeepSpeed's ZeRO files partition flat buffers by world size and DeepSpeed has no re-partitioning for MoE expert
groups (DeepSpeed #4497, #5716), so `--resume` from the resharded tag puts that state into the new engine, on any
shape and in fp32 or bf16. An fp16 source is refused before anything is read (its loss scaler's state is not
re-laid out) unless `--model-states-only` asks for the weights alone; a source without optimizer state (a
model-states-only copy) gives model states only. Load those with

    engine.load_checkpoint(dir, tag, load_optimizer_states=False, load_lr_scheduler_states=False,
                           load_module_only=True)

which is what `--init-from` does (widenet_ds.checkpoint.manager.load_weights_only). Text and image checkpoints
alike (the marker's architecture and every other entry are carried over).
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import torch

from widenet_ds.checkpoint.deepspeed import expert_file, load_torch_file
from widenet_ds.checkpoint.marker import LATEST_FILE, CheckpointMeta
from widenet_ds.checkpoint.shape_free import (
    ShapeFreeState,
    check_carried,
    read_shape_free,
    save_shape_free,
)
from widenet_ds.checkpoint.source import CheckpointSource
from widenet_ds.checkpoint.tags import MODEL_STATES
from widenet_ds.distributed.layout_checks import check_ep_size
from widenet_ds.errors import CheckpointError, ConfigError
from widenet_ds.fs.atomic import atomic_folder
from widenet_ds.fs.checksums import record_files

SHAPE_FREE_DIR = "shape_free"
# Entries of the model-states file that describe the optimizer partitioning of the old layout.
_OPTIMIZER_LAYOUT = ("optimizer", "param_shapes", "shared_params", "frozen_param_shapes", "frozen_param_fragments")


def reshard(source: CheckpointSource, target: Path, *, ep_size: int, world_size: int,
            model_config: Path | None = None, overwrite: bool = False,
            model_states_only: bool = False) -> tuple[Path, str | None]:
    """Write `<target>/<tag>/` + `<target>/latest` from the DeepSpeed checkpoint `source`; returns the new tag
    folder, and why it holds model states only (None: it holds the training state too)."""
    if source.is_folder:
        raise CheckpointError(f"{source.given} is a checkpoint folder, which has no layout to reshard: any ep_size "
                              f"loads it as it is (--init-from, load_pretrained).")
    tag_dir = source.tag_dir
    if not model_states_only:
        check_carried(source, "pass --model-states-only to reshard its weights alone (a new run starts from them "
                              "with --init-from)")
    checkpoint = source.read_weights(model_config)  # complete and consistent
    cfg = checkpoint.config
    if world_size <= 0:
        raise ConfigError(f"--world-size {world_size} must be positive.")
    check_ep_size(ep_size, world_size, cfg.moe.num_experts if cfg.is_moe else None)

    states = load_torch_file(tag_dir / MODEL_STATES)
    states.update({name: None for name in _OPTIMIZER_LAYOUT if name in states})
    states["dp_world_size"] = world_size
    # Every entry of the source's marker is carried over (a marker-less source: another program's checkpoint).
    meta = source.meta or CheckpointMeta(
        step=0, samples=states.get("global_samples"), world_size=0, ep_size=0, model_config={}, deepspeed_config={})
    resharded_from = {"source": str(tag_dir.resolve()), "ep_size": checkpoint.provenance["trained_with_ep_size"],
                      "world_size": checkpoint.provenance["world_size"], "branch_parallel": meta.branch_parallel}
    state, why_not = (None, "--model-states-only") if model_states_only else _training_state(source)

    with atomic_folder(target, overwrite, CheckpointError) as tmp:
        out = tmp / tag_dir.name
        out.mkdir()
        torch.save(states, out / MODEL_STATES)
        if cfg.is_moe:
            for layer in range(cfg.num_moe_layers):
                for expert in range(cfg.moe.num_experts):
                    shutil.copyfile(expert_file(tag_dir, layer, expert), expert_file(out, layer, expert))
        if state is not None:
            save_shape_free(state, out / SHAPE_FREE_DIR)
        # the new layout has no branch groups (--resume forms the run's own; the source's are in resharded_from)
        dataclasses.replace(meta, step=checkpoint.provenance["step"], world_size=world_size, ep_size=ep_size,
                            branch_parallel=1,
                            model_config=cfg.to_dict(), optimizer_states=state is not None,
                            shape_free_state=SHAPE_FREE_DIR if state is not None else None,
                            files=record_files(out),  # this tag's files (the source's records describe the source's)
                            run={**meta.run, "resharded_from": resharded_from}).write(out)
        (tmp / LATEST_FILE).write_text(tag_dir.name)
    return Path(target) / tag_dir.name, why_not


def _training_state(source: CheckpointSource) -> tuple[ShapeFreeState | None, str | None]:
    """The source's whole training state, and else why it has none to carry."""
    meta = source.meta
    if meta is None or not meta.optimizer_states or not (
            meta.shape_free_state or any(source.tag_dir.glob("rank_*_state.pt"))):
        return None, "the source holds no optimizer state"
    return read_shape_free(source), None
