"""Loading weights into a model: from a portable folder or any DeepSpeed checkpoint, any ep_size.

`load_pretrained(cls, source)` is the one answer to "how do I load a checkpoint?": it reads the source
(`read_checkpoint`: a folder, a DeepSpeed tag folder, a checkpoints folder or a run's output folder),
builds `cls` with the saved config and copies the weights, each rank taking its own experts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from widenet_ds.checkpoint.deepspeed import read_deepspeed_checkpoint
from widenet_ds.checkpoint.format import (
    _BODY,
    PortableCheckpoint,
    global_key_map,
    is_expert_key,
    is_folder,
    read_folder,
)
from widenet_ds.checkpoint.training import config_differences, read_meta, resolve_tag_dir
from widenet_ds.data.tokenizer import tokenizer_files_in
from widenet_ds.errors import CheckpointError
from widenet_ds.model.config import ModelConfig
from widenet_ds.model.moe import MoEFeedForward


def read_checkpoint(source: Path, *, tag: str | None = None, model_config: Path | None = None) -> PortableCheckpoint:
    """A folder, or a DeepSpeed checkpoint (tag folder, checkpoints folder or run output folder)."""
    if is_folder(source):
        if tag is not None:
            raise CheckpointError(f"{source} is a checkpoint folder, which has no tags; drop the tag {tag!r}.")
        checkpoint = read_folder(source)
        if model_config is not None:
            diffs = [d for d in config_differences(checkpoint.config.to_dict(), ModelConfig.from_json(model_config)
                                                   .to_dict()) if not d.startswith("moe.ep_size:")]
            if diffs:
                raise CheckpointError(f"--model-config {model_config} differs from the model config recorded in "
                                      f"{source}/config.json:\n  " + "\n  ".join(diffs) + "\nThe recorded config is "
                                      "the one the weights were trained with; drop --model-config.")
        return checkpoint
    return read_deepspeed_checkpoint(source, tag=tag, model_config=model_config)


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


def load_into(model: nn.Module, checkpoint: PortableCheckpoint, source: str) -> LoadReport:
    """Copy a checkpoint's weights into `model` (any ep_size); heads may differ, the encoder may not."""
    to_global = global_key_map(model)
    own = model.state_dict()
    same_head = type(model).__name__ == checkpoint.architecture
    wanted = {key for key in to_global.values()}
    new = sorted(local for local, key in to_global.items() if key not in checkpoint.state)
    unused = sorted(key for key in checkpoint.state if key not in wanted and not is_expert_key(key))
    body_problems = [k for k in new + unused if k.startswith(_BODY)]
    if body_problems or (same_head and (new or unused)):
        raise CheckpointError(f"{source}: weights do not fit {type(model).__name__} -- missing "
                              f"{[k for k in new][:6]}, unknown {unused[:6]}; the model config differs from the "
                              f"checkpoint's (load with the checkpoint's config).")
    loaded = {}
    for local, key in to_global.items():
        if key in checkpoint.state:
            tensor = checkpoint.state[key]
            if tuple(tensor.shape) != tuple(own[local].shape):
                raise CheckpointError(f"{source}: {key} has shape {tuple(tensor.shape)}, the model expects "
                                      f"{tuple(own[local].shape)}; the model config differs from the checkpoint's.")
            loaded[local] = tensor
    missing, unexpected = model.load_state_dict(loaded, strict=False)
    assert sorted(missing) == new and not unexpected, (missing, unexpected)
    moe_layers = [m for m in model.modules() if isinstance(m, MoEFeedForward)]
    experts = sorted({i for m in moe_layers for i in m.global_expert_indices()})
    return LoadReport(source, checkpoint.architecture, len(loaded), new, unused, experts,
                      checkpoint.provenance.get("trained_with_ep_size") if checkpoint.config.is_moe else None,
                      moe_layers[0].ep_size if moe_layers else None, dict(checkpoint.provenance))


def load_pretrained(cls: type[nn.Module], source, *, ep_size: int = 1, model_overrides: dict[str, Any] | None = None,
                    tag: str | None = None, model_config: Path | None = None,
                    **model_kwargs: Any) -> tuple[nn.Module, LoadReport]:
    """`load_pretrained(cls, source)` -> (model, report): build `cls` with the saved config, load the weights.

    source: a checkpoint folder, or a DeepSpeed checkpoint of any ep_size and world size (a tag folder, a
      checkpoints folder or a run's output folder; `tag` picks one, default the latest complete one).
    model_overrides: config fields that keep the shapes (dropouts, `moe.capacity_factor`, ...), `moe` as a
      dict (`ModelConfig.replace`).
    ep_size: this run's expert parallelism (default 1: every expert in this process).
    model_config: a model-config JSON for DeepSpeed checkpoints that do not record theirs.
    model_kwargs: the task model's own arguments (`num_labels` for sequence classification).
    Log `report.summary()`: what was loaded, newly initialised and left unused.
    """
    checkpoint = read_checkpoint(Path(source), tag=tag, model_config=model_config)
    cfg = checkpoint.config.replace(**dict(model_overrides or {}))
    if cls.__name__ == checkpoint.architecture == "WideNetForSequenceClassification":
        model_kwargs.setdefault("num_labels", checkpoint.num_labels)
    model = cls(cfg, ep_size=ep_size, **model_kwargs)
    return model, load_into(model, checkpoint, str(source))


def find_tokenizer_files(source: Path, tag: str | None = None) -> tuple[Path, ...]:
    """The one tokenizer locator for weights: an exported folder's own files; for a DeepSpeed checkpoint, the
    files its run folder carries (pretraining copies them there), else the data folder its marker names."""
    source = Path(source)
    if is_folder(source):
        return tokenizer_files_in(source)
    tag_dir = resolve_tag_dir(source, tag, require_marker=False)
    meta = read_meta(tag_dir, required=False) or {}
    candidates = [tag_dir.parent.parent, tag_dir.parent] + [Path(meta[k]) for k in ("tokenizer_dir", "data_dir")
                                                            if meta.get(k)]
    return next((found for folder in candidates if (found := tokenizer_files_in(folder))), ())
