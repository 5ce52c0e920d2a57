"""`convert to-albert` / `from-albert`: dense models <-> HF `AlbertForPreTraining` folders, and
"upcycling" an ALBERT checkpoint into a WideNet.

The weight map is widenet_ds.albert_weights (one map for export, import and the parity tests).
An HF folder here is `config.json` + `model.safetensors`, what `AlbertForPreTraining.from_pretrained`
loads; PyTorch `.bin` pickles are refused.

Upcycling (`from-albert --upcycle-experts E`): WideNet shares attention and one MoE over all blocks,
each block with its own LayerNorms. Copied: embeddings, attention, pooler, MLM and SOP heads, and the
LayerNorms (ALBERT's shared pair is copied into every block). Every expert starts as ALBERT's FFN plus
Gaussian noise of std `noise` x (std of that weight matrix), biases exact, so the experts can diverge.
New: the router, N(0, initializer_range), seeded.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from widenet_ds.albert_weights import albert_config, config_from_albert, from_albert_state_dict, to_albert_state_dict
from widenet_ds.checkpoint_folder import (PortableCheckpoint, atomic_folder, read_checkpoint, read_safetensors,
                                          write_safetensors)
from widenet_ds.config import ModelConfig
from widenet_ds.errors import CheckpointError, ConfigError

HF_CONFIG = "config.json"
HF_WEIGHTS = "model.safetensors"
_TOKENIZER_NAMES = ("tokenizer.json", "vocab.txt")


def to_albert(source: Path, target: Path, *, tag: str | None = None, model_config: Path | None = None,
              tokenizer_files: tuple[Path, ...] = (), overwrite: bool = False) -> Path:
    checkpoint = read_checkpoint(Path(source), tag=tag, model_config=model_config)
    if checkpoint.architecture != "WideNetForPreTraining":
        raise CheckpointError(f"{source} is a {checkpoint.architecture}; the ALBERT export writes the pretraining "
                              f"layout (AlbertForPreTraining) and needs a WideNetForPreTraining checkpoint.")
    hf_config = albert_config(checkpoint.config)  # refuses MoE and pre-LN models, naming to-folder instead
    hf_state = to_albert_state_dict(checkpoint.state, checkpoint.config)
    with atomic_folder(target, overwrite) as tmp:
        write_safetensors(hf_state, tmp / HF_WEIGHTS, metadata={"format": "pt"})
        (tmp / HF_CONFIG).write_text(json.dumps({**hf_config, "torch_dtype": "float32"}, indent=2) + "\n")
        for path in tokenizer_files:
            shutil.copyfile(path, tmp / Path(path).name)
    return Path(target)


def read_albert_folder(folder: Path) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """(HF config with AlbertConfig's defaults filled in, state dict) of an HF ALBERT folder."""
    folder = Path(folder)
    if not (folder / HF_CONFIG).is_file():
        raise CheckpointError(f"{folder} has no {HF_CONFIG}; pass a folder written by transformers' save_pretrained.")
    if not (folder / HF_WEIGHTS).is_file():
        pickles = sorted(p.name for p in folder.glob("*.bin"))
        raise CheckpointError(f"{folder} has no {HF_WEIGHTS}" + (f" (only {', '.join(pickles)}: pickles are refused)"
                              if pickles else "") + "; re-save it with save_pretrained(..., safe_serialization=True).")
    hf_config = json.loads((folder / HF_CONFIG).read_text())
    if hf_config.get("model_type", "albert") != "albert":
        raise CheckpointError(f"{folder} holds a {hf_config['model_type']!r} model, not ALBERT.")
    import transformers  # its defaults fill the keys save_pretrained leaves out

    hf_config = {**transformers.AlbertConfig().to_dict(), **hf_config}
    return hf_config, read_safetensors(folder / HF_WEIGHTS)


def from_albert(source: Path, target: Path, *, upcycle_experts: int | None = None, noise: float = 0.01,
                seed: int = 0, overwrite: bool = False) -> Path:
    hf_config, hf_state = read_albert_folder(source)
    cfg = config_from_albert(hf_config, hf_state)
    state = from_albert_state_dict(hf_state, cfg)
    provenance: dict[str, Any] = {"source": str(Path(source).resolve()), "conversion": "from-albert (weights exact)"}
    if upcycle_experts is not None:
        cfg, state = upcycle(cfg, state, upcycle_experts, noise, seed)
        provenance["conversion"] = (f"from-albert, upcycled to {upcycle_experts} experts: attention, embeddings, "
                                    f"LayerNorms and heads copied; experts = ALBERT FFN + N(0, ({noise} x weight std)^2) "
                                    f"noise; router new, N(0, {cfg.initializer_range}), seed {seed}")
    checkpoint = PortableCheckpoint(cfg, "WideNetForPreTraining", state, provenance=provenance)
    tokenizers = tuple(Path(source) / n for n in _TOKENIZER_NAMES if (Path(source) / n).is_file())
    from widenet_ds.checkpoint_folder import save_folder
    return save_folder(checkpoint, target, tokenizer_files=tokenizers, overwrite=overwrite)


def upcycle(cfg: ModelConfig, state: dict[str, Tensor], num_experts: int, noise: float,
            seed: int) -> tuple[ModelConfig, dict[str, Tensor]]:
    """A dense shared-FFN state dict -> a WideNet (shared MoE, individual LayerNorms) state dict."""
    if not (cfg.share_attention and cfg.share_ffn):
        raise CheckpointError("upcycling needs an ALBERT checkpoint with shared attention and FFN (WideNet shares one "
                              "MoE over all blocks); this one has a separate FFN per layer.")
    if num_experts < 2 or noise < 0:
        raise ConfigError(f"--upcycle-experts {num_experts} must be >= 2 and --upcycle-noise {noise} >= 0.")
    data = cfg.to_dict()
    data.update(ffn="moe", share_layernorm=False, moe={**data["moe"], "num_experts": num_experts, "ep_size": 1})
    widenet = ModelConfig.from_dict(data)
    generator = torch.Generator().manual_seed(seed)
    out: dict[str, Tensor] = {}
    for key, tensor in state.items():
        if key.startswith(("widenet.encoder.attention_norm.", "widenet.encoder.ffn_norm.")):
            kind, _, rest = key.rpartition(".0.")
            if not cfg.share_layernorm:
                out[key] = tensor.clone()
            else:
                for block in range(cfg.num_layers):
                    out[f"{kind}.{block}.{rest}"] = tensor.clone()
        elif key.startswith("widenet.encoder.ffn.0."):
            part = key[len("widenet.encoder.ffn.0."):]          # fc_in.weight, fc_out.bias, ...
            for expert in range(num_experts):
                copy = tensor.clone()
                if part.endswith("weight") and noise > 0:
                    copy += torch.randn(tensor.shape, generator=generator) * (noise * tensor.std())
                out[f"widenet.encoder.ffn.0.moe.deepspeed_moe.experts.deepspeed_experts.{expert}.{part}"] = copy
        else:
            out[key] = tensor.clone()
    router = torch.randn(num_experts, cfg.hidden_size, generator=generator) * cfg.initializer_range
    out["widenet.encoder.ffn.0.moe.deepspeed_moe.gate.wg.weight"] = router
    return widenet, out
