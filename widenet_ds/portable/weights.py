"""A checkpoint's weights (a `PortableCheckpoint`: from a portable folder or any DeepSpeed checkpoint, any ep_size,
text or image) into a model.

`load_into(model, checkpoint, name)` copies them into a model built from a config of its own, each rank taking
its own experts (a trainer's `--init-from` with other classes; `checkpoint.source.load_pretrained(cls, path)`
opens a path and builds `cls` with the saved config first); `match_weights` makes the same checks before any
model exists, so that a trainer can refuse a misfit before it builds anything.

The rule, for every architecture: the body (the encoder and its embeddings) must match key for key and shape
for shape, and in its branch layout; a head the checkpoint lacks or holds in another shape (another
num_classes or num_labels, pre-logits on or off, another task's head) is newly initialised, and a checkpoint
head the model has no place for is unused; the report lists both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from widenet_ds.errors import CheckpointError
from widenet_ds.model.base import EncoderModel
from widenet_ds.model.config import EncoderConfig
from widenet_ds.portable.format import (
    Architecture,
    PortableCheckpoint,
    architecture,
    config_differences,
    expected_shapes,
    global_key_map,
    is_expert_key,
)


def check_same_family(checkpoint: PortableCheckpoint, arch: Architecture, source: str) -> None:
    saved = architecture(checkpoint.architecture)
    if saved.config is not arch.config:
        def reads(a: Architecture) -> str:
            return "text" if a.tokenized else "images"
        raise CheckpointError(f"{source} holds a {saved.name}, which reads {reads(saved)}; it cannot initialise a "
                              f"{arch.name}, which reads {reads(arch)} (their bodies differ). Start from a "
                              f"checkpoint of a {arch.config.__name__} model.")


@dataclass
class WeightMatch:
    """Which of a checkpoint's weights a model takes; keys are global (experts by global index)."""

    load: dict[str, Tensor]  # the checkpoint's tensors that fit the model
    new: list[str]           # the model's head keys the checkpoint lacks or holds in another shape
    unused: list[str]        # the checkpoint's head keys the model has no place for


def match_weights(checkpoint: PortableCheckpoint, architecture_name: str, cfg: EncoderConfig, source: str, *,
                  num_labels: int | None = None, shapes: dict[str, tuple[int, ...]] | None = None) -> WeightMatch:
    """The checkpoint's weights for a model of `architecture_name` built from `cfg`; a body that does not fit
    is an error naming the keys and the fix.

    shapes: the model's keys (global) and shapes; default those of `cfg` with every expert (a model with
    ep_size > 1 passes its own: the experts of the other ranks are then not its keys, and not unused)."""
    arch = architecture(architecture_name, "the model")
    check_same_family(checkpoint, arch, source)
    saved = checkpoint.config
    branched = max(saved.num_branches, cfg.num_branches) > 1
    if branched and (saved.num_branches, saved.layers_per_branch) != (cfg.num_branches, cfg.layers_per_branch):
        # The same keys can hold another layout (12 blocks as 3 x 4 or 4 x 3): compare the layouts themselves.
        raise CheckpointError(f"{source} holds {saved.num_branches} branch(es) x {saved.layers_per_branch} layers, "
                              f"the model {cfg.num_branches} x {cfg.layers_per_branch}; build the model with the "
                              f"checkpoint's layout: --set num_branches={saved.num_branches} "
                              f"--set num_layers={saved.num_layers}.")
    if shapes is None:
        shapes = expected_shapes(arch.name, cfg, num_labels)
    load, new, misfits = {}, [], []
    for key, shape in shapes.items():
        tensor = checkpoint.state.get(key)
        if tensor is not None and tuple(tensor.shape) == shape:
            load[key] = tensor
        elif arch.is_body(key):
            misfits.append(f"{key}: {tuple(tensor.shape) if tensor is not None else 'absent'} in the checkpoint, "
                           f"{shape} in the model")
        else:
            new.append(key)
    unused = sorted(key for key in checkpoint.state if key not in shapes and not is_expert_key(key))
    misfits += [f"{key}: in the checkpoint, not in the model" for key in unused if arch.is_body(key)]
    if misfits:
        diffs = config_differences(saved.to_dict(), cfg.to_dict())
        raise CheckpointError(f"{source}: the weights do not fit the body of {arch.name}:\n  "
                              + "\n  ".join(misfits[:8]) + (f"\n  ... {len(misfits) - 8} more" if len(misfits) > 8
                                                          else "")
                              + "\nBuild the model with the checkpoint's config; only the head may differ "
                                "(num_classes, pre_logits, num_labels)"
                              + (": the configs differ in\n  " + "\n  ".join(diffs[:8]) if diffs else "") + ".")
    return WeightMatch(load, sorted(new), unused)


@dataclass
class LoadReport:
    """What `load_pretrained` loaded; `summary()` is the lines a finetune log should show."""

    source: str
    architecture: str                    # of the saved weights
    loaded: int                          # tensors copied into this model
    new: list[str]                       # this model's keys the source lacks (newly initialised heads)
    unused: list[str]                    # source keys this model has no place for (e.g. pretraining heads)
    experts_on_this_rank: list[int]      # global expert indices this rank loaded
    saved_ep_size: int | None
    ep_size: int | None
    provenance: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        lines = [f"loaded {self.loaded} tensors from {self.source} ({self.architecture}"
                 + (f", step {self.provenance['step']}" if "step" in self.provenance else "") + ")"]
        if self.ep_size is not None:
            saved = f"ep_size {self.saved_ep_size}" if self.saved_ep_size else "an unrecorded ep_size"
            lines.append(f"experts: saved with {saved}, loaded with ep_size {self.ep_size}; "
                         f"this rank holds global experts {self.experts_on_this_rank}")
        if self.new:
            lines.append(f"newly initialised: {', '.join(self.new)}")
        if self.unused:
            lines.append(f"unused from the checkpoint: {', '.join(self.unused)}")
        return "\n".join(lines)


def load_into(model: EncoderModel, checkpoint: PortableCheckpoint, source: str) -> LoadReport:
    """Copy a checkpoint's weights into `model` (any ep_size): the body must fit (`match_weights`), a head of
    another shape or absent keeps the model's own initialisation."""
    to_global = global_key_map(model)
    own = model.state_dict()
    shapes = {to_global[local]: tuple(tensor.shape) for local, tensor in own.items()}
    match = match_weights(checkpoint, type(model).__name__, model.cfg, source, shapes=shapes)
    loaded = {local: match.load[key] for local, key in to_global.items() if key in match.load}
    missing, unexpected = model.load_state_dict(loaded, strict=False)
    assert sorted(missing) == match.new and not unexpected, (missing, unexpected)  # heads: local key = global key
    moe_layers = model.moe_layers()
    experts = sorted({i for m in moe_layers for i in m.global_expert_indices()})
    return LoadReport(source, checkpoint.architecture, len(loaded), match.new, match.unused, experts,
                      checkpoint.provenance.get("trained_with_ep_size") if checkpoint.config.is_moe else None,
                      moe_layers[0].ep_size if moe_layers else None, dict(checkpoint.provenance))
