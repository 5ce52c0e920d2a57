"""A training checkpoint without its layout: every tensor whole, experts by global index.

A DeepSpeed tag written by our trainer (any world size W, expert-parallel size ep, ZeRO stage 0/1/2, fp32 or bf16)
is read into a `ShapeFreeState`: for every parameter, by its global name, the fp32 master weight, the optimizer's
per-tensor state (our LAMB's `exp_avg`, `exp_avg_sq` and its `step`) and the param group's hyper-parameters,
plus the scalar state (LR schedule, global step and samples, the source ranks' data-loader states, the source's
layout and precision). It is saved as a portable folder (`tensors.safetensors` + `state.json`) and put into a
freshly built engine of another layout or precision (checkpoint/relayout.py), whose own `save_checkpoint` then
writes the tag for that layout.

Where DeepSpeed's own code does the work and where ours takes over:

- ZeRO 1/2 files (`zero_pp_rank_<r>_mp_rank_00_optim_states.pt`; bf16: `bf16_zero_pp_rank_<r>_...`, the same
  content) hold, per param group, the rank's flat fp32 partition (`single_partition_of_fp32_groups`: the master
  weights, also under bf16), the base optimizer's state of that partition and `param_slice_mappings`
  (name -> `fragment_address(numel, start)` in the partition). Like DeepSpeed's `ds_to_universal.
  extract_zero_shards` we cut each tensor's fragments out of the partitions and join them in partition order;
  unlike it we read with `torch.load(weights_only=True)` (deepspeed.py: no pickled code runs) and we know MoE
  expert groups, which its universal checkpoint does not (DeepSpeed #4497, #5716): an expert group is
  partitioned over the expert-data-parallel ranks of one expert-parallel rank e = r % ep (DeepSpeed's default
  E+D topology), and its names carry the LOCAL expert index, which becomes e * (E / ep) + local.
- ZeRO 0 files (`expp_rank_<e>_mp_rank_00_optim_states.pt`, one per expert-parallel rank; a model without MoE
  layers keeps it in `mp_rank_00_model_states.pt`) hold a torch optimizer state dict keyed by position; the positions are named by rebuilding the engine's param groups
  (`build_param_groups`) on a model of the same architecture and ep_size built on the meta device. fp32: the
  module's weights are the master weights. bf16: DeepSpeed's `FP16_UnfusedOptimizer` wraps that state dict
  with its fp32 copies (`fp32_groups`, by the same positions: the masters) and a static loss scale of 1 (nothing
  to carry); the module holds the bf16 weights computed from them.
- fp16 adds the dynamic loss scaler (scale, iterations since the last overflow, hysteresis), which only CUDA
  engines write; without real fp16 files to verify against, fp16 checkpoints are refused with their fix
  (docs/pretraining.md, "Resuming on another shape").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from widenet_ds.checkpoint.deepspeed import (
    load_torch_file,
    precision,
    read_tag,
    zero_stage,
)
from widenet_ds.checkpoint.marker import CheckpointMeta, check_marker
from widenet_ds.checkpoint.source import CheckpointSource
from widenet_ds.checkpoint.tags import MODEL_STATES
from widenet_ds.engine.lamb import build_param_groups
from widenet_ds.errors import CheckpointError
from widenet_ds.formats import VERSION_KEY, current, read_json, versioned
from widenet_ds.fs.atomic import atomic_folder
from widenet_ds.portable.format import TEXT_DEFAULT, architecture

SHAPE_FREE = "shape_free"  # state.json's kind in widenet_ds/formats.py
TENSORS_FILE = "tensors.safetensors"
STATE_FILE = "state.json"
MASTER = "master"  # the prefix of the fp32 master weights in TENSORS_FILE; optimizer states use their own key
_EXPERT = re.compile(r"\.deepspeed_experts\.(\d+)\.")
_GROUP_ENTRIES_NOT_HYPER = ("params", "name", "moe")  # what a param group holds besides its hyper-parameters
RELAID_OUT = ("fp32", "bf16")  # the precisions whose state is read and re-laid out (fp16: see the docstring)


@dataclass
class ShapeFreeState:
    """A checkpoint's training state independent of W, ep and the ZeRO stage."""

    master: dict[str, Tensor]  # global name -> fp32 master weight
    optimizer: dict[str, dict[str, Tensor]]  # state key (exp_avg, exp_avg_sq) -> global name -> tensor
    param_state: dict[str, dict[str, Any]]  # global name -> the optimizer's scalar state of it, as JSON ({"step": 2})
    hyper: dict[str, dict[str, Any]]  # global name -> its param group's hyper-parameters (lr, weight_decay, ...)
    scalars: dict[str, Any] = field(default_factory=dict)  # schedule, steps, samples, loaders, marker, source

    def check(self, where: str) -> None:
        """Every parameter has a master weight, the same optimizer state tensors, scalar state and a group."""
        names = set(self.master)
        for key, tensors in self.optimizer.items():
            if set(tensors) != names:
                raise CheckpointError(f"{where}: optimizer state {key!r} is missing for "
                                      f"{sorted(names - set(tensors))[:5]} or unknown for "
                                      f"{sorted(set(tensors) - names)[:5]}")
            bad = [n for n, t in tensors.items() if t.shape != self.master[n].shape]
            if bad:
                raise CheckpointError(f"{where}: optimizer state {key!r} of {bad[:5]} differs in shape from the weight")
        if set(self.param_state) != names or set(self.hyper) != names:
            raise CheckpointError(f"{where}: the per-tensor optimizer state or param groups do not name every weight")


def global_expert_name(name: str, ep_rank: int, local_experts: int, *, local: bool = False) -> str:
    """`...deepspeed_experts.<local>.` of expert-parallel rank `ep_rank` -> `...deepspeed_experts.<global>.`
    (`local=True`: back, global -> local index)."""
    def index(match: re.Match) -> str:
        number = int(match.group(1))
        return f".deepspeed_experts.{number % local_experts if local else ep_rank * local_experts + number}."
    return _EXPERT.sub(index, name)


def local_experts_of(state: ShapeFreeState, ep_size: int) -> int:
    """How many experts each expert-parallel rank holds of the state's (global) experts."""
    experts = {int(m.group(1)) for key in state.master if (m := _EXPERT.search(key))}
    return max(1, len(experts) // ep_size)


def scalar_json(state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer's per-tensor scalar state as JSON: torch's AdamW keeps its `step` as a 0-dim tensor, our
    LAMB as a number; a tensor becomes {"tensor": value, "dtype": name} (exact: a float32 step is a whole number)."""
    return {k: {"tensor": v.item(), "dtype": str(v.dtype).removeprefix("torch.")} if torch.is_tensor(v) else v
            for k, v in state.items()}


def scalar_values(state: dict[str, Any]) -> dict[str, Any]:
    """`scalar_json` back: the values the optimizer keeps."""
    return {k: torch.tensor(v["tensor"], dtype=getattr(torch, v["dtype"])) if isinstance(v, dict) and "tensor" in v
            else v for k, v in state.items()}


def _hyper(group: dict[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in group.items() if k not in _GROUP_ENTRIES_NOT_HYPER}


# --- reading a DeepSpeed tag ------------------------------------------------------------------------------
def fp16_refusal(what: str) -> str:
    """Why an fp16 state is not re-laid out, and the fixes (one sentence after `what`, e.g. "checkpoint X was
    trained in fp16")."""
    return (f"{what}: fp16's optimizer state includes DeepSpeed's dynamic loss scaler, and widenet-ds re-lays out "
            f"fp32 and bf16 state only (fp16 checkpoint files are written by CUDA engines only, and this re-layout "
            f"has not been verified against them)")


def check_carried(source: CheckpointSource, fix: str) -> None:
    """Refuse, before any file of it is read, a checkpoint whose training state is not re-laid out (fp16, as its
    marker records), naming `fix`."""
    meta = source.meta
    trained_in = precision({"ds_config": meta.deepspeed_config}) if meta and meta.deepspeed_config else None
    if trained_in is not None and trained_in not in RELAID_OUT:
        raise CheckpointError(f"{fp16_refusal(f'{source.tag_dir} was trained in {trained_in}')}; {fix}.")


def read_shape_free(source: CheckpointSource) -> ShapeFreeState:
    """The shape-free state of a complete widenet-ds training checkpoint (fp32 or bf16, ZeRO 0/1/2, any W and ep),
    opened (its marker read, its files checked) by the caller."""
    if source.is_folder:
        raise CheckpointError(f"{source.given} is a checkpoint folder (weights only): it holds no training state; pass "
                              f"a training checkpoint (a tag folder, a checkpoints folder or a run folder).")
    tag_dir, meta = source.tag_dir, source.meta
    if meta is None:
        check_marker(tag_dir)  # the error of a tag without our marker, naming the fix
    own_shape = (f"continue it on its own shape (--resume on the same ranks, --ep-size and ZeRO stage), or start a "
                 f"new run from its weights with --init-from {tag_dir}")
    check_carried(source, own_shape)
    if meta.shape_free_state:  # resharded: the state is kept as it is
        return stored_shape_free(tag_dir, meta)
    if not meta.optimizer_states:
        raise CheckpointError(f"{tag_dir} holds model states only (written by `convert reshard --model-states-only`): it has no "
                              f"optimizer state to carry; use the checkpoint it was resharded from.")
    states = load_torch_file(tag_dir / MODEL_STATES)
    trained_in = precision(states)
    if trained_in not in RELAID_OUT:  # (a marker that did not record the DeepSpeed JSON)
        raise CheckpointError(f"{fp16_refusal(f'{tag_dir} was trained in {trained_in}')}; {own_shape}.")
    experts = states.get("num_experts") or [0]
    local_experts = experts[0] // meta.ep_size
    stage = zero_stage(states)
    if stage in (1, 2):
        state = _read_zero_partitions(tag_dir, meta, local_experts, "bf16_" if trained_in == "bf16" else "")
    elif stage == 0:
        state = _read_stage0(tag_dir, meta, local_experts, trained_in)
    else:
        raise CheckpointError(f"{tag_dir} is a ZeRO stage {stage} checkpoint; DeepSpeed MoE trains with ZeRO 0/1/2.")
    loaders = [load_torch_file(path).get("loader") for path in sorted(tag_dir.glob("rank_*_state.pt"))]
    state.scalars = {
        VERSION_KEY: current(SHAPE_FREE), "lr_scheduler": states.get("lr_scheduler"),
        "global_steps": states["global_steps"], "global_samples": states.get("global_samples"),
        "skipped_steps": states.get("skipped_steps", 0), "loaders": loaders, "marker": meta.to_json(),
        "source": {"tag_dir": str(tag_dir.resolve()), "world_size": meta.world_size, "ep_size": meta.ep_size,
                   "zero_stage": stage, "precision": trained_in},
    }
    state.check(str(tag_dir))
    return state


def _read_zero_partitions(tag_dir: Path, meta: CheckpointMeta, local_experts: int, prefix: str) -> ShapeFreeState:
    """ZeRO 1/2: join each tensor's fragments over the ranks' flat partitions, in rank order. A dense group is
    partitioned over all ranks, an expert group over the ranks r with the same r % ep, in the order of r // ep:
    both are increasing r. `prefix`: DeepSpeed's of the files ("bf16_" under bf16)."""
    shapes: dict[str, torch.Size] = {}
    for group in load_torch_file(tag_dir / MODEL_STATES).get("param_shapes") or []:
        # rank 0's local names: the local experts of every rank have the same shapes
        shapes.update({n: torch.Size(shape) for n, shape in group.items()})
    pieces: dict[str, dict[str, list[Tensor]]] = {}  # state key -> global name -> fragments in partition order
    param_state: dict[str, dict[str, Any]] = {}
    hyper: dict[str, dict[str, Any]] = {}
    for rank in range(meta.world_size):
        sd = load_torch_file(tag_dir / f"{prefix}zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")["optimizer_state_dict"]
        base = sd["base_optimizer_state"]
        for index, (partition, mapping) in enumerate(zip(sd["single_partition_of_fp32_groups"],
                                                         sd["param_slice_mappings"])):
            group = base["param_groups"][index]
            opt_state = base["state"].get(group["params"][0], {})
            tensors = {MASTER: partition, **{k: v for k, v in opt_state.items() if torch.is_tensor(v) and v.dim() == 1}}
            scalar = scalar_json({k: v for k, v in opt_state.items() if k not in tensors})
            for name, address in mapping.items():
                key = global_expert_name(name, rank % meta.ep_size, local_experts) if group.get("moe") else name
                if key not in shapes and name not in shapes:
                    raise CheckpointError(f"{tag_dir}: rank {rank}'s optimizer partition holds {name}, which the "
                                          f"model states do not list; the checkpoint's files are mixed up.")
                for what, tensor in tensors.items():
                    pieces.setdefault(what, {}).setdefault(key, []).append(
                        tensor.narrow(0, address.start, address.numel))
                param_state[key], hyper[key] = scalar, _hyper(group)
    whole: dict[str, dict[str, Tensor]] = {}
    for what, by_name in pieces.items():
        for key, fragments in by_name.items():
            shape = shapes.get(key) or shapes[global_expert_name(key, 0, local_experts, local=True)]
            flat = torch.cat(fragments)
            if flat.numel() != shape.numel():
                raise CheckpointError(f"{tag_dir}: the ZeRO partitions hold {flat.numel()} values of {key} "
                                      f"({what}), its shape {tuple(shape)} has {shape.numel()}; a rank's file is missing "
                                      f"or of another run.")
            whole.setdefault(what, {})[key] = flat.reshape(shape).clone()
    master = whole.pop(MASTER)
    return ShapeFreeState(master, whole, param_state, hyper)


def _read_stage0(tag_dir: Path, meta: CheckpointMeta, local_experts: int, trained_in: str) -> ShapeFreeState:
    """ZeRO 0: the optimizer state of expert-parallel rank e is a torch state dict whose positions follow the
    engine's param groups, rebuilt here on the meta device. The masters: fp32, the module's weights; bf16, the
    fp32 copies DeepSpeed's optimizer keeps beside that state dict, by the same positions."""
    checkpoint = read_tag(tag_dir, meta)
    master = checkpoint.state if trained_in == "fp32" else {}
    arch = architecture(meta.architecture or TEXT_DEFAULT, str(tag_dir))
    cfg = arch.config.from_dict(meta.model_config)
    extra = {"num_labels": checkpoint.num_labels} if arch.takes_num_labels else {}
    with torch.device("meta"):
        model = arch.model(cfg, ep_size=meta.ep_size, **extra)
    names = {id(p): n for n, p in model.named_parameters()}
    groups = build_param_groups(model, weight_decay=0.0)
    optimizer: dict[str, dict[str, Tensor]] = {}
    param_state: dict[str, dict[str, Any]] = {}
    hyper: dict[str, dict[str, Any]] = {}
    for ep_rank in range(meta.ep_size):
        expert_file = tag_dir / f"expp_rank_{ep_rank}_mp_rank_00_optim_states.pt"
        # (a model without MoE layers: DeepSpeed keeps the optimizer state in the model-states file)
        saved_optimizer = (load_torch_file(expert_file) if expert_file.is_file() or meta.ep_size > 1 else
                           load_torch_file(tag_dir / MODEL_STATES))["optimizer"]
        sd, copies = ((saved_optimizer, None) if trained_in == "fp32" else
                      (saved_optimizer["optimizer_state_dict"], saved_optimizer["fp32_groups"]))
        if len(sd["param_groups"]) != len(groups):
            raise CheckpointError(f"{tag_dir}: the optimizer has {len(sd['param_groups'])} param groups, a model of "
                                  f"its config {len(groups)}; the checkpoint is of another model or program.")
        for index, (saved, built) in enumerate(zip(sd["param_groups"], groups)):
            for slot, (position, param) in enumerate(zip(saved["params"], built["params"], strict=True)):
                name = names[id(param)]
                if ep_rank > 0 and not built.get("moe"):
                    continue  # dense weights: every expert-parallel rank holds the same; rank 0's are read
                key = global_expert_name(name, ep_rank, local_experts) if built.get("moe") else name
                if copies is not None:
                    master[key] = copies[index][slot]
                opt_state = sd["state"].get(position, {})
                for what, value in opt_state.items():
                    if torch.is_tensor(value) and value.shape == param.shape:
                        optimizer.setdefault(what, {})[key] = value
                param_state[key] = scalar_json({k: v for k, v in opt_state.items()
                                                if not (torch.is_tensor(v) and v.dim() > 0)})
                hyper[key] = _hyper(saved)
    if set(master) != set(checkpoint.state):
        raise CheckpointError(f"{tag_dir}: the optimizer's fp32 copies and the model's weights differ in their names "
                              f"({sorted(set(master) ^ set(checkpoint.state))[:5]}); the files are of another run.")
    return ShapeFreeState(master, optimizer, param_state, hyper)


# --- the portable folder ----------------------------------------------------------------------------------
def save_shape_free(state: ShapeFreeState, folder: Path, *, overwrite: bool = False) -> Path:
    """`folder/tensors.safetensors` (`master/<name>`, `<state key>/<name>`) + `folder/state.json` (the rest)."""
    tensors = {f"{MASTER}/{n}": t.contiguous() for n, t in state.master.items()}
    for what, by_name in state.optimizer.items():
        tensors.update({f"{what}/{n}": t.contiguous() for n, t in by_name.items()})
    document = versioned(SHAPE_FREE, {"param_state": state.param_state, "hyper": state.hyper, "scalars": state.scalars})
    with atomic_folder(folder, overwrite, CheckpointError) as tmp:
        save_file(tensors, tmp / TENSORS_FILE)
        (tmp / STATE_FILE).write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    return Path(folder)


def load_shape_free(folder: Path) -> ShapeFreeState:
    folder = Path(folder)
    document = read_json(SHAPE_FREE, folder / STATE_FILE)
    master: dict[str, Tensor] = {}
    optimizer: dict[str, dict[str, Tensor]] = {}
    for key, tensor in load_file(folder / TENSORS_FILE).items():
        what, name = key.split("/", 1)
        (master if what == MASTER else optimizer.setdefault(what, {}))[name] = tensor
    state = ShapeFreeState(master, optimizer, document["param_state"], document["hyper"], document["scalars"])
    state.check(str(folder))
    return state


def stored_shape_free(tag_dir: Path, meta: CheckpointMeta) -> ShapeFreeState:
    """The training state a resharded tag keeps in its folder `meta.shape_free_state`."""
    return load_shape_free(Path(tag_dir) / meta.shape_free_state)
