"""Which model a run trains: `--model-config` (a preset, a JSON or a checkpoint folder), else the model of the
`--init-from` checkpoint, changed field by field with `--set KEY=VALUE` (one way for every task)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from widenet_ds.checkpoint.source import CheckpointSource
from widenet_ds.model.config import parse_overrides


def resolve_model_config(config_class, model_config: str | None, init_from: CheckpointSource | None,
                         overrides: list[str], preset_fields: dict[str, Any] | None = None):
    """The run's model: `model_config` (preset names take `preset_fields` unless `--set` says otherwise), else
    `init_from`'s (opened once by the run); then the `--set` overrides."""
    changes = parse_overrides(overrides)
    if model_config is None:
        return init_from.model_config(config_class).replace(**changes)
    if Path(model_config).is_dir():  # a checkpoint: often the --init-from checkpoint itself, opened once
        same = init_from is not None and init_from.given == Path(model_config)
        source = init_from if same else CheckpointSource.open(model_config, "--model-config")
        return source.model_config(config_class).replace(**changes)
    if model_config in config_class.presets():
        moe = {**(preset_fields or {}).get("moe", {}), **changes.pop("moe", {})}
        return config_class.from_preset(model_config, **{**(preset_fields or {}), **changes, "moe": moe})
    return config_class.load(model_config, **changes)
