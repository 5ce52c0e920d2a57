"""The portable checkpoint folder: what `widenet-ds convert to-folder` writes and `load_pretrained` reads.

    <folder>/config.json        {"format_version": 2, "architecture": ..., "model": config.to_dict(),
                                 "num_labels": ..., "dtype": ..., "provenance": {...},
                                 "files": size and SHA-256 of every other file (`widenet-ds verify`)}
    <folder>/model.safetensors  our state-dict keys; experts under their GLOBAL index
    <folder>/tokenizer.json, vocab.txt   when known (text models)
    <folder>/README.md          where it came from (source checkpoint, step)

One layout for every architecture (`architectures()`): the text models with a `ModelConfig`, the image
classifier with a `VisionConfig` under "model". Folders of earlier versions are upgraded to this layout by
widenet_ds/formats.py (kind "folder") when their config.json is read.

Experts are stored by global index (the keys a model built with `ep_size=1` has), e.g.
`widenet.encoder.ffn.0.moe.deepspeed_moe.experts.deepspeed_experts.<global>.fc_in.weight` (images:
`encoder.ffn.0...`), the names DeepSpeed's per-expert files also use. `config.json` records, as provenance, the ep_size it was trained
with (`trained_with_ep_size`); any ep_size
loads it: each rank takes the experts `MoEFeedForward.global_expert_indices()` says it holds.

Every load checks key sets and shapes against the config: an unknown, missing or mis-shaped key is an
error naming it. Pretraining heads (MLM, SOP) that a task model does not have are reported as unused,
task heads the folder does not have (or holds in another shape) as newly initialised; the body must always
match exactly.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from widenet_ds.data.tokenizer import TokenizerFiles
from widenet_ds.errors import CheckpointError, ConfigError
from widenet_ds.formats import current, read_json, upgrade, versioned
from widenet_ds.fs.atomic import atomic_folder, set_default_permissions
from widenet_ds.fs.checksums import record_files
from widenet_ds.model.config import EncoderConfig, ModelConfig
from widenet_ds.model.moe import MoEFeedForward
from widenet_ds.model.widenet import (
    WideNetForPreTraining,
    WideNetForQuestionAnswering,
    WideNetForSequenceClassification,
)
from widenet_ds.vision.config import VisionConfig
from widenet_ds.vision.model import ViTWideNetForImageClassification

FOLDER = "folder"  # config.json's kind in widenet_ds/formats.py ("folder_weights": the safetensors metadata)
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
README_FILE = "README.md"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_EXPERTS = ".moe.deepspeed_moe.experts.deepspeed_experts."
# The architecture of a training checkpoint whose marker does not name it: text runs wrote none before the
# image model joined the checkpoint stack (readers that need the exact task model read it off the heads,
# `infer_architecture`).
TEXT_DEFAULT = "WideNetForPreTraining"


# --- architectures ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Architecture:
    """A model class a checkpoint can hold, with the config it is built from.

    body: the key prefixes of the weights every model of its family shares (the encoder and its embeddings);
    the rest are heads, which may differ between a checkpoint and the model it initialises."""

    model: type[nn.Module]
    config: type[EncoderConfig]
    body: tuple[str, ...]
    takes_num_labels: bool = False  # the model's constructor takes num_labels (not in its config)

    @property
    def name(self) -> str:
        return self.model.__name__

    @property
    def tokenized(self) -> bool:
        """A text model: its folders carry the tokenizer its embeddings belong to."""
        return self.config is ModelConfig

    def build(self, cfg: EncoderConfig, num_labels: int | None = None, ep_size: int = 1) -> nn.Module:
        return self.model(cfg, ep_size=ep_size, **({"num_labels": num_labels} if self.takes_num_labels else {}))

    def is_body(self, key: str) -> bool:
        return key.startswith(self.body)


_TEXT_BODY = ("widenet.",)
_ARCHITECTURES = (Architecture(WideNetForPreTraining, ModelConfig, _TEXT_BODY),
                  Architecture(WideNetForSequenceClassification, ModelConfig, _TEXT_BODY, takes_num_labels=True),
                  Architecture(WideNetForQuestionAnswering, ModelConfig, _TEXT_BODY),
                  # the HF ViT mapping is interop/hf_vit.py, beside HF ALBERT's (interop/albert.py)
                  Architecture(ViTWideNetForImageClassification, VisionConfig, ("embeddings.", "encoder.")))


def architectures() -> dict[str, Architecture]:
    return {arch.name: arch for arch in _ARCHITECTURES}


def architecture(name: str, where: str = "the checkpoint") -> Architecture:
    known = architectures()
    if name not in known:
        raise CheckpointError(f"{where} names architecture {name!r}, which widenet-ds does not know; known: "
                              f"{', '.join(known)} (a checkpoint of another program, or of a newer widenet-ds).")
    return known[name]


def infer_architecture(shapes: dict[str, tuple[int, ...]]) -> tuple[str, int | None]:
    """(architecture, num_labels) from the keys of a state dict (checkpoints whose marker does not name it)."""
    if "embeddings.position" in shapes:  # the image classifier's body has no "widenet." prefix
        return "ViTWideNetForImageClassification", None
    if "mlm_head.bias" in shapes:
        return "WideNetForPreTraining", None
    if "classifier.weight" in shapes:
        return "WideNetForSequenceClassification", shapes["classifier.weight"][0]
    if "qa_outputs.weight" in shapes:
        return "WideNetForQuestionAnswering", None
    raise CheckpointError("the weights hold none of the known heads (mlm_head, classifier, qa_outputs) nor an "
                          "image model's patch embedding; they are not a widenet-ds model's.")


def expected_shapes(architecture_name: str, cfg: EncoderConfig,
                    num_labels: int | None = None) -> dict[str, tuple[int, ...]]:
    """Every key (experts by global index) and its shape, from a model built on the meta device."""
    arch = architecture(architecture_name)
    if not isinstance(cfg, arch.config):
        raise CheckpointError(f"{arch.name} is built from a {arch.config.__name__}, not a {type(cfg).__name__}.")
    with torch.device("meta"):  # ep_size 1: every expert, by global index
        model = arch.build(cfg, num_labels)
    return {key: tuple(t.shape) for key, t in model.state_dict().items()}


def check_weights(shapes: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]], where: str) -> None:
    """Refuse any unknown, missing or mis-shaped key, naming them."""
    unknown = sorted(set(shapes) - set(expected))
    missing = sorted(set(expected) - set(shapes))
    wrong = [f"{k}: {tuple(shapes[k])} (weights) vs {expected[k]} (config)" for k in sorted(set(shapes) & set(expected))
             if tuple(shapes[k]) != expected[k]]
    if unknown or missing or wrong:
        parts = []
        if unknown:
            parts.append(f"{len(unknown)} unknown key(s): {', '.join(unknown[:6])}")
        if missing:
            parts.append(f"{len(missing)} missing key(s): {', '.join(missing[:6])}")
        if wrong:
            parts.append(f"{len(wrong)} shape mismatch(es): {'; '.join(wrong[:6])}")
        raise CheckpointError(f"{where}: the weights do not match the model config -- " + "; ".join(parts)
                              + ". Use the config the weights were saved with.")


# --- global <-> local experts -----------------------------------------------------------------------
def global_key_map(model: nn.Module) -> dict[str, str]:
    """model state-dict key -> its key in a folder (local expert index replaced by the global one)."""
    renames: dict[str, str] = {}
    for name, module in model.named_modules():
        if isinstance(module, MoEFeedForward):
            for local, global_index in enumerate(module.global_expert_indices()):
                renames[f"{name}{_EXPERTS}{local}."] = f"{name}{_EXPERTS}{global_index}."
    mapping = {}
    for key in model.state_dict():
        mapping[key] = key
        for local_prefix, global_prefix in renames.items():
            if key.startswith(local_prefix):
                mapping[key] = global_prefix + key[len(local_prefix):]
                break
    return mapping


def is_expert_key(key: str) -> bool:
    return _EXPERTS in key


# --- the portable checkpoint ------------------------------------------------------------------------
@dataclass
class PortableCheckpoint:
    """Full weights (experts by global index), the config they belong to, and where they came from."""

    config: EncoderConfig  # the architecture's config type (ModelConfig, VisionConfig)
    architecture: str
    state: dict[str, Tensor]
    num_labels: int | None = None
    provenance: dict[str, Any] = field(default_factory=dict)

    def check(self, where: str) -> None:
        shapes = {k: tuple(t.shape) for k, t in self.state.items()}
        check_weights(shapes, expected_shapes(self.architecture, self.config, self.num_labels), where)


# --- safetensors ------------------------------------------------------------------------------------
def read_safetensors(path: Path) -> dict[str, Tensor]:
    """A safetensors file; pickles (PyTorch .bin/.pt) and damaged files are refused, never unpickled."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist.")
    with open(path, "rb") as fh:
        head = fh.read(9)
    # safetensors: an 8-byte header length, then the JSON header; pickles start with PROTO (0x80) or a zip's "PK".
    if head[8:9] != b"{" and (head[:1] == b"\x80" or head[:2] == b"PK"):
        raise CheckpointError(f"{path} is a pickle (a PyTorch .bin/.pt file), not safetensors; pickles can run code "
                              f"when loaded and are refused. Re-save the weights as safetensors (transformers: "
                              f"save_pretrained(..., safe_serialization=True)).")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{path} is not a readable safetensors file ({err}); it is truncated or damaged -- "
                              f"copy or convert it again.") from None


def missing_safetensors(folder: Path, wanted: str) -> CheckpointError:
    """The error for a folder without its safetensors weights `wanted`: pickled weights (pytorch_model.bin, .pt)
    are named and refused, never unpickled."""
    pickles = sorted(p.name for p in Path(folder).iterdir() if p.suffix in (".bin", ".pt", ".pth", ".pkl"))
    if not pickles:
        return CheckpointError(f"{folder} has no {wanted}: the folder is incomplete; copy or convert it again.")
    return CheckpointError(f"{folder} has no {wanted} (found {', '.join(pickles)}: pickles are refused, as loading "
                           f"one can run code); re-save the weights as safetensors (transformers: save_pretrained(..., "
                           f"safe_serialization=True)) and convert that.")


def write_safetensors(state: dict[str, Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    from safetensors.torch import save_file

    # safetensors refuses shared storage (tied weights): every tensor gets its own contiguous copy.
    save_file({k: t.detach().to("cpu").clone().contiguous() for k, t in state.items()}, str(path),
              metadata=metadata)
    set_default_permissions(path)  # safetensors writes 0600; exported folders are meant to be shared


# --- save / read ------------------------------------------------------------------------------------
def save_folder(checkpoint: PortableCheckpoint, target: Path, *, dtype: str = "fp32",
                tokenizer: TokenizerFiles = TokenizerFiles(), overwrite: bool = False) -> Path:
    """Write a checked PortableCheckpoint as a folder, atomically."""
    if dtype not in DTYPES:
        raise ConfigError(f"dtype {dtype!r} is not one of {list(DTYPES)}.")
    checkpoint.check(f"weights for {target}")
    config = versioned(FOLDER, {"architecture": checkpoint.architecture, "model": checkpoint.config.to_dict(),
                                "num_labels": checkpoint.num_labels, "dtype": dtype,
                                "experts": "stored by global index; any ep_size dividing num_experts loads them",
                                "provenance": checkpoint.provenance})
    with atomic_folder(target, overwrite, CheckpointError) as tmp:
        state = {k: t.to(DTYPES[dtype]) if t.is_floating_point() else t for k, t in checkpoint.state.items()}
        write_safetensors(state, tmp / WEIGHTS_FILE,
                          metadata={"format": "pt", "widenet_format_version": str(current("folder_weights"))})
        tokenizer.copy_into(tmp)
        (tmp / README_FILE).write_text(_readme(checkpoint, dtype, tokenizer.stored_names))
        config["files"] = record_files(tmp)  # every other file's size and SHA-256 (`widenet-ds verify`)
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return Path(target)


def _readme(checkpoint: PortableCheckpoint, dtype: str, tokenizer_names: list[str]) -> str:
    cfg = checkpoint.config
    trained = checkpoint.provenance.get("trained_with_ep_size")
    experts = (f"{cfg.moe.num_experts} experts (stored by global index"
               + (f"; trained with ep_size {trained}" if trained else "") + ")"
               if cfg.is_moe else "dense FFN")
    image = (f", {cfg.image_size} px images in patches of {cfg.patch_size}, {cfg.num_classes} classes"
             if isinstance(cfg, VisionConfig) else "")
    lines = [f"# {checkpoint.architecture} (widenet-ds checkpoint folder, format {current(FOLDER)})", "",
             f"- written: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
             f"- model: hidden {cfg.hidden_size}, {cfg.num_layers} blocks, {experts}{image}",
             f"- weights: {WEIGHTS_FILE} ({dtype})"]
    if architecture(checkpoint.architecture).tokenized:
        lines.append(f"- tokenizer: {', '.join(tokenizer_names) if tokenizer_names else 'not included'}")
    lines += [f"- {key}: {value}" for key, value in sorted(checkpoint.provenance.items())]
    lines += ["", f"Load with `widenet_ds.portable.weights.load_pretrained({checkpoint.architecture}, folder)` (or "
                  f"with a model whose head differs, which is then newly initialised); see docs/checkpoints.md.", ""]
    return "\n".join(lines)


def is_folder(path: Path) -> bool:
    return (Path(path) / CONFIG_FILE).is_file()


def read_folder_config(folder: Path) -> dict[str, Any]:
    """A folder's config.json in the current layout (`read_folder` checks it fully, with the weights)."""
    config_path = Path(folder) / CONFIG_FILE
    if not config_path.is_file():
        raise CheckpointError(f"{folder} is not a widenet-ds checkpoint folder (no {CONFIG_FILE}); write one with "
                              f"`widenet-ds convert to-folder`.")
    return read_json(FOLDER, config_path)


def stored_model_config(config: dict[str, Any], where: Path) -> dict[str, Any]:
    """The model config a folder's config.json (as `read_folder_config` returns it) holds."""
    stored = config.get("model")
    if not isinstance(stored, dict):
        raise CheckpointError(f"{where} has no 'model' entry; the folder is damaged, convert it again.")
    return stored


def read_folder(folder: Path, config: dict[str, Any] | None = None) -> PortableCheckpoint:
    """The folder's weights and config (`config`: its config.json as already read, not opened again)."""
    folder = Path(folder)
    config_path = folder / CONFIG_FILE
    config = read_folder_config(folder) if config is None else upgrade(FOLDER, config, config_path)
    if "architecture" not in config:
        raise CheckpointError(f"{config_path} has no 'architecture' entry; the folder is damaged, convert it again.")
    arch = architecture(config["architecture"], str(config_path))
    try:
        model_config = arch.config.from_dict(stored_model_config(config, config_path))
    except ConfigError as err:
        raise CheckpointError(f"{config_path}: {err}") from None
    weights_path = folder / WEIGHTS_FILE
    if not weights_path.is_file():
        raise missing_safetensors(folder, WEIGHTS_FILE)
    checkpoint = PortableCheckpoint(model_config, config["architecture"], read_safetensors(weights_path),
                                    config["num_labels"], dict(config["provenance"]))
    checkpoint.check(f"{folder}: {CONFIG_FILE} vs {WEIGHTS_FILE}")
    return checkpoint



# --- model configs: a checkpoint's against another ---------------------------------------------------
def config_differences(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    """`field: saved -> current` for every differing model-config field (nested ones dotted)."""
    lines = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key, "<absent>"), current.get(key, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            lines += config_differences(a, b, f"{prefix}{key}.")
        elif a != b:
            lines.append(f"{prefix}{key}: {a!r} (checkpoint) vs {b!r} (this run)")
    return lines


def check_explicit_config(recorded: EncoderConfig, explicit: Path, where: str) -> None:
    """An explicit --model-config may only repeat the config a checkpoint records (`where`): a different
    activation or LayerNorm epsilon keeps every shape, so nothing else would notice the weights are misread."""
    given = type(recorded).from_json(explicit)
    diffs = config_differences(recorded.to_dict(), given.to_dict())
    if diffs:
        raise CheckpointError(f"--model-config {explicit} differs from the model config recorded in {where}:\n  "
                              + "\n  ".join(diffs) + "\nThe recorded config is the one the weights were trained "
                              "with; drop --model-config.")


def check_same_model(saved_config: dict[str, Any], model_config: dict[str, Any], where: Path,
                     architecture_name: str | None = None, ignore: tuple[str, ...] = ()) -> None:
    """Refuse a checkpoint of another model config than this run's, naming the differing fields (but the dotted
    fields in `ignore`)."""
    config_type = architecture(architecture_name or TEXT_DEFAULT, str(where)).config
    try:  # a model config's fields added since it was written take their defaults (formats.py, "model_config")
        saved = config_type.from_dict(saved_config).to_dict()
    except ConfigError:
        saved = saved_config  # no longer a valid config: compared as stored, the differences name what changed
    diffs = [d for d in config_differences(saved, model_config) if not d.startswith(tuple(f"{f}:" for f in ignore))]
    if diffs:
        raise CheckpointError(f"checkpoint {where} is of another model config; differing fields:\n  "
                              + "\n  ".join(diffs)
                              + "\nUse the checkpoint's model config, or another --output-dir for a new model.")
