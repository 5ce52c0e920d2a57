"""Nested sections of a DeepSpeed JSON, checked against the keys DeepSpeed itself reads.

DeepSpeed validates `zero_optimization`, `fp16`, `bf16`, the monitors and `comms_logger` with its own
pydantic models (extra keys forbidden) -- but only inside `deepspeed.initialize`, after the model is
built, with a raw pydantic traceback. Optimizer and scheduler `params` are passed as keyword
arguments to the classes DeepSpeed picks, so a misspelled one is a TypeError (or, for Adam's
`torch_adam`-style extras, silently dropped). Here the same models and the same constructors'
signatures are consulted up front, and every problem becomes one ConfigError naming the dotted key,
the closest known key and the fix.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import sys
import typing
from typing import Any

from widenet_ds.errors import ConfigError

DOCS = "https://www.deepspeed.ai/docs/config-json/"


def _did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
    return f" Did you mean {close[0]!r}?" if close else ""


def _pydantic_models() -> dict[str, type]:
    """Top-level key -> the pydantic model DeepSpeed 0.19 builds from it (imported lazily: DeepSpeed is heavy)."""
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed prints its accelerator choice on import
        from deepspeed.comm.config import CommsLoggerConfig
        from deepspeed.monitor.config import (
            CometConfig,
            CSVConfig,
            TensorBoardConfig,
            WandbConfig,
        )
        from deepspeed.runtime.precision_config import (
            DeepSpeedBF16Config,
            DeepSpeedFP16Config,
        )
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    return {"zero_optimization": DeepSpeedZeroConfig, "fp16": DeepSpeedFP16Config, "bf16": DeepSpeedBF16Config,
            "bfloat16": DeepSpeedBF16Config, "tensorboard": TensorBoardConfig, "wandb": WandbConfig,
            "csv_monitor": CSVConfig, "comet": CometConfig, "comms_logger": CommsLoggerConfig}


def _field_names(model: type) -> set[str]:
    names = set()
    for name, info in model.model_fields.items():
        names.add(name)
        if info.alias:
            names.add(info.alias)
    return names


def _nested_model(model: type, name: str) -> type | None:
    """The pydantic model of field `name` (through Optional[...]), if it is one."""
    fields = {**model.model_fields, **{i.alias: i for i in model.model_fields.values() if i.alias}}
    info = fields.get(name)
    if info is None:
        return None
    candidates = [info.annotation, *typing.get_args(info.annotation)]
    return next((c for c in candidates if isinstance(c, type) and hasattr(c, "model_fields")), None)


def check_pydantic_sections(config: dict[str, Any]) -> None:
    from pydantic import ValidationError

    for key, model in _pydantic_models().items():
        section = config.get(key)
        if section is None:
            continue
        if not isinstance(section, dict):
            raise ConfigError(f"DeepSpeed config: {key} must be an object, got {type(section).__name__} ({section!r}).")
        try:
            model(**section)
        except ValidationError as err:
            first = err.errors()[0]
            loc = [str(part) for part in first["loc"]]
            owner = model
            for part in loc[:-1]:
                owner = _nested_model(owner, part) or owner
            dotted = ".".join([key, *loc])
            if first["type"] == "extra_forbidden":
                hint = _did_you_mean(loc[-1], _field_names(owner)) or (
                    f" Known keys of {'.'.join([key, *loc[:-1]])}: {', '.join(sorted(_field_names(owner)))}.")
                raise ConfigError(f"DeepSpeed config has an unknown key {dotted!r}: DeepSpeed refuses it (after "
                                  f"building the model).{hint} Fix or remove it ({DOCS}).") from None
            raise ConfigError(f"DeepSpeed config: {dotted} = {first.get('input')!r} is invalid: {first['msg']} "
                              f"({DOCS}).") from None


def _parameters(*classes) -> set[str]:
    names: set[str] = set()
    for cls in classes:
        for name, param in inspect.signature(cls.__init__).parameters.items():
            if name not in ("self", "params", "model_params", "optimizer") and param.kind not in (
                    param.VAR_KEYWORD, param.VAR_POSITIONAL):
                names.add(name)
    return names


def optimizer_param_names(name: str) -> set[str] | None:
    """Keyword arguments DeepSpeed can pass on for optimizer `name` (None: not checked, e.g. mup's)."""
    import torch.optim

    lowered = name.lower()
    with contextlib.redirect_stdout(sys.stderr):
        if lowered in ("adam", "adamw"):
            from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam

            # Popped by DeepSpeed itself before the optimizer is built (engine/build.py).
            return _parameters(torch.optim.AdamW, FusedAdam, DeepSpeedCPUAdam) | {
                "torch_adam", "adam_w_mode", "fp32_optimizer_states", "max_grad_norm"}
        if lowered == "adagrad":
            from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad

            return _parameters(torch.optim.Adagrad, DeepSpeedCPUAdagrad)
        if lowered == "lion":
            from deepspeed.ops.lion import DeepSpeedCPULion, FusedLion

            return _parameters(DeepSpeedCPULion, FusedLion)
    if isinstance(getattr(torch.optim, name, None), type):
        return _parameters(getattr(torch.optim, name))
    return None


def check_optimizer_params(name: str, params: dict[str, Any]) -> None:
    known = optimizer_param_names(name)
    if known is None:
        return
    for key in params:
        if key not in known:
            raise ConfigError(f"DeepSpeed config: optimizer {name!r} has no parameter 'optimizer.params.{key}' "
                              f"(DeepSpeed would fail with a TypeError after building the model)."
                              f"{_did_you_mean(key, known)} Known: {', '.join(sorted(known))}.")


def check_scheduler_params(name: str, params: dict[str, Any]) -> None:
    with contextlib.redirect_stdout(sys.stderr):
        from deepspeed.runtime import lr_schedules
    cls = getattr(lr_schedules, name, None)
    if cls is None:
        return
    known = _parameters(cls)
    for key in params:
        if key not in known:
            raise ConfigError(f"DeepSpeed config: scheduler {name!r} has no parameter 'scheduler.params.{key}' "
                              f"(DeepSpeed would fail after building the model).{_did_you_mean(key, known)} "
                              f"Known: {', '.join(sorted(known))}.")


def offload_device(config: dict[str, Any]) -> str:
    """Where ZeRO-Offload puts the optimizer step: "cpu", "nvme" or "none" (also the older `cpu_offload`)."""
    zero = config.get("zero_optimization") or {}
    if zero.get("cpu_offload"):
        return "cpu"
    offload = zero.get("offload_optimizer") or {}
    return offload.get("device", "none") if isinstance(offload, dict) else "none"


def check_offload(config: dict[str, Any], optimizer_type: str | None) -> None:
    """ZeRO-Offload runs the optimizer step on DeepSpeed's CPU optimizers (Adam, Adagrad, Lion) only."""
    device = offload_device(config)
    if device in ("cpu", "nvme") and optimizer_type is not None and optimizer_type.lower() == "lamb":
        raise ConfigError(f"DeepSpeed config offloads the optimizer (zero_optimization.offload_optimizer.device = "
                          f"{device!r}) but uses Lamb: ZeRO-Offload steps with DeepSpeed's CPU Adam/Adagrad/Lion "
                          "only, and no LAMB runs there. Remove offload_optimizer (LAMB under ZeRO 1/2 runs on the "
                          "device), or use \"type\": \"AdamW\".")


def check_values(config: dict[str, Any]) -> None:
    """Values DeepSpeed accepts that make a run do nothing, or something else than asked."""
    clip = config.get("gradient_clipping")
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or clip < 0):
        raise ConfigError(f"DeepSpeed config: gradient_clipping {clip!r} must be a number >= 0 (the largest "
                          "gradient norm; 0 turns clipping off). A negative value is not a norm.")
    optimizer = config.get("optimizer") or {}
    lr = (optimizer.get("params") or {}).get("lr") if isinstance(optimizer, dict) else None
    scheduler = config.get("scheduler") or {}
    peak = (scheduler.get("params") or {}).get("warmup_max_lr") if isinstance(scheduler, dict) else None
    for where, value in (("optimizer.params.lr", lr), ("scheduler.params.warmup_max_lr", peak)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise ConfigError(f"DeepSpeed config: {where} {value!r} must be a positive number; with a learning "
                              "rate of 0 the weights never change and the run trains nothing.")
