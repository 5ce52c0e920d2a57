"""Where finetuning weights come from and go: the model config of
--init-from (pretrained weights) or --model-config (random initialisation) with the recipe's routing and
dropout settings, and the finetuned model written back as a checkpoint folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.distributed as torch_dist

from widenet_ds.data.tokenizer import TOKENIZER_FILE, TokenizerFiles
from widenet_ds.model.config import ModelConfig, parse_overrides
from widenet_ds.portable.format import PortableCheckpoint, global_key_map, is_expert_key, save_folder
from widenet_ds.tasks.finetune.config import FinetuneConfig
from widenet_ds.training.model_source import resolve_model_config


def model_overrides(cfg: FinetuneConfig, recipe) -> dict[str, Any]:
    """The recipe's dropout and routing settings, with the run's `--set` changes on top."""
    overrides: dict[str, Any] = {"hidden_dropout": recipe.dropout, "attention_dropout": recipe.dropout,
                                 "classifier_dropout": recipe.classifier_dropout,
                                 "moe": {"capacity_factor": recipe.capacity_factor,
                                         "balance_loss_weight": recipe.balance_weight}}
    changes = parse_overrides(cfg.overrides)
    overrides["moe"].update(changes.pop("moe", {}))
    return {**overrides, **changes}


def finetune_model_config(cfg: FinetuneConfig, recipe, vocab_size: int,
                          checkpoint: PortableCheckpoint | None) -> ModelConfig:
    """The model of --init-from (`checkpoint`) or --model-config (random initialisation; a preset takes the
    tokenizer's vocabulary size), with the recipe's settings and the run's --set changes."""
    overrides = model_overrides(cfg, recipe)
    if checkpoint is not None:
        return checkpoint.config.replace(**overrides)
    return resolve_model_config(ModelConfig, cfg.model_config, None, [], {"vocab_size": vocab_size}).replace(**overrides)


def save_finetuned(model, target: Path, tokenizer, provenance: dict[str, Any], ep_size: int) -> Path:
    """The finetuned model as a checkpoint folder (experts under their global index, gathered from every
    rank when expert-parallel), written by rank 0; collective."""
    to_global = global_key_map(model)
    state = {to_global[key]: tensor.detach().cpu() for key, tensor in model.state_dict().items()}
    parts: list[dict] = [None] * torch_dist.get_world_size()  # type: ignore[list-item]
    torch_dist.all_gather_object(parts, {k: v for k, v in state.items() if is_expert_key(k)})
    for part in parts:
        state.update(part)
    if torch_dist.get_rank() == 0:
        tokenizer_dir = target.with_name(f".{target.name}-tokenizer")
        tokenizer_dir.mkdir(parents=True, exist_ok=True)
        tokenizer.save(str(tokenizer_dir / TOKENIZER_FILE))
        checkpoint = PortableCheckpoint(model.cfg, type(model).__name__, state, getattr(model, "num_labels", None),
                                        {**provenance, "trained_with_ep_size": ep_size})
        save_folder(checkpoint, target, tokenizer=TokenizerFiles.in_folder(tokenizer_dir), overwrite=True)
        (tokenizer_dir / TOKENIZER_FILE).unlink()
        tokenizer_dir.rmdir()
    torch_dist.barrier()
    return target
