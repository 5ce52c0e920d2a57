"""Which model a run trains: `--model-config` (a preset, a JSON or a checkpoint folder), else the model of the
`--init-from` checkpoint, changed field by field with `--set KEY=VALUE` (one way for every task)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from widenet_ds.checkpoint.format import is_folder, read_folder_config
from widenet_ds.checkpoint.training import read_meta, resolve_tag_dir
from widenet_ds.errors import CheckpointError, ConfigError
from widenet_ds.model.config import parse_overrides, split_run_settings


def stored_model_config(config_class, source: Path, flag: str):
    """The model config a checkpoint folder or DeepSpeed checkpoint records."""
    source = Path(source)
    if source.is_dir() and not is_folder(source) and not (source / "checkpoints").is_dir() \
            and not any(source.glob("*_model_states.pt")) and not (source / "latest").is_file():
        raise ConfigError(f"{flag} {source} is a directory but not a checkpoint (no config.json, no DeepSpeed "
                          f"checkpoint); pass a preset, a model-config JSON, a folder written by `widenet-ds convert "
                          f"to-folder`, or a run folder.")
    if is_folder(source):
        stored = read_folder_config(source)
        data = stored.get("model", stored.get("vision_model")) if isinstance(stored, dict) else None
        where = f"{source}/config.json"
    else:
        tag_dir = resolve_tag_dir(source)
        data = read_meta(tag_dir).get("model_config")
        where = f"{tag_dir}/widenet_checkpoint.json"
    if not isinstance(data, dict):
        raise CheckpointError(f"{where} holds no model config; convert the checkpoint again.")
    try:
        return config_class.from_dict(split_run_settings(data)[0])
    except ConfigError as err:
        raise CheckpointError(f"{where} holds no {config_class.NAME} of this task ({err}); pass a checkpoint of "
                              f"this kind of model.") from None


def resolve_model_config(config_class, model_config: str | None, init_from: Path | None, overrides: list[str],
                         preset_fields: dict[str, Any] | None = None):
    """The run's model: `model_config` (preset names take `preset_fields` unless `--set` says otherwise), else
    `init_from`'s; then the `--set` overrides."""
    changes = parse_overrides(overrides)
    if model_config is None:
        return stored_model_config(config_class, init_from, "--init-from").replace(**changes)
    if Path(model_config).is_dir():
        return stored_model_config(config_class, Path(model_config), "--model-config").replace(**changes)
    if model_config in config_class.presets():
        moe = {**(preset_fields or {}).get("moe", {}), **changes.pop("moe", {})}
        return config_class.from_preset(model_config, **{**(preset_fields or {}), **changes, "moe": moe})
    return config_class.load(model_config, **changes)
