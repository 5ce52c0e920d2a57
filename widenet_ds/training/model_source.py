"""Which model a run trains: `--model-config` (a preset, a JSON or a checkpoint folder), else the model of the
`--init-from` checkpoint, changed field by field with `--set KEY=VALUE` (one way for every task)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from widenet_ds.checkpoint.source import CheckpointSource
from widenet_ds.model.config import parse_overrides


def checkpoint_model_config(config_class, source: Path | CheckpointSource, flag: str):
    """The model config a checkpoint folder or DeepSpeed checkpoint records, of this task's config type."""
    opened = source if isinstance(source, CheckpointSource) else CheckpointSource.open(Path(source), flag)
    return opened.model_config(config_class)


def resolve_model_config(config_class, model_config: str | None, init_from: Path | CheckpointSource | None,
                         overrides: list[str], preset_fields: dict[str, Any] | None = None):
    """The run's model: `model_config` (preset names take `preset_fields` unless `--set` says otherwise), else
    `init_from`'s; then the `--set` overrides."""
    changes = parse_overrides(overrides)
    if model_config is None:
        return checkpoint_model_config(config_class, init_from, "--init-from").replace(**changes)
    if Path(model_config).is_dir():  # (the --init-from checkpoint itself, often: opened once)
        same = isinstance(init_from, CheckpointSource) and init_from.given == Path(model_config)
        return checkpoint_model_config(config_class, init_from if same else Path(model_config),
                                       "--model-config").replace(**changes)
    if model_config in config_class.presets():
        moe = {**(preset_fields or {}).get("moe", {}), **changes.pop("moe", {})}
        return config_class.from_preset(model_config, **{**(preset_fields or {}), **changes, "moe": moe})
    return config_class.load(model_config, **changes)
