"""Vision checkpoints out of DeepSpeed: the portable folder, and Hugging Face `ViTForImageClassification`.

`to_folder` consolidates a training checkpoint (any ep_size and world size, ZeRO 0-2; experts from their
per-expert files, stored by global index) into the portable folder layout of widenet_ds/checkpoint_folder.py
(`config.json` + `model.safetensors` + README.md), with the vision config under "vision_model".
`load_folder` builds the model for any ep_size and loads it. `to_hf_vit` converts a dense, unshared ViT
with a CLS head and no pre-logits layer (the structure of HF's ViT) to `ViTForImageClassification`.

    python -m widenet_ds.vision.export to-folder runs/vit/checkpoints runs/vit/model
    python -m widenet_ds.vision.export to-hf runs/vit/model runs/vit/hf
    python -m widenet_ds.vision.export compress runs/pf/model runs/pf/model-k2 --branches 2
    python -m widenet_ds.vision.export expand runs/pf/model runs/pf/model-m4 --branches 4 --seed 0
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from widenet_ds.atomic import atomic_folder
from widenet_ds.checkpoint.branches import check_keep, compress, expand, expanded_config
from widenet_ds.checkpoint.deepspeed import expert_file, load_torch_file
from widenet_ds.checkpoint.format import (CONFIG_FILE, README_FILE, WEIGHTS_FILE, global_key_map, read_safetensors,
                                          write_safetensors)
from widenet_ds.checkpoint.training import MODEL_STATES, read_meta, resolve_tag_dir
from widenet_ds.errors import CheckpointError, ConfigError, exit_status
from widenet_ds.vision.config import VisionConfig
from widenet_ds.vision.model import ViTWideNetForImageClassification

ARCHITECTURE = "ViTWideNetForImageClassification"
FORMAT_VERSION = 1


def read_training_checkpoint(source: Path, tag: str | None = None) -> tuple[VisionConfig, dict[str, Tensor], dict]:
    """(config, full fp32 weights with experts by global index, provenance) of a vision training checkpoint."""
    tag_dir = resolve_tag_dir(Path(source), tag)
    meta = read_meta(tag_dir, required=False)
    if not meta or meta.get("architecture") != ARCHITECTURE:
        raise CheckpointError(f"{tag_dir} is not a checkpoint of vision/run_classify.py (its widenet_checkpoint.json "
                              f"does not name {ARCHITECTURE}); NLP checkpoints convert with `widenet-ds convert`.")
    cfg = VisionConfig.from_dict(meta["model_config"])
    states = load_torch_file(tag_dir / MODEL_STATES)
    state = dict(states["module"])
    num_moe_layers = len(cfg.moe_block_indices) if not cfg.share_ffn else int(cfg.is_moe)
    for layer in range(num_moe_layers):
        for expert in range(cfg.moe.num_experts):
            path = expert_file(tag_dir, layer, expert)
            if not path.is_file():
                raise CheckpointError(f"{tag_dir} lacks {path.name}; the checkpoint is incomplete (copy the whole tag "
                                      f"folder).")
            state.update(load_torch_file(path))
    state = {k: t.float() if t.is_floating_point() else t for k, t in state.items()}
    provenance = {"source": str(tag_dir.resolve()), "step": meta.get("step"), "ep_size": meta.get("ep_size"),
                  "world_size": meta.get("world_size"), "dataset": meta.get("dataset")}
    return cfg, state, provenance


def save_folder(cfg: VisionConfig, state: dict[str, Tensor], target: Path, provenance: dict[str, Any] | None = None,
                overwrite: bool = False) -> Path:
    expected = build_global_state_shapes(cfg)
    got = {k: tuple(t.shape) for k, t in state.items()}
    if got != expected:
        missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
        wrong = sorted(k for k in set(got) & set(expected) if got[k] != expected[k])
        raise CheckpointError(f"weights do not fit {ARCHITECTURE} of this config: missing {missing[:5]}, unexpected "
                              f"{extra[:5]}, wrong shapes {wrong[:5]}.")
    config = {"format_version": FORMAT_VERSION, "architecture": ARCHITECTURE, "vision_model": cfg.to_dict(),
              "experts": "stored by global index; any ep_size dividing num_experts loads them",
              "provenance": provenance or {}}
    with atomic_folder(Path(target), overwrite, error=CheckpointError) as tmp:
        write_safetensors(state, tmp / WEIGHTS_FILE, metadata={"format": "pt", "widenet_format_version": "1"})
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        (tmp / README_FILE).write_text(
            f"# {ARCHITECTURE} (widenet-ds vision folder)\n\n- image {cfg.image_size}px, patch {cfg.patch_size}, "
            f"{cfg.num_classes} classes, hidden {cfg.hidden_size}, {cfg.num_layers} blocks, ffn {cfg.ffn}\n\n"
            f"Load with `widenet_ds.vision.export.load_folder(folder)`; see docs/vision.md.\n")
    return Path(target)


def build_global_state_shapes(cfg: VisionConfig) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        model = ViTWideNetForImageClassification(cfg)
    return {key: tuple(t.shape) for key, t in model.state_dict().items()}


def read_folder(folder: Path) -> tuple[VisionConfig, dict[str, Tensor]]:
    folder = Path(folder)
    if not (folder / CONFIG_FILE).is_file():
        raise CheckpointError(f"{folder} is not a widenet-ds vision folder (no {CONFIG_FILE}); write one with "
                              f"`python -m widenet_ds.vision.export to-folder`.")
    config = json.loads((folder / CONFIG_FILE).read_text())
    if config.get("architecture") != ARCHITECTURE:
        raise CheckpointError(f"{folder} holds a {config.get('architecture')}, not a {ARCHITECTURE}.")
    return VisionConfig.from_dict(config["vision_model"]), read_safetensors(folder / WEIGHTS_FILE)


def load_folder(folder: Path, ep_size: int = 1) -> ViTWideNetForImageClassification:
    """The model of a vision folder with this rank's experts (ep_size > 1 needs the process groups)."""
    cfg, state = read_folder(folder)
    model = ViTWideNetForImageClassification(cfg, ep_size=ep_size)
    mapping = global_key_map(model)  # local key -> global key
    model.load_state_dict({local: state[global_key] for local, global_key in mapping.items()})
    return model


def to_folder(source: Path, target: Path, tag: str | None = None, overwrite: bool = False) -> Path:
    cfg, state, provenance = read_training_checkpoint(source, tag)
    return save_folder(cfg, state, target, provenance, overwrite)


# --- ParaFormer branches: compress to the first k, expand to m (widenet_ds/checkpoint/branches.py) ---------
def _stored_config(folder: Path) -> dict[str, Any]:
    """config.json of a vision folder, read before its weights (so that a bad --branches fails at once)."""
    path = Path(folder) / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{folder} is not a widenet-ds vision folder (no {CONFIG_FILE}); write one with "
                              f"`python -m widenet_ds.vision.export to-folder`.")
    stored = json.loads(path.read_text())
    if not isinstance(stored, dict) or stored.get("architecture") != ARCHITECTURE:
        raise CheckpointError(f"{folder} holds no {ARCHITECTURE} (text folders: `widenet-ds branches`).")
    return stored


def fresh_state(cfg: VisionConfig, seed: int) -> dict[str, Tensor]:
    """A newly initialised model's global state dict (ep_size 1), seeded without touching the caller's RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return ViTWideNetForImageClassification(cfg).state_dict()


def compress_folder(source: Path, target: Path, k: int, overwrite: bool = False) -> tuple[Path, VisionConfig]:
    """A folder of the source's first k branches: it computes what the source computes with branches=k."""
    stored = _stored_config(source)
    check_keep(stored["vision_model"], k)
    cfg, state = read_folder(source)
    config, kept = compress(cfg.to_dict(), state, k)
    new_cfg = VisionConfig.from_dict(config)
    provenance = {**stored.get("provenance", {}), "compressed_from": str(Path(source).resolve()),
                  "branches": f"the first {k} of {cfg.num_branches} branches"}
    return save_folder(new_cfg, kept, target, provenance, overwrite), new_cfg


def expand_folder(source: Path, target: Path, m: int, seed: int = 0,
                  overwrite: bool = False) -> tuple[Path, VisionConfig, list[str]]:
    """A complete folder with m branches: the source's weights, the new branches freshly initialised."""
    stored = _stored_config(source)
    expanded_config(stored["vision_model"], m)  # checks m before the weights are read
    cfg, state = read_folder(source)
    new_cfg = VisionConfig.from_dict(expanded_config(cfg.to_dict(), m))
    expansion = expand(cfg.to_dict(), state, m, fresh_state(new_cfg, seed))
    provenance = {**stored.get("provenance", {}), "expanded_from": str(Path(source).resolve()),
                  "branches": f"{cfg.num_branches} trained + {m - cfg.num_branches} new (seed {seed})"}
    return save_folder(new_cfg, expansion.state, target, provenance, overwrite), new_cfg, expansion.new_keys


# --- Hugging Face ViT --------------------------------------------------------------------------------
def check_hf_convertible(cfg: VisionConfig) -> None:
    problems = []
    if cfg.is_moe or cfg.share_attention or cfg.share_ffn or cfg.share_layernorm:
        problems.append("HF's ViT has one unshared dense FFN per block (use vit-b16 / vit-l16 / vit-tiny)")
    if cfg.head != "cls":
        problems.append("HF's classifier reads the CLS token (head = 'cls'), not the average of all tokens")
    if cfg.pre_logits:
        problems.append("ViTForImageClassification has no pre-logits layer (pre_logits = false)")
    if cfg.num_branches > 1:
        problems.append("HF's ViT is one sequential stack (num_branches = 1; `compress --branches 1` keeps branch 1)")
    if cfg.residual != "standard":
        problems.append("HF's ViT adds the sub-layer to the raw residual stream (residual = 'standard', not ParaFormer's "
                        "LN(x) + f(LN(x)))")
    if problems:
        raise ConfigError(f"this model cannot become a Hugging Face ViTForImageClassification: {'; '.join(problems)}.")


def hf_config(cfg: VisionConfig):
    from transformers import ViTConfig  # heavy optional package, only the conversion needs it

    check_hf_convertible(cfg)
    return ViTConfig(hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                     intermediate_size=cfg.intermediate_size,
                     hidden_act="gelu_pytorch_tanh" if cfg.activation == "gelu_new" else "gelu",
                     hidden_dropout_prob=cfg.hidden_dropout, attention_probs_dropout_prob=cfg.attention_dropout,
                     layer_norm_eps=cfg.layer_norm_eps, image_size=cfg.image_size, patch_size=cfg.patch_size,
                     num_channels=cfg.num_channels, qkv_bias=cfg.qkv_bias, num_labels=cfg.num_classes)


def hf_state_dict(cfg: VisionConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Our keys -> HF ViTForImageClassification's. The CLS token is ours when learned, else our constant zero."""
    out = {"vit.embeddings.cls_token": state.get("embeddings.cls", torch.zeros(1, 1, cfg.hidden_size)),
           "vit.embeddings.position_embeddings": state["embeddings.position"],
           "vit.embeddings.patch_embeddings.projection.weight": state["embeddings.projection.weight"],
           "vit.embeddings.patch_embeddings.projection.bias": state["embeddings.projection.bias"],
           "vit.layernorm.weight": state["encoder.final_norm.weight"],
           "vit.layernorm.bias": state["encoder.final_norm.bias"],
           "classifier.weight": state["classifier.weight"], "classifier.bias": state["classifier.bias"]}
    for i in range(cfg.num_layers):
        # transformers 5's ViT module names (4.x: encoder.layer.i.attention.attention.query, ...).
        pairs = {"layernorm_before": f"attention_norm.{i}", "layernorm_after": f"ffn_norm.{i}",
                 "attention.q_proj": f"attention.{i}.query", "attention.k_proj": f"attention.{i}.key",
                 "attention.v_proj": f"attention.{i}.value", "attention.o_proj": f"attention.{i}.output",
                 "mlp.fc1": f"ffn.{i}.fc_in", "mlp.fc2": f"ffn.{i}.fc_out"}
        for hf_name, our_name in pairs.items():
            for leaf in ("weight", "bias"):
                if f"encoder.{our_name}.{leaf}" in state:  # no q/k/v biases when qkv_bias = false
                    out[f"vit.layers.{i}.{hf_name}.{leaf}"] = state[f"encoder.{our_name}.{leaf}"]
    return out


def to_hf_vit(cfg: VisionConfig, state: dict[str, Tensor]):
    """A `ViTForImageClassification` holding these weights (eval mode)."""
    from transformers import ViTForImageClassification  # heavy optional package

    model = ViTForImageClassification(hf_config(cfg))
    missing, unexpected = model.load_state_dict(hf_state_dict(cfg, state), strict=False)
    if missing or unexpected:
        raise CheckpointError(f"HF ViT weight map incomplete: missing {missing}, unexpected {unexpected}.")
    return model.eval()


# --- command line ------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m widenet_ds.vision.export", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    folder = sub.add_parser("to-folder", help="a training checkpoint -> a portable folder")
    folder.add_argument("source", type=Path, help="a run's output dir, its checkpoints/ or a tag folder")
    folder.add_argument("target", type=Path)
    folder.add_argument("--tag", default=None)
    folder.add_argument("--overwrite", action="store_true")
    hf = sub.add_parser("to-hf", help="a portable folder of a dense ViT -> a Hugging Face ViTForImageClassification")
    hf.add_argument("source", type=Path)
    hf.add_argument("target", type=Path)
    for name, help_, what in (("compress", "a folder of a ParaFormer -> a folder of its first K branches",
                               "K: branches to keep (1..N)"),
                              ("expand", "a folder of a ParaFormer -> one with M branches (the new ones fresh)",
                               "M: the new number of branches (> N)")):
        branches = sub.add_parser(name, help=help_)
        branches.add_argument("source", type=Path)
        branches.add_argument("target", type=Path)
        branches.add_argument("--branches", type=int, required=True, help=what)
        if name == "expand":
            branches.add_argument("--seed", type=int, default=0, help="seed of the new branches' initialisation")
        branches.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    return exit_status(parser.prog, lambda: _command(args))


def _command(args: argparse.Namespace) -> None:
    if args.command == "to-folder":
        print(f"wrote {to_folder(args.source, args.target, args.tag, args.overwrite)}")
    elif args.command == "compress":
        out, cfg = compress_folder(args.source, args.target, args.branches, args.overwrite)
        print(f"wrote {out}: {cfg.num_branches} branch(es) x {cfg.layers_per_branch} layers")
    elif args.command == "expand":
        out, cfg, new_keys = expand_folder(args.source, args.target, args.branches, args.seed, args.overwrite)
        print(f"wrote {out}: {cfg.num_branches} branches x {cfg.layers_per_branch} layers ({len(new_keys)} new "
              f"tensors, seed {args.seed}); continue training with run_classify.py --init-from {out} "
              f"--set num_branches={cfg.num_branches} --set num_layers={cfg.num_layers}")
    else:
        cfg, state = read_folder(args.source)
        to_hf_vit(cfg, state).save_pretrained(str(args.target))
        print(f"wrote {args.target}")

if __name__ == "__main__":
    sys.exit(main())
