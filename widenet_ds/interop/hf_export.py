"""WideNet models in the Hugging Face format: `widenet-ds convert to-hf` and `from-hf`.

`to-hf` writes any text or image checkpoint (a portable folder or a DeepSpeed run of any ep_size; any sharing,
router form, dispatch or branch layout) as a folder that `transformers` loads with `trust_remote_code=True`:

    config.json                 model_type "widenet" (text) or "vit_widenet" (images), auto_map, every field of
                                our config (hf_template/configuration_widenet.py names them), labels, and
                                "widenet_ds": {architecture, format_version, provenance} for the way back
    model.safetensors           the weights under the HF classes' names (`hf_key_pairs`), experts by global index
    configuration_widenet.py, modeling_widenet.py   the model, self-contained (torch + transformers only)
    tokenizer.json / vocab.txt, tokenizer_config.json, special_tokens_map.json   (text)
    preprocessor_config.json, image_processing_widenet.py                         (images)
    README.md                   the model card: architecture, parameters, data, steps, the run's scores

`from-hf` reads such a folder (also after transformers' save_pretrained, e.g. once finetuned with the Trainer)
back into a portable folder: the same weights, bit for bit. Folders of other architectures are refused by name.

The weight map is explicit: every key of our architecture has one HF key (`hf_key_pairs`), built from the model's
own key list; a key outside it, either way, is an error. Neither direction needs transformers.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from widenet_ds.checkpoint.source import CheckpointSource
from widenet_ds.checkpoint.tags import is_deepspeed_checkpoint
from widenet_ds.data.tokenizer import TokenizerFiles
from widenet_ds.errors import CheckpointError, ConfigError
from widenet_ds.formats import VERSION_KEY, load_json, upgrade, versioned
from widenet_ds.fs.atomic import atomic_folder
from widenet_ds.interop.albert import write_hf_tokenizer_config
from widenet_ds.interop.hf_model_card import model_card
from widenet_ds.interop.hf_vit import check_hf_convertible
from widenet_ds.model.config import ModelConfig, MoEConfig
from widenet_ds.portable.format import (
    PortableCheckpoint,
    architecture,
    architectures,
    expected_shapes,
    missing_safetensors,
    read_safetensors,
    save_folder,
    write_safetensors,
)
from widenet_ds.vision.config import VisionConfig
from widenet_ds.vision.datasets import dataset_class_names

TEMPLATE = Path(__file__).resolve().parent / "hf_template"
MODEL_FILES = ("configuration_widenet.py", "modeling_widenet.py")
IMAGE_PROCESSOR_FILE = "image_processing_widenet.py"
HF_CONFIG = "config.json"
HF_ENTRY = "hf_config"  # the kind of config.json's "widenet_ds" entry in widenet_ds/formats.py
HF_WEIGHTS = "model.safetensors"
HF_INDEX = "model.safetensors.index.json"
PREPROCESSOR_CONFIG = "preprocessor_config.json"
MODEL_TYPES = {"widenet": ModelConfig, "vit_widenet": VisionConfig}

# Each family's classes for transformers' Auto factories. The HF class of a checkpoint bears the name of its
# architecture (format.architectures(): every one of ours has its class in hf_template/modeling_widenet.py).
_TEXT_AUTO = {"AutoConfig": "configuration_widenet.WideNetConfig", "AutoModel": "modeling_widenet.WideNetModel",
              "AutoModelForPreTraining": "modeling_widenet.WideNetForPreTraining",
              "AutoModelForMaskedLM": "modeling_widenet.WideNetForMaskedLM",
              "AutoModelForSequenceClassification": "modeling_widenet.WideNetForSequenceClassification",
              "AutoModelForQuestionAnswering": "modeling_widenet.WideNetForQuestionAnswering"}
_IMAGE_AUTO = {"AutoConfig": "configuration_widenet.ViTWideNetConfig", "AutoModel": "modeling_widenet.ViTWideNetModel",
               "AutoModelForImageClassification": "modeling_widenet.ViTWideNetForImageClassification",
               "AutoImageProcessor": "image_processing_widenet.WideNetImageProcessor"}
_MOE_KEY = re.compile(r"^(?P<ffn>(.*\.)?ffn\.\d+\.)moe\.deepspeed_moe\.(?:gate\.wg\.(?P<router>weight)|"
                      r"experts\.deepspeed_experts\.(?P<expert>\d+\..+))$")


# --- the weight map ---------------------------------------------------------------------------------------
def _hf_key(key: str, image: bool) -> str:
    match = _MOE_KEY.match(key)
    if match:  # DeepSpeed's MoE container -> the HF model's router and experts
        key = match["ffn"] + (f"router.{match['router']}" if match["router"] else f"experts.{match['expert']}")
    if image and key.startswith(("embeddings.", "encoder.")):  # the body sits in the HF base model
        key = "vit_widenet." + key
    return key


def hf_key_pairs(architecture_name: str, cfg: ModelConfig | VisionConfig,
                 num_labels: int | None = None) -> list[tuple[str, str]]:
    """(our key, HF key) for every tensor of the architecture (experts by global index)."""
    image = isinstance(cfg, VisionConfig)
    return [(key, _hf_key(key, image)) for key in expected_shapes(architecture_name, cfg, num_labels)]


# --- the config -------------------------------------------------------------------------------------------
def _labels(checkpoint: PortableCheckpoint) -> dict[str, Any]:
    """id2label / label2id / problem_type for the classifiers' heads: the names the folder records (a finetuned
    text classifier's, from its task: provenance "label_names"; an image classifier's, from its dataset), else
    LABEL_i."""
    cfg, provenance = checkpoint.config, checkpoint.provenance
    if isinstance(cfg, VisionConfig):
        names = dataset_class_names(provenance.get("dataset"))
        count = cfg.num_classes
    elif checkpoint.architecture == "WideNetForSequenceClassification":
        if checkpoint.num_labels == 1:
            return {"id2label": {"0": "score"}, "label2id": {"score": 0}, "problem_type": "regression"}
        names, count = provenance.get("label_names"), checkpoint.num_labels
    else:
        return {}
    if not (isinstance(names, list) and len(names) == count and all(isinstance(n, str) for n in names)):
        names = [f"LABEL_{i}" for i in range(count)]
    return {"id2label": {str(i): name for i, name in enumerate(names)},
            "label2id": {name: i for i, name in enumerate(names)}}


def hf_config(checkpoint: PortableCheckpoint) -> dict[str, Any]:
    """config.json of the HF folder: every field of our config (MoE fields flat, top_k as num_experts_per_tok)."""
    floating = {t.dtype for t in checkpoint.state.values() if t.is_floating_point()}
    dtype = {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(floating.pop(), "float32") \
        if len(floating) == 1 else "float32"  # a folder written with --dtype bf16 / fp16 stays so
    fields = checkpoint.config.to_dict()
    moe = fields.pop("moe")
    moe["num_experts_per_tok"] = moe.pop("top_k")
    image = isinstance(checkpoint.config, VisionConfig)
    return {"model_type": "vit_widenet" if image else "widenet", "architectures": [checkpoint.architecture],
            "auto_map": dict(_IMAGE_AUTO if image else _TEXT_AUTO), **fields, **moe, **_labels(checkpoint),
            "dtype": dtype,
            "widenet_ds": versioned(HF_ENTRY, {"architecture": checkpoint.architecture,
                                               "provenance": checkpoint.provenance})}


def _our_config(hf: dict[str, Any], where: str) -> ModelConfig | VisionConfig:
    """Our config from an HF config dict (fields save_pretrained left out as defaults take our defaults, which
    are the template's: tests/checkpoint/test_hf_export.py checks they agree)."""
    config_type = MODEL_TYPES[hf["model_type"]]
    fields = {f.name: hf[f.name] for f in dataclasses.fields(config_type) if f.name != "moe" and f.name in hf}
    moe = {f.name: hf[f.name] for f in dataclasses.fields(MoEConfig) if f.name != "top_k" and f.name in hf}
    if "num_experts_per_tok" in hf:
        moe["top_k"] = hf["num_experts_per_tok"]
    try:
        return config_type.from_dict({**fields, "moe": moe})
    except ConfigError as err:
        raise CheckpointError(f"{where}: {err}") from None


# --- to-hf ------------------------------------------------------------------------------------------------
def write_hf_folder(checkpoint: PortableCheckpoint, source: CheckpointSource, target: Path, *,
                    tokenizer: TokenizerFiles = TokenizerFiles(), overwrite: bool = False) -> Path:
    """Any checkpoint (read from `source`, a folder or a DeepSpeed run, which the model card looks beside for the
    run) -> an HF folder loadable with trust_remote_code=True, atomically."""
    image = isinstance(checkpoint.config, VisionConfig)
    if not image and not tokenizer:
        raise CheckpointError(f"{source.given} holds a text model but no tokenizer was found with it; pass --tokenizer with "
                              f"the run's tokenizer.json or vocab.txt (pipelines and users need it to make inputs).")
    state = {theirs: checkpoint.state[ours]
             for ours, theirs in hf_key_pairs(checkpoint.architecture, checkpoint.config, checkpoint.num_labels)}
    with atomic_folder(target, overwrite, CheckpointError) as tmp:
        write_safetensors(state, tmp / HF_WEIGHTS, metadata={"format": "pt"})
        (tmp / HF_CONFIG).write_text(json.dumps(hf_config(checkpoint), indent=2) + "\n")
        for name in MODEL_FILES + ((IMAGE_PROCESSOR_FILE,) if image else ()):
            shutil.copyfile(TEMPLATE / name, tmp / name)
        if image:
            (tmp / PREPROCESSOR_CONFIG).write_text(json.dumps(image_processor_config(checkpoint.config), indent=2)
                                                   + "\n")
        else:
            tokenizer.copy_into(tmp)
            write_hf_tokenizer_config(tmp, checkpoint.config.max_position_embeddings)
        (tmp / "README.md").write_text(model_card(checkpoint, source.path, state))
    return Path(target)


def image_processor_config(cfg: VisionConfig) -> dict[str, Any]:
    """Our evaluation preprocessing: resize to image_size (bilinear, antialiased), uint8 -> [-1, 1]."""
    return {"image_processor_type": "WideNetImageProcessor",
            "auto_map": {"AutoImageProcessor": _IMAGE_AUTO["AutoImageProcessor"]},
            "size": cfg.image_size, "num_channels": cfg.num_channels, "do_resize": True, "resample": "bilinear",
            "antialias": True, "rescale_factor": 1 / 255, "image_mean": [0.5] * cfg.num_channels,
            "image_std": [0.5] * cfg.num_channels}


def native_alternative(checkpoint: PortableCheckpoint) -> str | None:
    """The command that writes this model as a class transformers ships (no remote code), when one holds it."""
    cfg = checkpoint.config
    if isinstance(cfg, VisionConfig):
        try:
            check_hf_convertible(cfg)
        except ConfigError:
            return None
        return "to-hf-vit (transformers' own ViTForImageClassification)"
    if checkpoint.architecture == "WideNetForPreTraining" and not cfg.is_moe and cfg.norm_position == "post":
        return "to-albert (transformers' own AlbertForPreTraining)"
    return None


# --- from-hf ----------------------------------------------------------------------------------------------
def read_hf_config(folder: Path) -> dict[str, Any]:
    """config.json of an HF folder written by to-hf (or by save_pretrained of its classes); anything else is
    refused, naming what it is."""
    path = Path(folder) / HF_CONFIG
    if is_deepspeed_checkpoint(folder):
        raise CheckpointError(f"{folder} is a DeepSpeed checkpoint of a training run, not an HF folder: "
                              f"`widenet-ds convert to-hf {folder} OUT` writes an HF folder of it, `convert to-folder` a "
                              f"portable one; trainers read it as it is (--init-from, --resume).")
    if not path.is_file():
        raise CheckpointError(f"{folder} has no {HF_CONFIG}; pass a folder written by `widenet-ds convert to-hf` "
                              f"(or by save_pretrained of a model loaded from one).")
    hf = load_json(path, CheckpointError, "copy the folder again, or write it again (`widenet-ds convert to-hf`)")
    if isinstance(hf, dict) and VERSION_KEY in hf and "architecture" in hf:
        raise CheckpointError(f"{folder} is a widenet-ds checkpoint folder already, not an HF folder: use it as it is "
                              f"(--init-from {folder}, `widenet-ds convert to-hf` for transformers); nothing to "
                              f"convert.")
    model_type = hf.get("model_type") if isinstance(hf, dict) else None
    names = ", ".join(hf.get("architectures") or []) if isinstance(hf, dict) else ""
    if model_type == "albert":
        raise CheckpointError(f"{folder} is an HF ALBERT folder ({names or 'model_type albert'}), not a WideNet "
                              f"written by `convert to-hf`; convert it with `widenet-ds convert from-albert`.")
    if model_type not in MODEL_TYPES:
        raise CheckpointError(f"{folder} holds model_type {model_type!r}" + (f" ({names})" if names else "")
                              + f", not a WideNet written by `widenet-ds convert to-hf` (model_type "
                              f"{' or '.join(repr(t) for t in MODEL_TYPES)}); widenet-ds reads only those.")
    return hf


def from_hf(source: Path, target: Path, *, overwrite: bool = False) -> Path:
    """An HF WideNet folder -> a portable folder with the same weights (bit for bit) and config."""
    source = Path(source)
    hf = read_hf_config(source)
    hf_class = (hf.get("architectures") or [None])[0]
    if hf_class not in architectures():
        base = {"WideNetForMaskedLM": "AutoModelForPreTraining (its SOP head is then newly initialised)"}
        raise CheckpointError(f"{source} holds a {hf_class}, which is none of widenet-ds's architectures "
                              f"({', '.join(architectures())})"
                              + (f"; load it with {base[hf_class]}, save_pretrained, and convert that"
                                 if hf_class in base else "") + ".")
    ours = hf_class
    cfg = _our_config(hf, str(source / HF_CONFIG))
    if not isinstance(cfg, architecture(ours).config):
        raise CheckpointError(f"{source}: {hf_class} does not belong to model_type {hf['model_type']!r}.")
    num_labels, label_names = None, {}
    if ours == "WideNetForSequenceClassification":  # transformers' default: 2 labels when id2label is not saved
        num_labels = len(hf["id2label"]) if hf.get("id2label") else 2
        if num_labels > 1 and isinstance(hf.get("id2label"), dict):  # its head's names, kept for a later to-hf
            label_names = {"label_names": [str(hf["id2label"].get(str(i), f"LABEL_{i}")) for i in range(num_labels)]}
    hf_state = read_hf_weights(source)
    pairs = hf_key_pairs(ours, cfg, num_labels)
    unknown = sorted(set(hf_state) - {theirs for _, theirs in pairs})
    missing = sorted({theirs for _, theirs in pairs} - set(hf_state))
    if unknown or missing:
        raise CheckpointError(f"{source}: the weights do not fit a {hf_class} of its config.json -- "
                              + "; ".join(part for part in (
                                  f"{len(unknown)} unknown key(s): {', '.join(unknown[:6])}" if unknown else "",
                                  f"{len(missing)} missing key(s): {', '.join(missing[:6])}" if missing else "")
                                  if part) + ".")
    state = {ours_key: hf_state[theirs] for ours_key, theirs in pairs}
    saved = upgrade(HF_ENTRY, hf["widenet_ds"], f"{source / HF_CONFIG} ('widenet_ds')") if hf.get("widenet_ds") \
        else {}  # (a config.json that transformers saved without ours has none)
    provenance = {**saved.get("provenance", {}), **label_names, "converted_from_hf": str(source.resolve())}
    checkpoint = PortableCheckpoint(cfg, ours, state, num_labels, provenance)
    dtype = {"bfloat16": "bf16", "float16": "fp16"}.get(str(hf.get("dtype", hf.get("torch_dtype"))), "fp32")
    return save_folder(checkpoint, Path(target), dtype=dtype, tokenizer=TokenizerFiles.in_folder(source),
                       overwrite=overwrite)


def hf_weight_files(folder: Path) -> list[Path]:
    """The safetensors files of an HF folder: model.safetensors, or the shards a model.safetensors.index.json
    names (save_pretrained of large models). A folder of pickled weights only is refused, naming the fix."""
    folder = Path(folder)
    if (folder / HF_WEIGHTS).is_file():
        return [folder / HF_WEIGHTS]
    if not (folder / HF_INDEX).is_file():
        raise missing_safetensors(folder, f"{HF_WEIGHTS} (nor {HF_INDEX})")
    try:
        weight_map = json.loads((folder / HF_INDEX).read_text())["weight_map"]
        return [folder / shard for shard in sorted(set(weight_map.values()))]
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(f"{folder / HF_INDEX} is not a safetensors index ({err!r}); copy the folder again, "
                              f"whole.") from None


def read_hf_weights(folder: Path) -> dict[str, Tensor]:
    """Every tensor of an HF folder's safetensors files (`hf_weight_files`); damaged files are refused, naming them."""
    state: dict[str, Tensor] = {}
    for path in hf_weight_files(folder):
        state.update(read_safetensors(path))
    return state
