"""HF ALBERT <-> widenet-ds: the explicit weight map, and `convert to-albert` / `from-albert`.

The weight map: The explicit weight map between our dense (MoE off) models and HF `AlbertForPreTraining`.

ALBERT expresses sharing with `num_hidden_groups` G (layer i uses group i * G // D) and
`inner_group_num` 1. G = 1 is full ALBERT sharing, LayerNorms included. Any other sharing of ours
(WideNet's individual LayerNorms with shared attention/FFN, or nothing shared = BERT with factorized
embeddings) maps to G = D with the shared tensors repeated in every group.

Every key is accounted for: an unknown or missing key is an error naming it, never a partial result.

`convert to-albert` / `from-albert`: dense models <-> HF `AlbertForPreTraining` folders, and
"upcycling" an ALBERT checkpoint into a WideNet.

The weight map (first half of this file) serves export, import and the parity tests.
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
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from widenet_ds.checkpoint.source import CheckpointSource
from widenet_ds.data.tokenizer import TokenizerFiles
from widenet_ds.errors import CheckpointError, ConfigError
from widenet_ds.fs.atomic import atomic_folder
from widenet_ds.model.config import ModelConfig
from widenet_ds.portable.format import (
    PortableCheckpoint,
    missing_safetensors,
    read_safetensors,
    save_folder,
    write_safetensors,
)

_HF_LAYER = "albert.encoder.albert_layer_groups.{g}.albert_layers.0."
# HF keys that are tied copies of other tensors (written on export, checked on import).
_TIED = {"predictions.decoder.weight": "albert.embeddings.word_embeddings.weight",
         "predictions.decoder.bias": "predictions.bias"}
_IGNORED_HF = ("albert.embeddings.position_ids",)


def _check_exportable(cfg: ModelConfig) -> None:
    if cfg.is_moe:
        raise CheckpointError(
            "this model has a Mixture-of-Experts FFN (ffn = 'moe'); HF ALBERT has one dense FFN per layer, so "
            "it cannot hold the experts. Export MoE models with `widenet-ds convert to-hf` (an HF folder with its own "
            "model code, for transformers' Auto classes) or `widenet-ds convert to-folder` instead.")
    if cfg.norm_position != "post":
        raise CheckpointError("ALBERT is post-LN; a pre-LN model (norm_position = 'pre') has no ALBERT layout. "
                              "Export it with `widenet-ds convert to-hf` or `widenet-ds convert to-folder`.")


def num_hidden_groups(cfg: ModelConfig) -> int:
    fully_shared = cfg.share_attention and cfg.share_ffn and cfg.share_layernorm
    return 1 if fully_shared else cfg.num_layers


def albert_key_pairs(cfg: ModelConfig) -> list[tuple[str, str]]:
    """(our key, HF key) for every HF tensor; a shared key of ours appears once per HF group."""
    _check_exportable(cfg)
    pairs = [
        ("widenet.embeddings.word.weight", "albert.embeddings.word_embeddings.weight"),
        ("widenet.embeddings.position.weight", "albert.embeddings.position_embeddings.weight"),
        ("widenet.embeddings.token_type.weight", "albert.embeddings.token_type_embeddings.weight"),
        ("widenet.embeddings.norm.weight", "albert.embeddings.LayerNorm.weight"),
        ("widenet.embeddings.norm.bias", "albert.embeddings.LayerNorm.bias"),
        ("widenet.embeddings.projection.weight", "albert.encoder.embedding_hidden_mapping_in.weight"),
        ("widenet.embeddings.projection.bias", "albert.encoder.embedding_hidden_mapping_in.bias"),
        ("widenet.pooler.weight", "albert.pooler.weight"),
        ("widenet.pooler.bias", "albert.pooler.bias"),
        ("mlm_head.bias", "predictions.bias"),
        ("mlm_head.dense.weight", "predictions.dense.weight"),
        ("mlm_head.dense.bias", "predictions.dense.bias"),
        ("mlm_head.norm.weight", "predictions.LayerNorm.weight"),
        ("mlm_head.norm.bias", "predictions.LayerNorm.bias"),
        ("sop_head.weight", "sop_classifier.classifier.weight"),
        ("sop_head.bias", "sop_classifier.classifier.bias"),
    ]
    for g in range(num_hidden_groups(cfg)):
        hf = _HF_LAYER.format(g=g)
        att = 0 if cfg.share_attention else g
        ffn = 0 if cfg.share_ffn else g
        norm = 0 if cfg.share_layernorm else g
        for ours, theirs in (("query", "query"), ("key", "key"), ("value", "value"), ("output", "dense")):
            for kind in ("weight", "bias"):
                pairs.append((f"widenet.encoder.attention.{att}.{ours}.{kind}", f"{hf}attention.{theirs}.{kind}"))
        for ours, theirs in (("fc_in", "ffn"), ("fc_out", "ffn_output")):
            for kind in ("weight", "bias"):
                pairs.append((f"widenet.encoder.ffn.{ffn}.{ours}.{kind}", f"{hf}{theirs}.{kind}"))
        for kind in ("weight", "bias"):
            pairs.append((f"widenet.encoder.attention_norm.{norm}.{kind}", f"{hf}attention.LayerNorm.{kind}"))
            pairs.append((f"widenet.encoder.ffn_norm.{norm}.{kind}", f"{hf}full_layer_layer_norm.{kind}"))
    return pairs


def albert_config(cfg: ModelConfig) -> dict[str, Any]:
    """The HF `AlbertConfig` fields of our config."""
    _check_exportable(cfg)
    return {
        "model_type": "albert", "architectures": ["AlbertForPreTraining"],
        "vocab_size": cfg.vocab_size, "embedding_size": cfg.embedding_size, "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.intermediate_size, "max_position_embeddings": cfg.max_position_embeddings,
        "type_vocab_size": cfg.type_vocab_size, "num_hidden_groups": num_hidden_groups(cfg), "inner_group_num": 1,
        "hidden_act": cfg.activation, "hidden_dropout_prob": cfg.hidden_dropout,
        "attention_probs_dropout_prob": cfg.attention_dropout, "classifier_dropout_prob": cfg.classifier_dropout,
        "layer_norm_eps": cfg.layer_norm_eps, "initializer_range": cfg.initializer_range,
    }


def to_albert_state_dict(state: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    """Our `WideNetForPreTraining` state dict -> HF `AlbertForPreTraining` state dict."""
    pairs = albert_key_pairs(cfg)
    expected = {ours for ours, _ in pairs}
    unknown = sorted(set(state) - expected)
    missing = sorted(expected - set(state))
    if unknown or missing:
        raise CheckpointError(f"cannot map to ALBERT: unknown keys {unknown[:5]}, missing keys {missing[:5]} "
                              f"(config and weights disagree; check the model config).")
    out = {theirs: state[ours].detach().clone().contiguous() for ours, theirs in pairs}
    for tied, source in _TIED.items():
        out[tied] = out[source]
    return out


def config_from_albert(hf_config: dict[str, Any], hf_state: dict[str, Tensor]) -> ModelConfig:
    """Our config for an ALBERT checkpoint; sharing inferred from G and from repeated tensors."""
    if hf_config.get("inner_group_num", 1) != 1:
        raise CheckpointError(f"inner_group_num = {hf_config['inner_group_num']} has no WideNet counterpart "
                              f"(one attention + FFN per group); only inner_group_num = 1 converts.")
    layers, groups_ = hf_config["num_hidden_layers"], hf_config.get("num_hidden_groups", 1)
    if groups_ not in (1, layers):
        raise CheckpointError(f"num_hidden_groups = {groups_} (neither 1 nor num_hidden_layers = {layers}) shares "
                              f"blocks in groups, which our sharing flags cannot express.")
    if hf_config.get("hidden_act", "gelu_new") not in ("gelu", "gelu_new"):
        raise CheckpointError(f"hidden_act = {hf_config['hidden_act']!r} is not supported; use gelu or gelu_new.")

    def repeated(*suffixes: str) -> bool:
        first = _HF_LAYER.format(g=0)
        return all(torch.equal(hf_state[first + s], hf_state[_HF_LAYER.format(g=g) + s])
                   for g in range(groups_) for s in suffixes)

    attention = [f"attention.{n}.{k}" for n in ("query", "key", "value", "dense") for k in ("weight", "bias")]
    ffn = [f"{n}.{k}" for n in ("ffn", "ffn_output") for k in ("weight", "bias")]
    shared_all = groups_ == 1
    return ModelConfig(
        vocab_size=hf_config["vocab_size"], embedding_size=hf_config["embedding_size"],
        hidden_size=hf_config["hidden_size"], num_layers=layers, num_heads=hf_config["num_attention_heads"],
        intermediate_size=hf_config["intermediate_size"],
        max_position_embeddings=hf_config["max_position_embeddings"],
        type_vocab_size=hf_config.get("type_vocab_size", 2),
        hidden_dropout=hf_config.get("hidden_dropout_prob", 0.0),
        attention_dropout=hf_config.get("attention_probs_dropout_prob", 0.0),
        classifier_dropout=hf_config.get("classifier_dropout_prob", 0.1),
        layer_norm_eps=hf_config.get("layer_norm_eps", 1e-12),
        initializer_range=hf_config.get("initializer_range", 0.02),
        activation=hf_config.get("hidden_act", "gelu_new"), norm_position="post", ffn="dense",
        share_attention=shared_all or repeated(*attention), share_ffn=shared_all or repeated(*ffn),
        share_layernorm=shared_all)


def from_albert_state_dict(hf_state: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    """HF `AlbertForPreTraining` state dict -> ours, for the config `config_from_albert` gives."""
    pairs = albert_key_pairs(cfg)
    hf_keys = {k for k in hf_state if k not in _IGNORED_HF}
    expected = {theirs for _, theirs in pairs} | set(_TIED)
    unknown = sorted(hf_keys - expected)
    missing = sorted(expected - hf_keys - set(_TIED))
    if unknown or missing:
        raise CheckpointError(f"not an AlbertForPreTraining checkpoint of this shape: unknown keys {unknown[:5]}, "
                              f"missing keys {missing[:5]}.")
    for tied, source in _TIED.items():
        if tied in hf_state and not torch.equal(hf_state[tied], hf_state[source]):
            raise CheckpointError(f"{tied} differs from {source}; ALBERT ties them, so this checkpoint was "
                                  f"modified after tying and cannot be converted faithfully.")
    out: dict[str, Tensor] = {}
    for ours, theirs in pairs:
        tensor = hf_state[theirs].detach().clone()
        if ours in out and not torch.equal(out[ours], tensor):
            raise CheckpointError(f"{theirs} differs from the other groups' copy of shared {ours}; "
                                  f"the config's sharing flags do not match the checkpoint.")
        out[ours] = tensor
    return out


# --- conversion of folders -----------------------------------------------------------------------------
HF_CONFIG = "config.json"
HF_WEIGHTS = "model.safetensors"


def to_albert(checkpoint: PortableCheckpoint, source: CheckpointSource, target: Path, *,
              tokenizer: TokenizerFiles = TokenizerFiles(), overwrite: bool = False) -> Path:
    """A dense pretraining checkpoint (read from `source`) -> an HF AlbertForPreTraining folder, atomically."""
    if checkpoint.architecture != "WideNetForPreTraining":
        raise CheckpointError(f"{source.given} is a {checkpoint.architecture}; the ALBERT export writes the pretraining "
                              f"layout (AlbertForPreTraining) and needs a WideNetForPreTraining checkpoint.")
    hf_config = albert_config(checkpoint.config)  # refuses MoE and pre-LN models, naming to-folder instead
    hf_state = to_albert_state_dict(checkpoint.state, checkpoint.config)
    with atomic_folder(target, overwrite, CheckpointError) as tmp:
        write_safetensors(hf_state, tmp / HF_WEIGHTS, metadata={"format": "pt"})
        (tmp / HF_CONFIG).write_text(json.dumps({**hf_config, "torch_dtype": "float32"}, indent=2) + "\n")
        tokenizer.copy_into(tmp)
        if tokenizer:
            write_hf_tokenizer_config(tmp, checkpoint.config.max_position_embeddings)
    return Path(target)


def write_hf_tokenizer_config(folder: Path, max_length: int) -> None:
    """Our tokenizer is BERT's uncased WordPiece: without this file `AutoTokenizer` follows config.json's
    model_type, to ALBERT's SentencePiece AlbertTokenizer (to-albert) or to none (to-hf), and fails to load it."""
    specials = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                "mask_token": "[MASK]"}
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "BertTokenizerFast", "do_lower_case": True, "strip_accents": None,
         "tokenize_chinese_chars": True, "model_max_length": max_length, **specials}, indent=2) + "\n")
    (folder / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")


def read_albert_folder(folder: Path) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """(HF config with AlbertConfig's defaults filled in, state dict) of an HF ALBERT folder."""
    folder = Path(folder)
    if not (folder / HF_CONFIG).is_file():
        raise CheckpointError(f"{folder} has no {HF_CONFIG}; pass a folder written by transformers' save_pretrained.")
    if not (folder / HF_WEIGHTS).is_file():
        raise missing_safetensors(folder, HF_WEIGHTS)
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
    return save_folder(checkpoint, target, tokenizer=TokenizerFiles.in_folder(source), overwrite=overwrite)


def upcycle(cfg: ModelConfig, state: dict[str, Tensor], num_experts: int, noise: float,
            seed: int) -> tuple[ModelConfig, dict[str, Tensor]]:
    """A dense shared-FFN state dict -> a WideNet (shared MoE, individual LayerNorms) state dict."""
    if not (cfg.share_attention and cfg.share_ffn):
        raise CheckpointError("upcycling needs an ALBERT checkpoint with shared attention and FFN (WideNet shares one "
                              "MoE over all blocks); this one has a separate FFN per layer.")
    if num_experts < 2 or noise < 0:
        raise ConfigError(f"--upcycle-experts {num_experts} must be >= 2 and --upcycle-noise {noise} >= 0.")
    data = cfg.to_dict()
    data.update(ffn="moe", share_layernorm=False, moe={**data["moe"], "num_experts": num_experts})
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
