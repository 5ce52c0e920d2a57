"""Typed, validated model configuration: the encoder's (`EncoderConfig`), which the text `ModelConfig` here and
the image `VisionConfig` (widenet_ds/vision/config.py) extend, the MoE's, and the text presets.

Every field is checked at construction; errors name the field and the fix. Configs round-trip through
JSON (`to_json` / `from_json`), and unknown keys are refused rather than silently ignored.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Self, get_args

from widenet_ds.errors import ConfigError
from widenet_ds.formats import RUN_SETTINGS, VERSION_KEY, upgrade, versioned
from widenet_ds.fs.atomic import atomic_write_json

MODEL_CONFIG = "model_config"  # its kind in widenet_ds/formats.py

NoisePolicy = Literal["gaussian", "jitter", "rsample", "none"]
CombineWeights = Literal["raw", "renormalize"]
BalanceLoss = Literal["switch", "widenet_tf"]
Dispatch = Literal["deepspeed", "compact", "dropless"]
CapacityRounding = Literal["ceil", "floor"]
Activation = Literal["gelu", "gelu_new"]
NormPosition = Literal["post", "pre"]
Residual = Literal["standard", "normed"]
FFNKind = Literal["moe", "dense"]


def check_choice(obj: Any, name: str, literal: Any) -> None:
    choices = get_args(literal)
    value = getattr(obj, name)
    if value not in choices:
        raise ConfigError(f"{type(obj).__name__}.{name} = {value!r} is not one of {list(choices)}; pick one of those.")


def check_positive(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(f"{type(obj).__name__}.{name} = {value!r} must be a positive number.")


def check_fraction(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
            raise ConfigError(f"{type(obj).__name__}.{name} = {value!r} must be in [0, 1).")


# RUN_SETTINGS: what configs written before widenet-ds 0.2 kept in the model config. They are not part of the
# model: the expert-parallel size is `--ep-size` and activation checkpointing `--activation-checkpointing` of a
# run. A config file given to a run that holds them is refused, naming the flag; the markers and folders of then
# still load (widenet_ds/formats.py moves them out of the stored config).


def dataclass_from_dict(cls: type, data: dict[str, Any], where: str) -> Any:
    """Build a dataclass from a dict, refusing unknown keys with a did-you-mean hint."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(data).__name__}.")
    names = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key in RUN_SETTINGS and key not in names:
            flag = RUN_SETTINGS[key] + ("" if isinstance(data[key], bool) else f" {data[key]}")
            raise ConfigError(f"{where}: {key!r} is a run setting, not part of the model config; remove it and "
                              f"pass {flag} to the training run.")
        if key not in names:
            hint = difflib.get_close_matches(key, names, n=1)
            fix = f" Did you mean {hint[0]!r}?" if hint else f" Known keys: {sorted(names)}."
            raise ConfigError(f"{where}: unknown key {key!r}.{fix}")
    return cls(**data)


def read_config_json(path: str | os.PathLike, what: str, presets: dict) -> dict[str, Any]:
    """A config JSON file's dict, upgraded to the current version; errors name the file and the presets."""
    try:
        with open(path) as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist; pass a JSON file or a preset name "
                          f"({', '.join(presets)}).") from None
    except json.JSONDecodeError as err:
        raise ConfigError(f"{what} {path} is not valid JSON: {err}.") from None
    return upgrade(MODEL_CONFIG, data, f"{what} {path}")


def preset_data(name: str, presets: dict, what: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """A preset's fields with overrides applied (`moe` merged field by field)."""
    if name not in presets:
        hint = difflib.get_close_matches(name, presets, n=1)
        raise ConfigError(f"unknown {what} {name!r}." + (f" Did you mean {hint[0]!r}?" if hint else "")
                          + f" Presets: {', '.join(presets)}.")
    data = presets[name]()
    overrides = dict(overrides)
    moe_overrides = overrides.pop("moe", None) or {}
    data.update(overrides)
    data["moe"] = {**data.get("moe", {}), **moe_overrides}
    return data


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`--set KEY=VALUE` strings (VALUE as JSON, else a plain string; `moe.KEY` for router fields) -> overrides."""
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r} is not KEY=VALUE; e.g. --set num_layers=6 or --set moe.num_experts=8.")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        if key.startswith("moe."):
            overrides.setdefault("moe", {})[key[4:]] = value
        else:
            overrides[key] = value
    return overrides


@dataclass
class MoEConfig:
    """The shared Mixture-of-Experts layer: router, capacity, balance loss (expert parallelism is a run
    setting, `--ep-size`, not part of the model).

    Defaults are the paper's NLP setting (K = 2, C = 1.2, lambda = 0.01, Gaussian logit noise with std
    1/E, raw top-k probabilities as combine weights). DeepSpeed's own choices are options: `noise =
    "jitter" | "rsample"`, `second_expert_sampling = True` (Gumbel sampling of the 2nd expert, training
    only here) and `combine_weights = "renormalize"` (top-k weights rescaled to sum to 1).

    `dispatch`: "compact" (default) makes DeepSpeed's capacity routing decisions (B = ceil(K * C * T / E)
    slots per expert, overflow dropped, the same combine weights and balance loss) and runs only the kept
    routes, sorted by expert: 1.13-1.18x faster on CPU and 17-20 % less memory than "deepspeed", which
    runs DeepSpeed's capacity buffers with their empty slots computed too (2.4 T rows for 2 T routes at K 2,
    C 1.2; the same routing, results equal within float rounding); "dropless" runs every route on exactly
    its tokens (no capacity, nothing dropped, capacity factors and drop_tokens unused). Any ep_size; see
    widenet_ds/model/dropless.py. A checkpoint resumes with the dispatch it was trained with.

    `capacity_rounding`: "ceil" (DeepSpeed's B = ceil(K * C * T / E)) or "floor" (the authors' vision code,
    int(T * C * K // E)).

    `route_padding`: False (default) keeps padding out of the experts: a padding position gets no route, no
    capacity slot, and no share of the balance loss or the routing statistics (widenet_ds/model/routing.py);
    True routes it like a real token, as the paper (and every run before this switch) did. A stored config
    records the field only when true, so configs, markers and folders written before still read and hash the
    same; they load with the masked default (the same weights; only padding's routes change).
    """

    num_experts: int = 4
    top_k: int = 2
    capacity_factor: float = 1.2
    eval_capacity_factor: float = 2.0
    min_capacity: int = 4
    drop_tokens: bool = True
    noise: NoisePolicy = "gaussian"
    second_expert_sampling: bool = False
    combine_weights: CombineWeights = "raw"
    balance_loss: BalanceLoss = "switch"
    balance_loss_weight: float = 0.01
    dispatch: Dispatch = "compact"
    capacity_rounding: CapacityRounding = "ceil"
    route_padding: bool = False

    def __post_init__(self) -> None:
        check_positive(self, "num_experts", "top_k", "capacity_factor", "eval_capacity_factor")
        for name in ("num_experts", "top_k", "min_capacity"):
            if not isinstance(getattr(self, name), int) or isinstance(getattr(self, name), bool):
                raise ConfigError(f"MoEConfig.{name} = {getattr(self, name)!r} must be an integer.")
        if self.top_k > self.num_experts:
            raise ConfigError(
                f"MoEConfig.top_k = {self.top_k} exceeds num_experts = {self.num_experts}; "
                f"lower top_k or add experts.")
        if self.min_capacity < 0:
            raise ConfigError(f"MoEConfig.min_capacity = {self.min_capacity} must be >= 0.")
        if not isinstance(self.route_padding, bool):
            raise ConfigError(f"MoEConfig.route_padding = {self.route_padding!r} must be true or false.")
        if self.balance_loss_weight < 0:
            raise ConfigError(f"MoEConfig.balance_loss_weight = {self.balance_loss_weight} must be >= 0.")
        for name, literal in (("noise", NoisePolicy), ("combine_weights", CombineWeights),
                              ("balance_loss", BalanceLoss), ("dispatch", Dispatch),
                              ("capacity_rounding", CapacityRounding)):
            check_choice(self, name, literal)
        if self.noise == "rsample" and self.top_k != 1:
            raise ConfigError(
                "MoEConfig.noise = 'rsample' is DeepSpeed's top-1 policy; with top_k = 2 use "
                "second_expert_sampling = true for DeepSpeed's Gumbel 2nd choice, or noise = 'gaussian'.")


@dataclass
class EncoderConfig:
    """The WideNet encoder both model families are built on: its dimensions, dropouts, LayerNorm epsilon, init
    range, activation, sharing flags, FFN kind, ParaFormer branches, residual form, q/k/v biases and the MoE,
    with their checks. `ModelConfig` (text) and `VisionConfig` (images) extend it with their embeddings and heads.

    Inheritance, not composition: a stored config is one flat JSON object (written since 0.1, and hashed into
    every checkpoint marker), and every caller reads `cfg.hidden_size`; a subclass keeps both as they are, and
    its fields, defaults and checks sit beside the shared ones. A subclass may give a shared field another
    default (images: dropout 0.1, eps 1e-6, tanh-GELU, as the authors' ViT) by declaring it again.

    Sharing flags express the paper's Table 3 ablations without code forks: `share_attention`, `share_ffn`
    (one MoE or FFN for all blocks), `share_layernorm` (ALBERT) and `ffn = "dense"` (a plain FFN, not a
    one-expert MoE).

    ParaFormer's layout: `num_branches` N > 1 arranges the num_layers blocks as N parallel branches of
    num_layers / N blocks (branch b holds blocks b*L..b*L+L-1), all reading the embedded input; their output
    sequences are summed (see widenet_ds/model/branches.py). `residual = "normed"` is its sub-layer form
    LN(x) + f(LN(x)) (pre-LN only); "standard" is x + f(LN(x)) (pre-LN) or LN(x + f(x)) (post-LN).
    `qkv_bias = false` drops the query/key/value biases (ParaFormer's and lucidrains' ViT).

    A subclass says where the LayerNorms sit: `norm_position`, a field of text configs and a constant ("pre")
    of image configs; and may let blocks share one routing decision (`blocks_per_routing_group`).
    """

    NAME: ClassVar[str]         # "model config": how errors name a config file of the subclass
    PRESET_NAME: ClassVar[str]  # "preset": how errors name one of its presets

    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    activation: Activation = "gelu"
    share_attention: bool = True
    share_ffn: bool = True
    share_layernorm: bool = False
    ffn: FFNKind = "moe"
    num_branches: int = 1
    residual: Residual = "standard"
    qkv_bias: bool = True
    moe: MoEConfig = field(default_factory=MoEConfig)

    def __post_init__(self) -> None:
        name = type(self).__name__
        if isinstance(self.moe, dict):
            self.moe = dataclass_from_dict(MoEConfig, self.moe, f"{name}.moe")
        check_positive(self, "hidden_size", "num_layers", "num_heads", "intermediate_size", "layer_norm_eps",
                        "initializer_range")
        check_fraction(self, "hidden_dropout", "attention_dropout")
        for field_name, literal in (("activation", Activation), ("ffn", FFNKind), ("residual", Residual)):
            check_choice(self, field_name, literal)
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"{name}.hidden_size = {self.hidden_size} is not divisible by num_heads = {self.num_heads}; "
                f"choose num_heads dividing hidden_size (e.g. {self.hidden_size // 64 or 1} heads of 64).")
        if self.share_layernorm and not (self.share_attention and self.share_ffn):
            raise ConfigError(
                f"{name}.share_layernorm = true with unshared attention/FFN has no counterpart in the paper or "
                f"ALBERT; share attention and FFN too, or set share_layernorm = false.")
        if self.residual == "normed" and self.norm_position != "pre":
            raise ConfigError(f"{name}.residual = 'normed' (ParaFormer's LN(x) + f(LN(x))) is a pre-LN form; set "
                              f"norm_position = 'pre' or residual = 'standard'.")
        self._check_branches()

    def _check_branches(self) -> None:
        name = type(self).__name__
        check_positive(self, "num_branches")
        if self.num_branches == 1:
            return
        if self.num_layers % self.num_branches:
            raise ConfigError(f"{name}.num_branches = {self.num_branches} must divide num_layers = "
                              f"{self.num_layers} (branches of equal depth); e.g. 12 layers as 3 x 4 or 4 x 3.")
        if self.share_layernorm:
            raise ConfigError(f"{name}.num_branches > 1 with share_layernorm = true: every branch would compute "
                              f"the same function; keep LayerNorms per block (share_layernorm = false).")
        if self.is_moe and not self.share_ffn:
            raise ConfigError(f"{name}.num_branches > 1 supports one shared MoE (WideNet) or dense FFNs; an MoE "
                              f"per block is not supported: set share_ffn = true or ffn = 'dense'.")

    # -- derived -------------------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def is_moe(self) -> bool:
        return self.ffn == "moe"

    @property
    def layers_per_branch(self) -> int:
        return self.num_layers // self.num_branches

    @property
    def experts_width(self) -> int:
        """The experts' hidden width."""
        return self.intermediate_size

    @property
    def blocks_per_routing_group(self) -> int:
        """Consecutive blocks that reuse the routing of the group's first block (1: every MoE block routes)."""
        return 1

    @property
    def moe_block_indices(self) -> list[int]:
        """Blocks whose FFN is an MoE."""
        return list(range(self.num_layers)) if self.is_moe else []

    @property
    def num_moe_layers(self) -> int:
        """MoE modules the model holds: one when shared, else one per MoE block (DeepSpeed files the experts
        of its L-th as layer_<L>_expert_<g>)."""
        if not self.is_moe:
            return 0
        return 1 if self.share_ffn else len(self.moe_block_indices)

    @property
    def routing_blocks(self) -> list[int]:
        """Block index of each routing call of a forward: every MoE block, or the first of each routing group;
        with branches the depth in the branch (one call per depth over the tokens of all active branches)."""
        if not self.is_moe:
            return []
        if self.num_branches > 1:
            return list(range(self.layers_per_branch))
        return [i for i in self.moe_block_indices if i % self.blocks_per_routing_group == 0]

    @property
    def num_routing_calls(self) -> int:
        return len(self.routing_blocks)

    # -- presets and JSON files -----------------------------------------------------------------------
    @classmethod
    def presets(cls) -> dict[str, Any]:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        # Written only when set: configs from before the switch hash and compare the same (MoEConfig).
        if not data["moe"]["route_padding"]:
            del data["moe"]["route_padding"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        data = dict(data)
        data.pop(VERSION_KEY, None)
        return dataclass_from_dict(cls, data, cls.__name__)

    def replace(self, **changes: Any) -> Self:
        """A copy with fields changed; `moe` as a dict of MoE fields to change."""
        data = self.to_dict()
        data["moe"] = {**data["moe"], **(changes.pop("moe", None) or {})}
        return type(self).from_dict({**data, **changes})

    def to_json(self, path: str | os.PathLike) -> None:
        atomic_write_json(path, versioned(MODEL_CONFIG, self.to_dict()), sort_keys=True)

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> Self:
        return cls.from_dict(read_config_json(path, cls.NAME, cls.presets()))

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> Self:
        return cls.from_dict(preset_data(name, cls.presets(), cls.PRESET_NAME, overrides))

    @classmethod
    def load(cls, name_or_path: str, **overrides: Any) -> Self:
        """A preset name or a JSON file, plus field overrides (`moe` as a dict)."""
        if name_or_path in cls.presets():
            return cls.from_preset(name_or_path, **overrides)
        return cls.from_json(name_or_path).replace(**overrides)


@dataclass
class ModelConfig(EncoderConfig):
    """A WideNet / ALBERT / BERT-with-factorized-embeddings text model: the encoder (EncoderConfig), ALBERT's
    factorized embeddings and the heads' dropout.

    `norm_position`: "post" (BERT, ALBERT) or "pre" (the paper's eq. 6-8, with a final LayerNorm).
    `routing_groups` G splits the blocks into G groups that reuse the routing computed at each group's first
    block (G = num_layers routes every block).
    """

    NAME: ClassVar[str] = "model config"
    PRESET_NAME: ClassVar[str] = "preset"

    vocab_size: int = 30000
    embedding_size: int = 128
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    classifier_dropout: float = 0.1
    norm_position: NormPosition = "post"
    routing_groups: int | None = None

    def __post_init__(self) -> None:
        check_positive(self, "vocab_size", "embedding_size", "max_position_embeddings", "type_vocab_size")
        check_fraction(self, "classifier_dropout")
        check_choice(self, "norm_position", NormPosition)
        if self.routing_groups is None:
            self.routing_groups = self.num_layers
        super().__post_init__()
        if self.is_moe:
            if not 1 <= self.routing_groups <= self.num_layers or self.num_layers % self.routing_groups:
                raise ConfigError(
                    f"ModelConfig.routing_groups = {self.routing_groups} must divide num_layers = "
                    f"{self.num_layers}; use a divisor (num_layers routes at every block).")
            if self.routing_groups != self.num_layers and not self.share_ffn:
                raise ConfigError(
                    "ModelConfig.routing_groups < num_layers reuses one router's decisions across blocks, "
                    "which needs share_ffn = true; set share_ffn = true or routing_groups = num_layers.")
            if self.routing_groups != self.num_layers and self.num_branches > 1:
                raise ConfigError("ModelConfig.routing_groups cannot be combined with num_branches > 1 (each depth "
                                  "routes once over all branches); leave routing_groups unset.")

    @property
    def blocks_per_routing_group(self) -> int:
        return self.num_layers // self.routing_groups if self.is_moe else 1

    @classmethod
    def presets(cls) -> dict[str, Any]:
        return PRESETS


# --- presets ----------------------------------------------------------------------------------------
# Base dimensions are the paper's NLP setting (= ALBERT-base): H 768, 12 heads, 12 blocks, F 3072,
# factorized embeddings E 128, V 30000. All base presets are post-LN, like ALBERT/BERT.

_BASE = dict(vocab_size=30000, embedding_size=128, hidden_size=768, num_layers=12, num_heads=12,
             intermediate_size=3072, max_position_embeddings=512)
_TINY = dict(vocab_size=30000, embedding_size=64, hidden_size=128, num_layers=4, num_heads=2,
             intermediate_size=512, max_position_embeddings=512)
_SMALL = dict(vocab_size=30000, embedding_size=128, hidden_size=256, num_layers=6, num_heads=4,
              intermediate_size=1024, max_position_embeddings=512)

_ALBERT = dict(share_attention=True, share_ffn=True, share_layernorm=True, ffn="dense")
_BERT = dict(share_attention=False, share_ffn=False, share_layernorm=False, ffn="dense",
             hidden_dropout=0.1, attention_dropout=0.1)
_WIDENET = dict(share_attention=True, share_ffn=True, share_layernorm=False, ffn="moe")


def _preset(dims: dict, kind: dict, experts: int | None = None):
    def build() -> dict[str, Any]:
        data = {**dims, **kind}
        data["moe"] = {"num_experts": experts} if experts else {}
        return data
    return build


PRESETS = {
    "albert-base": _preset(_BASE, _ALBERT),
    "bert-base-factorized": _preset(_BASE, _BERT),
    "widenet-base-e4": _preset(_BASE, _WIDENET, 4),
    "widenet-base-e8": _preset(_BASE, _WIDENET, 8),
    "widenet-base-e16": _preset(_BASE, _WIDENET, 16),
    # CPU presets for demos and tests: same structure, small dimensions.
    "albert-small": _preset(_SMALL, _ALBERT),
    "widenet-small-e4": _preset(_SMALL, _WIDENET, 4),
    "albert-tiny": _preset(_TINY, _ALBERT),
    "bert-tiny-factorized": _preset(_TINY, _BERT),
    "widenet-tiny-e4": _preset(_TINY, _WIDENET, 4),
}
BASE_PRESETS = ("albert-base", "bert-base-factorized", "widenet-base-e4", "widenet-base-e8", "widenet-base-e16")


def cli(argv: list[str]) -> int:
    """`widenet-ds model-config`: write a model-config JSON from a preset (or a JSON) plus overrides."""
    import argparse

    parser = argparse.ArgumentParser(prog="widenet-ds model-config", description=cli.__doc__)
    parser.add_argument("base", help=f"a preset ({', '.join(PRESETS)}) or a model-config JSON")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a field; moe fields as moe.KEY (e.g. moe.num_experts=8); VALUE is JSON "
                             "(numbers, true/false) or a plain string; repeatable")
    parser.add_argument("--output", required=True, help="the JSON file to write")
    args = parser.parse_args(argv)
    cfg = ModelConfig.load(args.base, **parse_overrides(args.set))
    cfg.to_json(args.output)
    print(f"wrote {args.output}")
    return 0
