"""Which model a run trains: `--model-config` (a preset, a JSON or a checkpoint folder), else the model of the
`--init-from` checkpoint, changed field by field with `--set KEY=VALUE` (one way for every task)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from widenet_ds.checkpoint.format import TEXT_DEFAULT, architecture, is_folder, read_folder_config, stored_model_config
from widenet_ds.checkpoint.marker import META_FILE, CheckpointMeta
from widenet_ds.checkpoint.training import resolve_tag_dir
from widenet_ds.errors import CheckpointError, ConfigError
from widenet_ds.model.config import parse_overrides, split_run_settings


def _is_checkpoint(source: Path) -> bool:
    return is_folder(source) or (source / "checkpoints").is_dir() or (source / "latest").is_file() \
        or any(source.glob("*_model_states.pt"))


def checkpoint_model_config(config_class, source: Path, flag: str):
    """The model config a checkpoint folder or DeepSpeed checkpoint records, of this task's config type."""
    source = Path(source)
    if source.is_dir() and not _is_checkpoint(source):
        raise ConfigError(f"{flag} {source} is a directory but not a checkpoint (no config.json, no DeepSpeed "
                          f"checkpoint); pass a preset, a model-config JSON, a folder written by `widenet-ds convert "
                          f"to-folder`, or a run folder.")
    if is_folder(source):
        stored = read_folder_config(source)
        where = source / "config.json"
        name, data = stored.get("architecture", TEXT_DEFAULT), stored_model_config(stored, where)
    else:
        tag_dir = resolve_tag_dir(source)
        meta, where = CheckpointMeta.read(tag_dir), tag_dir / META_FILE
        name, data = meta.architecture or TEXT_DEFAULT, meta.model_config
    arch = architecture(name, str(where))
    if arch.config is not config_class:
        raise CheckpointError(f"{flag} {source} holds a {arch.name}, whose {arch.config.NAME} is not this task's "
                              f"({config_class.NAME}); pass a checkpoint of the model this task trains.")
    try:
        return config_class.from_dict(split_run_settings(data)[0])
    except (ConfigError, TypeError) as err:
        raise CheckpointError(f"{where} holds no readable {config_class.NAME} ({err}); convert the checkpoint "
                              f"again.") from None


def resolve_model_config(config_class, model_config: str | None, init_from: Path | None, overrides: list[str],
                         preset_fields: dict[str, Any] | None = None):
    """The run's model: `model_config` (preset names take `preset_fields` unless `--set` says otherwise), else
    `init_from`'s; then the `--set` overrides."""
    changes = parse_overrides(overrides)
    if model_config is None:
        return checkpoint_model_config(config_class, init_from, "--init-from").replace(**changes)
    if Path(model_config).is_dir():
        return checkpoint_model_config(config_class, Path(model_config), "--model-config").replace(**changes)
    if model_config in config_class.presets():
        moe = {**(preset_fields or {}).get("moe", {}), **changes.pop("moe", {})}
        return config_class.from_preset(model_config, **{**(preset_fields or {}), **changes, "moe": moe})
    return config_class.load(model_config, **changes)
