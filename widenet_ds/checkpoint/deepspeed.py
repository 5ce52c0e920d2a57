"""Consolidate a DeepSpeed MoE checkpoint (any ep_size, any world size, ZeRO 0/1/2) into full weights.

What DeepSpeed writes for our models (one tag folder, e.g. `<output>/checkpoints/step1000/`):

    mp_rank_00_model_states.pt                    rank 0: every non-expert weight ("module"), the step,
                                                  the LR schedule, dp_world_size, num_experts, ds_config
    layer_<L>_expert_<g>_mp_rank_00_model_states.pt   one file per MoE layer L and GLOBAL expert g, keys
                                                  already renamed to the global index (written by the
                                                  first expert-data-parallel replica of each expert)
    zero_pp_rank_<r>_mp_rank_00_optim_states.pt   ZeRO 1/2: rank r's optimizer partition
    expp_rank_<e>_mp_rank_00_optim_states.pt      ZeRO 0: the optimizer state of expert-parallel rank e
    widenet_checkpoint.json, rank_*_state.pt      ours (widenet_ds.checkpoint.manager): complete marker
                                                  (architecture, model config, step, ep_size, ...); per-rank
                                                  loader/RNG state

DeepSpeed's `zero_to_fp32` and universal checkpoints do not know the expert files (DeepSpeed #4497,
#5716). The weights need neither: in the model-states files the non-expert weights are complete
(rank 0's copy) and every expert has its own file, so the union is the whole model whatever the
ep_size or world size was. These are the weights the engine computes with: with fp32 training they
are the optimizer's master weights; with bf16/fp16 they are the 16-bit copies (see docs/checkpoints.md).

Reading DeepSpeed's `.pt` files without executing pickled code: DeepSpeed saves checkpoints with `torch.save`, i.e. as pickles. We read them with
`torch.load(weights_only=True)`: only tensors, containers and primitive types are rebuilt, plus the few
DeepSpeed classes below that its ZeRO optimizer files hold. None of these classes runs code when
rebuilt (a named tuple, an enum, and a plain object whose attributes are restored). Anything else in a
file -- e.g. a `__reduce__` that would call `os.system` -- is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from widenet_ds.checkpoint.marker import META_FILE, CheckpointMeta
from widenet_ds.checkpoint.tags import MODEL_STATES
from widenet_ds.errors import CheckpointError, ConfigError
from widenet_ds.formats import split_run_settings
from widenet_ds.model.config import EncoderConfig
from widenet_ds.portable.format import (
    PortableCheckpoint,
    architecture,
    check_explicit_config,
    infer_architecture,
    is_expert_key,
)


def expert_file(tag_dir: Path, layer: int, expert: int) -> Path:
    return Path(tag_dir) / f"layer_{layer}_expert_{expert}_mp_rank_00_model_states.pt"


def _model_config(tag_dir: Path, meta: CheckpointMeta | None, states: dict, explicit: Path | None,
                  config_type: type[EncoderConfig]) -> EncoderConfig:
    # The marker's config (upgraded: the model's fields only), else one another program kept in DeepSpeed's
    # client state (unversioned: its run settings, as configs of 0.1 held them, are left out).
    for where, stored in ((META_FILE, meta.model_config if meta else None),
                          (f"{MODEL_STATES} client state", states.get("model_config"))):
        if isinstance(stored, dict):
            try:
                recorded = config_type.from_dict(split_run_settings(stored)[0])
            except ConfigError as err:
                raise CheckpointError(f"{tag_dir}: the model config in {where}: {err}") from None
            if explicit is not None:
                check_explicit_config(recorded, explicit, f"{tag_dir}/{where}")
            return recorded
    if explicit is not None:
        return config_type.from_json(explicit)
    raise CheckpointError(f"{tag_dir} does not record its model config (no {META_FILE} and no 'model_config' in the "
                          f"client state); pass --model-config with the JSON the run was trained with.")


def zero_stage(states: dict) -> int:
    return int((states.get("ds_config") or {}).get("zero_optimization", {}).get("stage", 0))


def precision(states: dict) -> str:
    config = states.get("ds_config") or {}
    for name in ("bf16", "fp16"):
        if (config.get(name) or {}).get("enabled"):
            return name
    return "fp32"


def read_tag(tag_dir: Path, meta: CheckpointMeta | None, *, model_config: Path | None = None) -> PortableCheckpoint:
    """The weights of one tag folder whose marker is already read (None: another program's checkpoint)."""
    if any(tag_dir.glob("zero_pp_rank_*_mp_rank_*_model_states.pt")):
        raise CheckpointError(f"{tag_dir} is a ZeRO stage 3 checkpoint; DeepSpeed MoE trains with ZeRO 1/2 only, and "
                              f"widenet-ds converts those.")
    if any(tag_dir.glob("mp_rank_0[1-9]_model_states.pt")):
        raise CheckpointError(f"{tag_dir} holds several model-parallel ranks; widenet-ds trains without tensor "
                              f"parallelism and cannot merge them.")
    states = load_torch_file(tag_dir / MODEL_STATES)
    if not isinstance(states, dict) or not isinstance(states.get("module"), dict):
        raise CheckpointError(f"{tag_dir / MODEL_STATES} holds no 'module' state dict; not a DeepSpeed checkpoint.")
    # The marker names the architecture (image runs; text runs from now on); older text markers do not, and the
    # heads of the weights (the experts are in files of their own) tell which task model it is.
    shapes = {key: tuple(tensor.shape) for key, tensor in states["module"].items()}
    name, num_labels = (meta.architecture, meta.num_labels) if meta else (None, None)
    if name is None:
        name, num_labels = infer_architecture(shapes)
    arch = architecture(name, str(tag_dir / META_FILE))
    if arch.takes_num_labels and num_labels is None:
        num_labels = infer_architecture(shapes)[1]
    cfg = _model_config(tag_dir, meta, states, model_config, arch.config)

    state: dict[str, Tensor] = {}
    for key, tensor in states["module"].items():
        if is_expert_key(key):
            raise CheckpointError(f"{tag_dir / MODEL_STATES} holds expert weight {key}; DeepSpeed keeps experts in "
                                  f"their own files, so this checkpoint is not one of DeepSpeed's MoE layout.")
        state[key] = tensor
    if cfg.is_moe:
        saved_experts = states.get("num_experts")
        if saved_experts is not None and saved_experts != [cfg.moe.num_experts] * len(saved_experts):
            raise CheckpointError(f"{tag_dir} was saved with num_experts {saved_experts}, the model config says "
                                  f"{cfg.moe.num_experts}; use the config the run was trained with.")
        for layer in range(cfg.num_moe_layers):
            for expert in range(cfg.moe.num_experts):
                for key, tensor in load_torch_file(expert_file(tag_dir, layer, expert)).items():
                    if f".deepspeed_experts.{expert}." not in key or key in state:
                        raise CheckpointError(f"{expert_file(tag_dir, layer, expert)} holds {key}, not expert "
                                              f"{expert}'s weights; the checkpoint's files are mixed up.")
                    state[key] = tensor
    state = {k: t.float() if t.is_floating_point() else t for k, t in state.items()}
    step = meta.step if meta else states.get("global_steps")
    provenance = {
        "source": str(tag_dir.resolve()), "tag": tag_dir.name, "step": step,
        "world_size": meta.world_size if meta else states.get("dp_world_size"),
        "trained_with_ep_size": meta.ep_size if meta else None,
        "zero_stage": zero_stage(states), "training_precision": precision(states),
        "weights": ("the engine's fp32 weights (= the optimizer's master weights)" if precision(states) == "fp32"
                    else f"the engine's {precision(states)} weights (the fp32 master copy in the ZeRO shards is "
                         f"not read)"),
        "deepspeed_version": states.get("ds_version"),
    }
    if meta and "dataset" in meta.run:  # image runs
        provenance["dataset"] = meta.run["dataset"]
    checkpoint = PortableCheckpoint(cfg, arch.name, state, num_labels, provenance)
    checkpoint.check(f"DeepSpeed checkpoint {tag_dir}")
    return checkpoint


# --- weights-only reading of DeepSpeed's pickles ----------------------------------------------------------
def deepspeed_safe_globals() -> list[Any]:
    """The DeepSpeed classes allowed in addition to torch's weights-only set (listed in docs/checkpoints.md)."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [fragment_address, ZeroStageEnum, LossScaler]


def load_torch_file(path: Path) -> Any:
    """A DeepSpeed/PyTorch checkpoint file, rebuilt without running any code from it."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} does not exist; the checkpoint is incomplete (copy every "
                              f"file of the tag folder) or another program's.")
    try:
        with torch.serialization.safe_globals(deepspeed_safe_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises UnpicklingError, RuntimeError or EOFError depending on the damage
        raise CheckpointError(
            f"refused to read {path}: it is not a weights-only PyTorch file ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:300]}). widenet-ds never unpickles arbitrary objects (that can run code); "
            f"if the file is truncated, copy it again; if it holds custom classes, re-save its tensors.") from None
