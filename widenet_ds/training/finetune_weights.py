"""Where finetuning weights come from and go: the tokenizer that belongs to them, the task model built from
--init-from (pretrained weights + load report) or --preset (random) with the recipe's routing and dropout
settings, and the finetuned model written back as a checkpoint folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.distributed as torch_dist

from widenet_ds.checkpoint.format import PortableCheckpoint, global_key_map, is_expert_key, save_folder
from widenet_ds.checkpoint.load import find_tokenizer_files, load_into, read_checkpoint
from widenet_ds.data.tokenizer import load_tokenizer
from widenet_ds.errors import ConfigError, WideNetError
from widenet_ds.model.config import ModelConfig
from widenet_ds.runtime.distributed import check_ep_size
from widenet_ds.training.finetune_config import FinetuneConfig


def load_tokenizer_for(cfg: FinetuneConfig):
    """--tokenizer, else the tokenizer saved with --init-from (in an exported folder, or next to a run's
    checkpoints)."""
    source: str | Path | None = cfg.tokenizer
    if source is None and cfg.init_from is not None:
        try:
            found = find_tokenizer_files(Path(cfg.init_from))
        except WideNetError:
            found = ()  # not a checkpoint: loading the weights will say so
        source = found[0] if found else None
    if source is None:
        raise ConfigError("no tokenizer given and none saved with --init-from: pass --tokenizer (the tokenizer.json "
                          "/ vocab.txt or the prepared data folder the model was pretrained with).")
    return load_tokenizer(source)


def model_overrides(cfg: FinetuneConfig, recipe) -> dict[str, Any]:
    """The recipe's routing and dropout settings (flags win), applied to the model config before building."""
    dropout = cfg.dropout if cfg.dropout is not None else recipe.dropout
    return {"hidden_dropout": dropout, "attention_dropout": dropout,
            "classifier_dropout": recipe.classifier_dropout,
            "moe": {"capacity_factor": cfg.capacity_factor if cfg.capacity_factor is not None
                    else recipe.capacity_factor,
                    "balance_loss_weight": (cfg.balance_loss_weight if cfg.balance_loss_weight is not None
                                            else recipe.balance_weight)}}


def build_model(cfg: FinetuneConfig, cls, recipe, vocab_size: int, **model_kwargs):
    """The task model from --init-from (weights + load report) or --preset (random), with the recipe's overrides
    and the run's expert-parallel size (checked here, the one place it reaches the model)."""
    overrides = model_overrides(cfg, recipe)
    world = torch_dist.get_world_size() if torch_dist.is_initialized() else 1
    if cfg.init_from is not None:
        checkpoint = read_checkpoint(Path(cfg.init_from))
        model_cfg = checkpoint.config.replace(**overrides)
        check_ep_size(cfg.ep_size, world, model_cfg.moe.num_experts if model_cfg.is_moe else None)
        if cls.__name__ == checkpoint.architecture == "WideNetForSequenceClassification":
            model_kwargs.setdefault("num_labels", checkpoint.num_labels)
        model = cls(model_cfg, ep_size=cfg.ep_size, **model_kwargs)
        return model, load_into(model, checkpoint, str(cfg.init_from)).summary()
    model_cfg = ModelConfig.from_preset(cfg.preset, vocab_size=vocab_size).replace(**overrides)
    check_ep_size(cfg.ep_size, world, model_cfg.moe.num_experts if model_cfg.is_moe else None)
    model = cls(model_cfg, ep_size=cfg.ep_size, **model_kwargs)
    return model, f"random initialisation from preset {cfg.preset} (no weights loaded)"


def save_finetuned(model, target: Path, tokenizer, provenance: dict[str, Any]) -> Path:
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
        tokenizer.save(str(tokenizer_dir / "tokenizer.json"))
        checkpoint = PortableCheckpoint(model.cfg, type(model).__name__, state, getattr(model, "num_labels", None),
                                        {**provenance, "trained_with_ep_size": getattr(model, "ep_size", 1)})
        save_folder(checkpoint, target, tokenizer_files=(tokenizer_dir / "tokenizer.json",), overwrite=True)
        (tokenizer_dir / "tokenizer.json").unlink()
        tokenizer_dir.rmdir()
    torch_dist.barrier()
    return target
