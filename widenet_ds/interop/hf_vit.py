"""HF ViT <- widenet-ds: the explicit weight map, and `convert to-hf-vit`.

A dense, unshared image model with a CLS head, no pre-logits layer, one branch and the standard residual has
the structure of Hugging Face's `ViTForImageClassification` (vit-b16, vit-l16, vit-tiny with head = "cls",
paraformer-*-1x12 with residual = "standard"). `convert to-hf-vit` writes such a model as an HF folder
(`config.json` + `model.safetensors`, what `ViTForImageClassification.from_pretrained` loads) from a portable
folder or a DeepSpeed checkpoint of an image run; anything else is refused, naming what HF's ViT cannot hold.

Every key is accounted for: the map names each of our keys' HF key, and a key it does not name is an error.
The CLS token is ours when learned, else our constant zero (HF's is always a parameter). transformers is not
needed to write the folder, only to read it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from widenet_ds.checkpoint.source import CheckpointSource
from widenet_ds.errors import CheckpointError, ConfigError
from widenet_ds.fs.atomic import atomic_folder
from widenet_ds.portable.format import PortableCheckpoint, write_safetensors
from widenet_ds.vision.config import VisionConfig

HF_CONFIG = "config.json"
HF_WEIGHTS = "model.safetensors"
ARCHITECTURE = "ViTWideNetForImageClassification"


def check_hf_convertible(cfg: VisionConfig) -> None:
    problems = []
    if cfg.is_moe or cfg.share_attention or cfg.share_ffn or cfg.share_layernorm:
        problems.append("HF's ViT has one unshared dense FFN per block (use vit-b16 / vit-l16 / vit-tiny)")
    if cfg.head != "cls":
        problems.append("HF's classifier reads the CLS token (head = 'cls'), not the average of all tokens")
    if cfg.pre_logits:
        problems.append("ViTForImageClassification has no pre-logits layer (pre_logits = false)")
    if cfg.num_branches > 1:
        problems.append("HF's ViT is one sequential stack (num_branches = 1; `widenet-ds branches compress "
                        "--branches 1` keeps branch 1)")
    if cfg.residual != "standard":
        problems.append("HF's ViT adds the sub-layer to the raw residual stream (residual = 'standard', not "
                        "ParaFormer's LN(x) + f(LN(x)))")
    if problems:
        raise ConfigError(f"this model cannot become a Hugging Face ViTForImageClassification: {'; '.join(problems)}. "
                          f"Export it with `widenet-ds convert to-hf` (an HF folder with its own model code).")


def hf_vit_config(cfg: VisionConfig) -> dict[str, Any]:
    """The HF `ViTConfig` fields of our config."""
    check_hf_convertible(cfg)
    return {
        "model_type": "vit", "architectures": ["ViTForImageClassification"],
        "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.intermediate_size,
        "hidden_act": "gelu_pytorch_tanh" if cfg.activation == "gelu_new" else "gelu",
        "hidden_dropout_prob": cfg.hidden_dropout, "attention_probs_dropout_prob": cfg.attention_dropout,
        "layer_norm_eps": cfg.layer_norm_eps, "initializer_range": cfg.initializer_range,
        "image_size": cfg.image_size, "patch_size": cfg.patch_size, "num_channels": cfg.num_channels,
        "qkv_bias": cfg.qkv_bias,
        "id2label": {str(i): f"LABEL_{i}" for i in range(cfg.num_classes)},
        "label2id": {f"LABEL_{i}": i for i in range(cfg.num_classes)},
    }


def hf_vit_key_pairs(cfg: VisionConfig) -> list[tuple[str, str]]:
    """(our key, HF ViTForImageClassification's key) of every tensor but the CLS token."""
    pairs = [("embeddings.position", "vit.embeddings.position_embeddings"),
             ("embeddings.projection.weight", "vit.embeddings.patch_embeddings.projection.weight"),
             ("embeddings.projection.bias", "vit.embeddings.patch_embeddings.projection.bias")]
    for leaf in ("weight", "bias"):
        pairs += [(f"encoder.final_norm.{leaf}", f"vit.layernorm.{leaf}"), (f"classifier.{leaf}", f"classifier.{leaf}")]
    for i in range(cfg.num_layers):
        # transformers 5's ViT module names (4.x: encoder.layer.i.attention.attention.query, ...).
        modules = {"layernorm_before": f"attention_norm.{i}", "layernorm_after": f"ffn_norm.{i}",
                   "attention.q_proj": f"attention.{i}.query", "attention.k_proj": f"attention.{i}.key",
                   "attention.v_proj": f"attention.{i}.value", "attention.o_proj": f"attention.{i}.output",
                   "mlp.fc1": f"ffn.{i}.fc_in", "mlp.fc2": f"ffn.{i}.fc_out"}
        for hf_name, our_name in modules.items():
            bias_free = not cfg.qkv_bias and hf_name.endswith(("q_proj", "k_proj", "v_proj"))
            leaves = ("weight",) if bias_free else ("weight", "bias")
            pairs += [(f"encoder.{our_name}.{leaf}", f"vit.layers.{i}.{hf_name}.{leaf}") for leaf in leaves]
    return pairs


def to_hf_vit_state_dict(cfg: VisionConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Our image classifier's state dict -> HF ViTForImageClassification's."""
    check_hf_convertible(cfg)
    pairs = hf_vit_key_pairs(cfg)
    ours = {key for key, _ in pairs} | ({"embeddings.cls"} if cfg.cls_token == "learned" else set())
    missing, unknown = sorted(ours - set(state)), sorted(set(state) - ours)
    if missing or unknown:
        raise CheckpointError(f"the weights do not fit the HF ViT map of this config: missing {missing[:6]}, "
                              f"unknown {unknown[:6]}.")
    out = {theirs: state[key] for key, theirs in pairs}
    out["vit.embeddings.cls_token"] = state.get("embeddings.cls", torch.zeros(1, 1, cfg.hidden_size))
    return out


def to_hf_vit(checkpoint: PortableCheckpoint, source: CheckpointSource, target: Path, *,
              overwrite: bool = False) -> Path:
    """An image checkpoint (read from `source`, a folder or training checkpoint) -> an HF ViTForImageClassification
    folder, atomically."""
    if checkpoint.architecture != ARCHITECTURE:
        raise CheckpointError(f"{source.given} is a {checkpoint.architecture}; the HF ViT export needs a {ARCHITECTURE} "
                              f"(text models: `widenet-ds convert to-albert`).")
    hf_config = hf_vit_config(checkpoint.config)  # refuses what HF's ViT cannot hold
    hf_state = to_hf_vit_state_dict(checkpoint.config, checkpoint.state)
    with atomic_folder(target, overwrite, CheckpointError) as tmp:
        write_safetensors(hf_state, tmp / HF_WEIGHTS, metadata={"format": "pt"})
        (tmp / HF_CONFIG).write_text(json.dumps({**hf_config, "torch_dtype": "float32"}, indent=2) + "\n")
    return Path(target)
