"""Validation of a DeepSpeed JSON before anything is built.

DeepSpeed reads its top-level keys with `dict.get`, so a misspelled key silently falls back to its
default, and it checks the batch arithmetic with a bare `assert` deep inside `deepspeed.initialize`.
Here the JSON stays a plain DeepSpeed JSON (users bring their own); we only check it against the
world size, the model (MoE or not) and the device, and fail with the fix spelled out.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from widenet_ds.engine.ds_sections import (
    check_offload,
    check_optimizer_params,
    check_pydantic_sections,
    check_scheduler_params,
    check_values,
)
from widenet_ds.errors import ConfigError
from widenet_ds.formats import load_json

# Every top-level key DeepSpeed 0.19.8 reads (traced from `DeepSpeedConfig.__init__` with a dict that
# records lookups), plus "_comment", which DeepSpeed ignores and our shipped configs use as docs.
KNOWN_TOP_LEVEL_KEYS = frozenset({
    "_comment",
    "activation_checkpointing", "aio", "amp", "autotuning", "bf16", "bfloat16", "checkpoint", "comet",
    "comms_logger", "communication_data_type", "compile", "compression_training", "csv_monitor",
    "curriculum_learning", "data_efficiency", "data_types", "dataloader_drop_last", "datastates_ckpt",
    "disable_allgather", "disable_python_gc", "dump_state", "eigenvalue", "elasticity", "expert_parallel",
    "flops_profiler", "fp16", "gradient_accumulation_steps", "gradient_allreduce_op", "gradient_clipping",
    "gradient_predivide_factor", "graph_harvesting", "hybrid_engine", "log_level",
    "managed_gradient_accumulation", "memory_breakdown", "nebula", "optimizer", "pipeline",
    "prescale_gradients", "progressive_layer_drop", "quantize_training", "scheduler",
    "seq_parallel_communication_data_type", "sequence_parallel_size", "sparse_attention",
    "sparse_gradients", "steps_per_print", "tensor_parallel", "tensorboard", "timers", "torch_autocast",
    "train_batch_size", "train_micro_batch_size_per_gpu", "use_data_before_expert_parallelism",
    "vocabulary_size", "wall_clock_breakdown", "wandb", "weight_quantization",
    "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "zero_optimization",
})

# DeepSpeed's own optimizer names (matched case-insensitively, as DeepSpeed does); any other name
# must be a class of torch.optim, which DeepSpeed looks up with getattr.
DEEPSPEED_OPTIMIZERS = ("adagrad", "adam", "adamw", "lamb", "lion", "muadam", "muadamw", "musgd", "muon")
# Optimizers DeepSpeed's ZeRO accepts without "zero_allow_untested_optimizer" (runtime/zero/utils.py).
ZERO_TESTED_OPTIMIZERS = ("adam", "adamw", "adagrad", "lion")
# Keyword arguments of DeepSpeed's FusedLamb, which our CPU LAMB accepts too.
LAMB_PARAMS = frozenset({"lr", "bias_correction", "betas", "eps", "eps_inside_sqrt", "weight_decay",
                         "max_grad_norm", "max_coeff", "min_coeff", "amsgrad"})
SCHEDULERS = ("LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR")

CPU_CONFIG_HINT = "ds_configs/cpu_small.json"


@dataclass(frozen=True)
class BatchSizes:
    """The batch arithmetic once resolved: train_batch_size = micro * accumulation * data-parallel ranks."""

    train_batch_size: int
    micro_batch_size: int
    gradient_accumulation_steps: int
    data_parallel_size: int


@dataclass(frozen=True)
class DeepSpeedSettings:
    """What the trainer needs to know from a validated DeepSpeed JSON; the dict itself goes to DeepSpeed."""

    config: dict[str, Any]
    batch: BatchSizes
    zero_stage: int
    precision: str  # "fp32" | "fp16" | "bf16"
    optimizer_type: str | None  # as written in the JSON
    scheduler_type: str | None
    total_num_steps: int | None  # of WarmupDecayLR / WarmupCosineLR, the schedule's length

    def schedule_change(self, steps: int) -> str:
        """The JSON's schedule changed to end at `steps`, in words: total_num_steps, and warmup_num_steps
        scaled alike where the warmup would not fit (a warmup past total_num_steps is refused)."""
        warmup = ((self.config.get("scheduler") or {}).get("params") or {}).get("warmup_num_steps")
        change = f"total_num_steps to {steps}"
        if isinstance(warmup, int) and warmup > steps and self.total_num_steps:
            scaled = max(1, warmup * steps // self.total_num_steps)  # (DeepSpeed's warmup takes at least 1 step)
            change += f" and warmup_num_steps to {scaled} (the same share of the run)"
        return change

    @property
    def uses_lamb(self) -> bool:
        return self.optimizer_type is not None and self.optimizer_type.lower() == "lamb"

    def per_tensor_update_problems(self) -> list[str]:
        """What keeps DeepSpeed from updating (and reducing) each parameter as its own tensor: ZeRO 1-2 and the
        fp16/bf16 optimizers work on flat buffers, where a parameter without a gradient is still a slice of
        the update; only fp32 ZeRO stage 0 leaves it alone. Each problem names its fix."""
        problems = []
        if self.zero_stage != 0:
            problems.append(f"zero_optimization.stage is {self.zero_stage}: set it to 0")
        if self.precision != "fp32":
            problems.append(f"the JSON enables {self.precision}: remove its fp16/bf16 section (fp32)")
        return problems


def load_ds_config(path: str | Path) -> dict[str, Any]:
    """Read a DeepSpeed JSON file; a missing file or broken JSON names the file and the position."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"DeepSpeed config {path} does not exist; pass --deepspeed_config with a JSON "
                          f"file, e.g. {CPU_CONFIG_HINT} (see ds_configs/README.md).")
    config = load_json(path, ConfigError, "correct the DeepSpeed config (ds_configs/README.md shows its sections)")
    if not isinstance(config, dict):
        raise ConfigError(f"DeepSpeed config {path} must hold a JSON object, not {type(config).__name__}.")
    return config


def validate_ds_config(config: dict[str, Any], *, world_size: int, has_moe: bool,
                       cuda_available: bool) -> DeepSpeedSettings:
    """Check a DeepSpeed JSON dict against this run; raise ConfigError naming the fix on the first problem."""
    _check_known_keys(config)
    check_values(config)
    batch = resolve_batch(config, world_size)
    zero_stage = _zero_stage(config, has_moe)
    precision = _precision(config, cuda_available)
    optimizer_type = _check_optimizer(config, zero_stage)
    scheduler_type, total_steps = _check_scheduler(config)
    # Nested sections against DeepSpeed's own models and signatures.
    check_pydantic_sections(config)
    check_offload(config, optimizer_type)
    return DeepSpeedSettings(config=config, batch=batch, zero_stage=zero_stage, precision=precision,
                             optimizer_type=optimizer_type, scheduler_type=scheduler_type,
                             total_num_steps=total_steps)


def _did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
    return f" Did you mean {close[0]!r}?" if close else ""


def _check_known_keys(config: dict[str, Any]) -> None:
    for key in config:
        if key not in KNOWN_TOP_LEVEL_KEYS:
            raise ConfigError(f"DeepSpeed config has an unknown key {key!r}: DeepSpeed would silently ignore it."
                              f"{_did_you_mean(key, KNOWN_TOP_LEVEL_KEYS)} "
                              f"(Known keys: https://www.deepspeed.ai/docs/config-json/.)")


def _positive_int(config: dict[str, Any], key: str) -> int | None:
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"DeepSpeed config: {key} must be a positive integer, got {value!r}.")
    return value


def resolve_batch(config: dict[str, Any], world_size: int) -> BatchSizes:
    """DeepSpeed's own resolution (runtime/config.py `_set_batch_related_parameters`), but refusing the
    cases where it would silently floor a division or fail later on a bare assert."""
    train = _positive_int(config, "train_batch_size")
    micro = _positive_int(config, "train_micro_batch_size_per_gpu")
    accum = _positive_int(config, "gradient_accumulation_steps")
    ranks = world_size
    if train is None and micro is None:
        raise ConfigError("DeepSpeed config sets neither train_batch_size nor train_micro_batch_size_per_gpu; "
                          "set both (the accumulation steps are then derived from the world size).")
    if train is not None and micro is not None and accum is not None:
        if train != micro * accum * ranks:
            fix = ""
            if train % (micro * ranks) == 0:
                fix = (f" For {ranks} rank(s) set gradient_accumulation_steps to {train // (micro * ranks)}, "
                       f"or remove it and DeepSpeed derives it.")
            raise ConfigError(
                f"DeepSpeed config batch sizes disagree with the world size: train_batch_size {train} != "
                f"train_micro_batch_size_per_gpu {micro} x gradient_accumulation_steps {accum} x {ranks} "
                f"data-parallel rank(s) = {micro * accum * ranks}.{fix} "
                f"Or set train_batch_size to {micro * accum * ranks}.")
    elif train is not None and micro is not None:
        if train % (micro * ranks):
            raise ConfigError(
                f"DeepSpeed config: train_batch_size {train} is not a multiple of train_micro_batch_size_per_gpu "
                f"{micro} x {ranks} data-parallel rank(s) = {micro * ranks}, so no whole number of "
                f"gradient accumulation steps fits; change the micro batch size or the number of ranks.")
        accum = train // (micro * ranks)
    elif train is not None:
        accum = accum or 1
        if train % (accum * ranks):
            raise ConfigError(
                f"DeepSpeed config: train_batch_size {train} is not a multiple of gradient_accumulation_steps "
                f"{accum} x {ranks} data-parallel rank(s); set train_micro_batch_size_per_gpu explicitly.")
        micro = train // (accum * ranks)
    else:
        accum = accum or 1
        train = micro * accum * ranks
    return BatchSizes(train_batch_size=train, micro_batch_size=micro, gradient_accumulation_steps=accum,
                      data_parallel_size=ranks)


def _zero_stage(config: dict[str, Any], has_moe: bool) -> int:
    zero = config.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise ConfigError("DeepSpeed config: zero_optimization must be an object like {\"stage\": 1}.")
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise ConfigError(f"DeepSpeed config: zero_optimization.stage must be 0, 1, 2 or 3, got {stage!r}.")
    if stage == 3 and has_moe:
        raise ConfigError("DeepSpeed config asks for ZeRO stage 3, but DeepSpeed's MoE supports ZeRO stage 1 "
                          "and 2 only; set zero_optimization.stage to 2 (or 1), e.g. "
                          "ds_configs/pretrain_phase1_seq128_lamb_zero2_bf16.json.")
    return stage


def _enabled(config: dict[str, Any], key: str) -> bool:
    section = config.get(key)
    if section is None:
        return False
    if not isinstance(section, dict):
        raise ConfigError(f"DeepSpeed config: {key} must be an object like {{\"enabled\": true}}.")
    return bool(section.get("enabled", False))


def _precision(config: dict[str, Any], cuda_available: bool) -> str:
    fp16 = _enabled(config, "fp16")
    bf16 = _enabled(config, "bf16") or _enabled(config, "bfloat16")
    if fp16 and bf16:
        raise ConfigError("DeepSpeed config enables both fp16 and bf16; keep one of them.")
    if fp16 and not cuda_available:
        raise ConfigError(f"fp16 needs a CUDA device; use {CPU_CONFIG_HINT} or remove fp16 from the DeepSpeed "
                          f"config (DeepSpeed's CPU accelerator trains in fp32 or bf16).")
    return "fp16" if fp16 else "bf16" if bf16 else "fp32"


def _check_optimizer(config: dict[str, Any], zero_stage: int) -> str | None:
    section = config.get("optimizer")
    if section is None:
        return None
    if not isinstance(section, dict) or "type" not in section:
        raise ConfigError("DeepSpeed config: optimizer must be an object with a \"type\" and \"params\", "
                          "e.g. {\"type\": \"Lamb\", \"params\": {\"lr\": 0.00176}}.")
    name = section["type"]
    import torch.optim

    torch_names = [n for n in dir(torch.optim) if isinstance(getattr(torch.optim, n), type)]
    if not (isinstance(name, str) and (name.lower() in DEEPSPEED_OPTIMIZERS or name in torch_names)):
        choices = list(DEEPSPEED_OPTIMIZERS) + ["Lamb", "Adam", "AdamW"] + torch_names
        raise ConfigError(f"DeepSpeed config: unknown optimizer type {name!r}.{_did_you_mean(str(name), choices)}")
    params = section.get("params", {})
    if name.lower() == "lamb":
        for key in params:
            if key not in LAMB_PARAMS:
                raise ConfigError(f"DeepSpeed config: Lamb has no parameter {key!r}."
                                  f"{_did_you_mean(key, LAMB_PARAMS)} Known: {', '.join(sorted(LAMB_PARAMS))}.")
    else:
        check_optimizer_params(name, params)
    if (zero_stage > 0 and name.lower() not in ZERO_TESTED_OPTIMIZERS
            and not config.get("zero_allow_untested_optimizer", False)):
        raise ConfigError(f"DeepSpeed config uses ZeRO stage {zero_stage} with optimizer {name!r}, which DeepSpeed "
                          f"calls untested with ZeRO and refuses; add \"zero_allow_untested_optimizer\": true "
                          f"(our shipped LAMB configs do).")
    return name


def _check_scheduler(config: dict[str, Any]) -> tuple[str | None, int | None]:
    section = config.get("scheduler")
    if section is None:
        return None, None
    if not isinstance(section, dict) or "type" not in section:
        raise ConfigError("DeepSpeed config: scheduler must be an object with a \"type\" and \"params\".")
    name = section["type"]
    if name not in SCHEDULERS:
        raise ConfigError(f"DeepSpeed config: unknown scheduler type {name!r}.{_did_you_mean(str(name), SCHEDULERS)}"
                          f" DeepSpeed's schedulers: {', '.join(SCHEDULERS)}.")
    params = section.get("params", {})
    check_scheduler_params(name, params)
    peak = params.get("warmup_max_lr")
    opt_lr = config.get("optimizer", {}).get("params", {}).get("lr")
    if peak is not None and opt_lr is not None and peak != opt_lr:
        raise ConfigError(f"DeepSpeed config: optimizer.params.lr {opt_lr} differs from scheduler.params."
                          f"warmup_max_lr {peak}; the scheduler sets the learning rate every step, so one of "
                          f"them would be silently ignored. Make them equal.")
    total = params.get("total_num_steps")
    if total is not None and (isinstance(total, bool) or not isinstance(total, int) or total <= 0):
        raise ConfigError(f"DeepSpeed config: scheduler.params.total_num_steps must be a positive integer, "
                          f"got {total!r}.")
    warmup = params.get("warmup_num_steps")
    if warmup is not None and (isinstance(warmup, bool) or not isinstance(warmup, int) or warmup <= 0):
        raise ConfigError(f"DeepSpeed config: scheduler.params.warmup_num_steps must be a positive integer (DeepSpeed's "
                          f"warmup takes at least 1 step), got {warmup!r}.")
    if total is not None and isinstance(warmup, int) and warmup > total:
        raise ConfigError(f"DeepSpeed config: scheduler warmup_num_steps {warmup} exceeds total_num_steps {total}.")
    return name, total


# What decides the optimisation trajectory: a resume with any of these changed is no longer the same run. The
# accumulation steps and the ZeRO stage are the layout's (the same global and micro batch on other ranks, the
# same fp32 arithmetic partitioned otherwise): a resume re-lays a checkpoint out for them (training/plan.py).
TRAJECTORY_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "optimizer", "scheduler",
                   "gradient_clipping", "fp16", "bf16", "bfloat16")


def trajectory_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """`key: saved -> current` for every setting of TRAJECTORY_KEYS that differs (nested ones dotted)."""

    def flat(config: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key in TRAJECTORY_KEYS:
            section, _, inner = key.partition(".")
            value = config.get(section)
            if inner:
                value = value.get(inner) if isinstance(value, dict) else None
            if isinstance(value, dict):
                stack = [(key, value)]
                while stack:
                    prefix, node = stack.pop()
                    for name, item in node.items():
                        if isinstance(item, dict):
                            stack.append((f"{prefix}.{name}", item))
                        else:
                            out[f"{prefix}.{name}"] = item
            elif value is not None:
                out[key] = value
        return out

    before, after = flat(saved), flat(current)
    return [f"{key}: {before.get(key, '<absent>')!r} -> {after.get(key, '<absent>')!r}"
            for key in sorted(set(before) | set(after)) if before.get(key) != after.get(key)]
