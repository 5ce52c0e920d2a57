"""`widenet-ds convert to-hf` / `from-hf` through transformers' own Auto classes (trust_remote_code).

Our models with random weights go through the real converter into HF folders, which `AutoModelFor...` load (no
missing or unexpected key): eval outputs equal ours (<= 1e-5; the same drops) for every sharing form, router form,
dispatch, routing groups, ParaFormer branches and ViT-MoE; training-mode routing with the same RNG gives the same
loss; the template's configs hold every field of ours; the image processor is our loader's preprocessing; the round
trip is bit-identical; bad inputs get one clear error each. tests/integration/test_hf_fresh_venv.py does the same
on real runs in a virtualenv with transformers alone.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

transformers = pytest.importorskip("transformers")

from widenet_ds.checkpoint.source import CONVERT, CheckpointSource  # noqa: E402
from widenet_ds.cli import main as widenet_ds  # noqa: E402
from widenet_ds.data.tokenizer import TokenizerFiles, load_tokenizer  # noqa: E402
from widenet_ds.errors import CheckpointError  # noqa: E402
from widenet_ds.interop.hf_export import HF_INDEX, from_hf, hf_config, hf_key_pairs, write_hf_folder  # noqa: E402
from widenet_ds.interop.hf_template import configuration_widenet  # noqa: E402
from widenet_ds.model.config import ModelConfig, MoEConfig  # noqa: E402
from widenet_ds.model.widenet import (  # noqa: E402
    WideNetForPreTraining,
    WideNetForQuestionAnswering,
    WideNetForSequenceClassification,
)
from widenet_ds.portable.format import PortableCheckpoint, read_folder, save_folder  # noqa: E402
from widenet_ds.vision.augment import normalize  # noqa: E402
from widenet_ds.vision.config import VisionConfig  # noqa: E402
from widenet_ds.vision.datasets import _array_source  # noqa: E402
from widenet_ds.vision.loader import _Images  # noqa: E402
from widenet_ds.vision.model import ViTWideNetForImageClassification  # noqa: E402

pytestmark = pytest.mark.usefixtures("dist")
DIMS = dict(vocab_size=120, embedding_size=16, hidden_size=32, num_layers=4, num_heads=4, intermediate_size=48,
            max_position_embeddings=40)
# Every form of the text model the config can hold; eval capacity factors below 2 so that eval drops routes.
TEXT_CASES = {
    "widenet": dict(moe={"eval_capacity_factor": 0.5}),
    "renormalized-tf-loss-floor": dict(moe={"combine_weights": "renormalize", "balance_loss": "widenet_tf",
                                            "capacity_rounding": "floor", "eval_capacity_factor": 0.7,
                                            "min_capacity": 0}),
    "pre-ln-routing-groups": dict(norm_position="pre", routing_groups=2, activation="gelu_new",
                                  moe={"eval_capacity_factor": 0.6}),
    "moe-per-block": dict(share_ffn=False, share_attention=False, moe={"eval_capacity_factor": 0.8, "num_experts": 3}),
    "top1-no-dropping": dict(moe={"top_k": 1, "drop_tokens": False}),
    "branches": dict(num_branches=2, moe={"eval_capacity_factor": 0.8}),
    "route-padding": dict(moe={"eval_capacity_factor": 0.5, "route_padding": True}),  # the paper-literal routing
    "albert-dense": dict(ffn="dense", share_layernorm=True),
    "bert-dense": dict(ffn="dense", share_attention=False, share_ffn=False),
}
IMAGE_CASES = {
    "widenet-vit-digits": ("widenet-vit-digits", {}),  # the authors' router: floor capacity 1.2 in eval, drops
    "vit-moe": ("widenet-vit-digits", dict(share_ffn=False, share_attention=False, moe_blocks=2, head="cls",
                                           expert_intermediate_size=96, pre_logits=True)),
    "widenet-paraformer": ("widenet-paraformer-tiny-3x4", {}),  # branches, shared MoE, LN(x) + f(LN(x)), learned CLS
    "paraformer-dense": ("paraformer-tiny-3x4", {}),
    "vit-dense": ("vit-digits", {}),
}


def randomised(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every tensor random (biases, LayerNorms and routers too), so a swapped or dropped weight would show."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2 + (1.0 if "norm.weight" in name or
                                                                  "norm.0.weight" in name else 0.0))
    if hasattr(model, "ensure_process_groups"):
        model.ensure_process_groups()
    return model.eval()


def vocab_file(folder: Path, size: int) -> Path:
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(size - 5)]
    (folder / "vocab.txt").write_text("".join(w + "\n" for w in words))
    return folder / "vocab.txt"


def opened(folder: Path) -> CheckpointSource:
    return CheckpointSource.open(folder, "source", purpose=CONVERT)


def export(tmp_path: Path, name: str, checkpoint: PortableCheckpoint) -> Path:
    """Through the real folder and converter; a folder name unique to this process (transformers caches the model
    code per folder name)."""
    source = save_folder(checkpoint, tmp_path / f"ours-{name}")
    tokenizer = TokenizerFiles() if isinstance(checkpoint.config, VisionConfig) else \
        TokenizerFiles((vocab_file(tmp_path, checkpoint.config.vocab_size),))
    return write_hf_folder(checkpoint, opened(source), tmp_path / f"hf_{name}_{os.getpid()}", tokenizer=tokenizer)


def load(auto: str, folder: Path, **kwargs):
    model, info = getattr(transformers, auto).from_pretrained(folder, trust_remote_code=True,
                                                               output_loading_info=True, **kwargs)
    return model.eval(), info


def text_inputs(cfg: ModelConfig, seed: int = 2):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (3, 24), generator=gen)
    types = torch.zeros_like(ids)
    types[:, 12:] = 1
    mask = torch.ones_like(ids)
    mask[1, 17:] = 0
    return ids, types, mask


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a.float() - b.float()).abs().max().item()


# --- the config -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ours, theirs", [(ModelConfig, configuration_widenet.WideNetConfig),
                                          (VisionConfig, configuration_widenet.ViTWideNetConfig)])
def test_the_hf_config_holds_every_field_of_ours_with_our_defaults(ours, theirs):
    hf_fields = {f.name: f.default for f in dataclasses.fields(theirs)}
    expected = {f.name: f.default for f in dataclasses.fields(ours) if f.name != "moe"}
    expected |= {("num_experts_per_tok" if f.name == "top_k" else f.name): f.default
                 for f in dataclasses.fields(MoEConfig)}
    assert {name: hf_fields.get(name, "<absent>") for name in expected} == expected


# --- eval parity ------------------------------------------------------------------------------------------
def with_dispatches(cases: dict, dense: set[str], compact: str) -> list[tuple[str, str]]:
    """(case, dispatch): both routing forms (capacity, dropless) of each MoE case, one of a dense case (no
    routing to dispatch), and compact (the capacity routing computed another way) for the `compact` case."""
    return [(case, dispatch) for case in cases for dispatch in ("deepspeed", "dropless")
            if case not in dense or dispatch == "deepspeed"] + [(compact, "compact")]


@pytest.mark.parametrize("case, dispatch", with_dispatches(TEXT_CASES, {"albert-dense", "bert-dense"}, "widenet"))
def test_text_models_give_our_eval_outputs(case, dispatch, tmp_path):
    overrides = dict(TEXT_CASES[case])
    overrides["moe"] = {**overrides.get("moe", {}), "dispatch": dispatch}
    cfg = ModelConfig(**DIMS, **overrides)
    ids, types, mask = text_inputs(cfg)

    ours = randomised(WideNetForPreTraining(cfg), seed=1)
    folder = export(tmp_path, f"{case}-{dispatch}-pre",
                    PortableCheckpoint(cfg, "WideNetForPreTraining", ours.state_dict()))
    pretraining, info = load("AutoModelForPreTraining", folder)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    masked_lm, info = load("AutoModelForMaskedLM", folder)
    assert info["unexpected_keys"] == {"sop_head.weight", "sop_head.bias"} and not info["missing_keys"], info
    mlm_labels = torch.where(torch.rand(ids.shape, generator=torch.Generator().manual_seed(3)) < 0.2, ids, -100)
    with torch.no_grad():
        want = ours(ids, types, mask, mlm_labels=mlm_labels, sop_labels=torch.tensor([0, 1, 1]))
        got = pretraining(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=mlm_labels,
                          sentence_order_label=torch.tensor([0, 1, 1]))
        got_mlm = masked_lm(input_ids=ids, attention_mask=mask, token_type_ids=types)
    assert max_diff(got.prediction_logits, want.mlm_logits) <= 1e-5
    assert max_diff(got.sop_logits, want.sop_logits) <= 1e-5
    assert max_diff(got_mlm.logits, want.mlm_logits) <= 1e-5
    assert abs(got.loss.item() - want.loss.item()) <= 1e-5 and abs(got.aux_loss - want.balance_loss) <= 1e-6
    if cfg.is_moe:
        assert torch.equal(got.dropped_fraction, want.routing.dropped_fraction)
        assert torch.equal(got.expert_counts, want.routing.expert_counts)
        drops = dispatch != "dropless" and cfg.moe.drop_tokens
        assert (want.routing.dropped_fraction.sum() > 0) == drops  # the case does exercise dropping

    if case in ("widenet", "branches", "bert-dense"):  # the finetuning heads, on the same body
        for arch, auto, kwargs in (("WideNetForSequenceClassification", "AutoModelForSequenceClassification",
                                    {"num_labels": 3}),
                                   ("WideNetForQuestionAnswering", "AutoModelForQuestionAnswering", {})):
            ours_task = randomised({"WideNetForSequenceClassification": WideNetForSequenceClassification,
                                    "WideNetForQuestionAnswering": WideNetForQuestionAnswering}[arch](cfg, **kwargs),
                                   seed=4)
            folder = export(tmp_path, f"{case}-{dispatch}-{auto}",
                            PortableCheckpoint(cfg, arch, ours_task.state_dict(), kwargs.get("num_labels")))
            theirs, info = load(auto, folder)
            assert not info["missing_keys"] and not info["unexpected_keys"], info
            with torch.no_grad():
                if "num_labels" in kwargs:
                    labels = torch.tensor([0, 2, 1])
                    want, got = ours_task(ids, types, mask, labels=labels), theirs(
                        input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels)
                    assert max_diff(got.logits, want.logits) <= 1e-5
                    assert theirs.config.id2label == {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}
                else:
                    starts, ends = torch.tensor([1, 3, 0]), torch.tensor([2, 5, 0])
                    want, got = ours_task(ids, types, mask, start_positions=starts, end_positions=ends), theirs(
                        input_ids=ids, attention_mask=mask, token_type_ids=types, start_positions=starts,
                        end_positions=ends)
                    assert max_diff(got.start_logits, want.start_logits) <= 1e-5
                    assert max_diff(got.end_logits, want.end_logits) <= 1e-5
            assert abs(got.loss.item() - want.loss.item()) <= 1e-5


@pytest.mark.parametrize("case, dispatch",
                         with_dispatches(IMAGE_CASES, {"paraformer-dense", "vit-dense"}, "widenet-vit-digits"))
def test_image_models_give_our_eval_outputs(case, dispatch, tmp_path):
    preset, overrides = IMAGE_CASES[case]
    cfg = VisionConfig.from_preset(preset, **overrides, moe={"dispatch": dispatch})
    assert cfg.is_moe == (case not in ("paraformer-dense", "vit-dense"))
    torch.manual_seed(0)
    ours = randomised(ViTWideNetForImageClassification(cfg), seed=5)
    folder = export(tmp_path, f"{case}-{dispatch}",
                    PortableCheckpoint(cfg, "ViTWideNetForImageClassification", ours.state_dict()))
    theirs, info = load("AutoModelForImageClassification", folder)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    pixels = torch.rand(4, cfg.num_channels, cfg.image_size, cfg.image_size,
                        generator=torch.Generator().manual_seed(6)) * 2 - 1
    labels = torch.tensor([1, 0, 3, 2])
    with torch.no_grad():
        want = ours(pixels, labels)
        got = theirs(pixel_values=pixels, labels=labels)
    assert max_diff(got.logits, want.logits) <= 1e-5
    assert abs(got.loss.item() - want.loss.item()) <= 1e-5
    if cfg.is_moe:
        assert torch.equal(got.dropped_fraction, want.routing.dropped_fraction)
        assert (want.routing.dropped_fraction.sum() > 0) == (dispatch != "dropless")


# --- training mode ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("moe", [dict(noise="gaussian"), dict(noise="jitter", combine_weights="renormalize"),
                                 dict(noise="rsample", top_k=1), dict(second_expert_sampling=True),
                                 dict(noise="gaussian", dispatch="dropless"), dict(route_padding=True)])
def test_training_mode_routing_draws_the_same_noise_as_ours(moe, tmp_path):
    """Same RNG state, same noise, same routing: the same loss and router gradient (dropouts 0)."""
    cfg = ModelConfig(**DIMS, moe=moe)
    ours = randomised(WideNetForPreTraining(cfg), seed=7).train()
    folder = export(tmp_path, "train-" + "-".join(f"{k}{v}" for k, v in moe.items()),
                    PortableCheckpoint(cfg, "WideNetForPreTraining", ours.state_dict()))
    theirs = load("AutoModelForPreTraining", folder)[0].train()
    ids, types, mask = text_inputs(cfg)
    labels = torch.where(ids % 3 == 0, ids, -100)
    torch.manual_seed(11)
    want = ours(ids, types, mask, mlm_labels=labels)
    torch.manual_seed(11)
    got = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels)
    assert abs(got.loss.item() - want.loss.item()) <= 1e-5
    want.loss.backward()
    got.loss.backward()
    ours_router = ours.widenet.encoder.ffn[0].gate.wg.weight.grad
    assert ours_router.abs().sum() > 0
    assert max_diff(theirs.widenet.encoder.ffn[0].router.weight.grad, ours_router) <= 1e-5


# --- the weight map and the round trip --------------------------------------------------------------------
@pytest.mark.parametrize("arch, cfg", [
    ("WideNetForPreTraining", ModelConfig(**DIMS, share_ffn=False, share_attention=False)),
    ("ViTWideNetForImageClassification", VisionConfig.from_preset("widenet-vit-digits", pre_logits=True)),
    ("ViTWideNetForImageClassification", VisionConfig.from_preset("widenet-paraformer-tiny-3x4"))])
def test_the_weight_map_names_exactly_the_keys_of_the_hf_model(arch, cfg, tmp_path):
    pairs = hf_key_pairs(arch, cfg)
    assert len({theirs for _, theirs in pairs}) == len(pairs)
    model = ViTWideNetForImageClassification(cfg) if "ViT" in arch else WideNetForPreTraining(cfg)
    folder = export(tmp_path, f"keys-{len(pairs)}", PortableCheckpoint(cfg, arch, model.state_dict()))
    config = transformers.AutoConfig.from_pretrained(folder, trust_remote_code=True)
    auto = "AutoModelForImageClassification" if "ViT" in arch else "AutoModelForPreTraining"
    built = getattr(transformers, auto).from_config(config, trust_remote_code=True)
    assert sorted(built.state_dict()) == sorted(theirs for _, theirs in pairs)


@pytest.mark.parametrize("arch", ["WideNetForSequenceClassification", "ViTWideNetForImageClassification"])
def test_to_hf_then_from_hf_is_bit_identical(arch, tmp_path):
    if arch == "ViTWideNetForImageClassification":
        cfg = VisionConfig.from_preset("widenet-paraformer-tiny-3x4")
        model, num_labels = ViTWideNetForImageClassification(cfg), None
    else:
        cfg = ModelConfig(**DIMS, moe={"dispatch": "dropless", "num_experts": 8})
        model, num_labels = WideNetForSequenceClassification(cfg, num_labels=2), 2
    checkpoint = PortableCheckpoint(cfg, arch, randomised(model, seed=8).state_dict(), num_labels,
                                    {"task": "sst2", "step": 7, "label_names": ["negative", "positive"]})
    source = save_folder(checkpoint, tmp_path / "ours",
                         tokenizer=TokenizerFiles() if num_labels is None else
                         TokenizerFiles((vocab_file(tmp_path, cfg.vocab_size),)))
    assert widenet_ds(["convert", "to-hf", str(source), str(tmp_path / "hf")]) == 0
    assert widenet_ds(["convert", "from-hf", str(tmp_path / "hf"), str(tmp_path / "back")]) == 0
    # Every tensor bit for bit (the files' bytes may differ: safetensors writes its metadata in hash-map order).
    back, original = (load_file(folder / "model.safetensors") for folder in (tmp_path / "back", source))
    assert back.keys() == original.keys()
    assert all(back[k].dtype == original[k].dtype and torch.equal(back[k], original[k]) for k in original)
    before, after = (json.loads((folder / "config.json").read_text()) for folder in (source, tmp_path / "back"))
    assert after["provenance"].pop("converted_from_hf") == str((tmp_path / "hf").resolve())
    # The files' checksums move with the bytes (safetensors' metadata order, the card naming the provenance).
    for config in (before, after):
        assert config.pop("files").keys() >= {"model.safetensors"}
    assert after == before
    if num_labels:  # the recorded label names, and the tokenizer files carried both ways
        hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
        assert hf_config["id2label"] == {"0": "negative", "1": "positive"}
        assert (tmp_path / "back" / "vocab.txt").read_text() == (source / "vocab.txt").read_text()


NLI = ["entailment", "not_entailment"]
MNLI = ["contradiction", "entailment", "neutral"]
FASHION = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


@pytest.mark.parametrize("recorded, num_labels, names", [
    (["negative", "positive"], 2, ["negative", "positive"]), (NLI, 2, NLI), (MNLI, 3, MNLI),
    (None, 1, ["score"]),  # a regression head
    (["negative", "positive"], 3, ["LABEL_0", "LABEL_1", "LABEL_2"]),  # another head than the names: no names
    ("negative", 2, ["LABEL_0", "LABEL_1"]), (None, 2, ["LABEL_0", "LABEL_1"])])  # not a list; none
def test_a_text_classifiers_labels_are_the_names_its_folder_records(recorded, num_labels, names):
    checkpoint = PortableCheckpoint(ModelConfig(**DIMS), "WideNetForSequenceClassification", {}, num_labels,
                                    {"task": "sst2", **({"label_names": recorded} if recorded else {})})
    config = hf_config(checkpoint)
    assert config["architectures"] == ["WideNetForSequenceClassification"]
    assert config["id2label"] == {str(i): name for i, name in enumerate(names)}
    assert config["label2id"] == {name: i for i, name in enumerate(names)}
    assert config.get("problem_type") == ("regression" if num_labels == 1 else None)


@pytest.mark.parametrize("task, names", [("sst2", ["negative", "positive"]), ("RTE", NLI), ("squad", None)])
def test_a_classifier_folder_of_before_the_recorded_names_exports_the_names_of_its_glue_dataset(tmp_path, task, names):
    """A version-2 folder (written before classifiers recorded their label names) names them after the GLUE dataset
    of its provenance, as its exporter did (widenet_ds/formats.py upgrades it)."""
    cfg = ModelConfig(**DIMS)
    model = randomised(WideNetForSequenceClassification(cfg, num_labels=2), seed=3)
    folder = save_folder(PortableCheckpoint(cfg, "WideNetForSequenceClassification", model.state_dict(), 2,
                                            {"task": task}), tmp_path / "ours",
                         tokenizer=TokenizerFiles((vocab_file(tmp_path, cfg.vocab_size),)))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "format_version": 2}))
    assert widenet_ds(["convert", "to-hf", str(folder), str(tmp_path / "hf")]) == 0
    exported = json.loads((tmp_path / "hf" / "config.json").read_text())["id2label"]
    assert exported == {str(i): name for i, name in enumerate(names or ["LABEL_0", "LABEL_1"])}


@pytest.mark.parametrize("dataset, num_classes, names", [
    ("digits", 10, [str(i) for i in range(10)]), ("fashion-mnist", 10, FASHION),
    ("fashion-mnist", 11, [f"LABEL_{i}" for i in range(11)]),  # another head than the dataset's classes
    ("cifar10", 10, [f"LABEL_{i}" for i in range(10)]), (None, 10, [f"LABEL_{i}" for i in range(10)])])
def test_an_image_classifiers_labels_are_its_datasets_class_names(dataset, num_classes, names):
    cfg = VisionConfig.from_preset("widenet-vit-digits", num_classes=num_classes)
    config = hf_config(PortableCheckpoint(cfg, "ViTWideNetForImageClassification", {}, None,
                                          {"dataset": dataset} if dataset else {}))
    assert config["architectures"] == ["ViTWideNetForImageClassification"]
    assert config["id2label"] == {str(i): name for i, name in enumerate(names)}
    assert config["label2id"] == {name: i for i, name in enumerate(names)}


def test_a_bf16_folder_stays_bf16_both_ways(tmp_path):
    cfg = ModelConfig(**DIMS)
    checkpoint = PortableCheckpoint(cfg, "WideNetForPreTraining", randomised(WideNetForPreTraining(cfg), 3).state_dict())
    source = save_folder(checkpoint, tmp_path / "ours", dtype="bf16",
                         tokenizer=TokenizerFiles((vocab_file(tmp_path, cfg.vocab_size),)))
    folder = write_hf_folder(read_folder(source), opened(source), tmp_path / f"hf_bf16_{os.getpid()}",
                             tokenizer=TokenizerFiles.in_folder(source))
    assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
    model = load("AutoModelForMaskedLM", folder)[0]
    assert model.widenet.encoder.ffn[0].experts[0].fc_in.weight.dtype == torch.bfloat16
    ids, types, mask = text_inputs(cfg)
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=ids, attention_mask=mask, token_type_ids=types).logits).all()
    from_hf(folder, tmp_path / "back")
    back, original = (load_file(f / "model.safetensors") for f in (tmp_path / "back", source))
    assert all(back[k].dtype == torch.bfloat16 and torch.equal(back[k], original[k]) for k in original)


def test_from_hf_reads_a_folder_saved_by_transformers_after_finetuning(tmp_path):
    """save_pretrained writes only the fields that differ from the config class's defaults (and its own keys)."""
    cfg = ModelConfig(**DIMS)
    checkpoint = PortableCheckpoint(cfg, "WideNetForSequenceClassification",
                                    randomised(WideNetForSequenceClassification(cfg, 3), seed=9).state_dict(), 3)
    model = load("AutoModelForSequenceClassification", export(tmp_path, "saved", checkpoint))[0]
    with torch.no_grad():
        model.classifier.bias.add_(1.0)  # "finetuned"
    model.save_pretrained(tmp_path / "saved_by_hf")
    assert widenet_ds(["convert", "from-hf", str(tmp_path / "saved_by_hf"), str(tmp_path / "back")]) == 0
    back = read_folder(tmp_path / "back")
    assert back.config == cfg and back.num_labels == 3 and back.architecture == "WideNetForSequenceClassification"
    assert torch.equal(back.state["classifier.bias"], checkpoint.state["classifier.bias"] + 1.0)
    expert = "widenet.encoder.ffn.0.moe.deepspeed_moe.experts.deepspeed_experts.3.fc_in.weight"
    assert torch.equal(back.state[expert], checkpoint.state[expert])


def test_from_hf_of_a_sharded_folder_gives_the_tensors_of_the_single_file_folder(tmp_path):
    """save_pretrained of a large model writes model-0000N-of-0000M.safetensors and model.safetensors.index.json."""
    cfg = ModelConfig(**DIMS)
    checkpoint = PortableCheckpoint(cfg, "WideNetForPreTraining", randomised(WideNetForPreTraining(cfg), 4).state_dict())
    single = export(tmp_path, "single", checkpoint)
    load("AutoModelForPreTraining", single)[0].save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    shards = sorted(p.name for p in (tmp_path / "sharded").glob("*.safetensors"))
    assert len(shards) > 1 and "model.safetensors" not in shards and (tmp_path / "sharded" / HF_INDEX).is_file()
    for name in ("single", "sharded"):
        source = single if name == "single" else tmp_path / name
        assert widenet_ds(["convert", "from-hf", str(source), str(tmp_path / f"{name}_back")]) == 0
    from_single, from_shards = (load_file(tmp_path / f"{name}_back" / "model.safetensors") for name in ("single", "sharded"))
    assert from_shards.keys() == from_single.keys() == checkpoint.state.keys()
    assert all(torch.equal(from_shards[k], from_single[k]) for k in from_single)


# --- bad inputs -------------------------------------------------------------------------------------------
def _text_folder(tmp_path: Path, cfg: ModelConfig) -> Path:
    return save_folder(PortableCheckpoint(cfg, "WideNetForPreTraining",
                                          randomised(WideNetForPreTraining(cfg), 1).state_dict()),
                       tmp_path / "ours", tokenizer=TokenizerFiles((vocab_file(tmp_path, cfg.vocab_size),)))


def test_from_hf_refuses_an_albert_folder_naming_from_albert(tmp_path, capsys):
    source = _text_folder(tmp_path, ModelConfig(**DIMS, ffn="dense", share_layernorm=True))
    assert widenet_ds(["convert", "to-albert", str(source), str(tmp_path / "albert")]) == 0
    assert widenet_ds(["convert", "from-hf", str(tmp_path / "albert"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "is an HF ALBERT folder (AlbertForPreTraining)" in err and "convert from-albert" in err
    assert not (tmp_path / "out").exists()


def test_from_hf_refuses_a_folder_of_another_model_type(tmp_path, capsys):
    bert = transformers.BertForMaskedLM(transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                                num_attention_heads=2, intermediate_size=24))
    bert.save_pretrained(tmp_path / "bert")
    assert widenet_ds(["convert", "from-hf", str(tmp_path / "bert"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "holds model_type 'bert' (BertForMaskedLM), not a WideNet written by `widenet-ds convert to-hf`" in err


def test_from_hf_refuses_a_truncated_safetensors_file(tmp_path, capsys):
    source = _text_folder(tmp_path, ModelConfig(**DIMS))
    assert widenet_ds(["convert", "to-hf", str(source), str(tmp_path / "hf")]) == 0
    weights = tmp_path / "hf" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert widenet_ds(["convert", "from-hf", str(tmp_path / "hf"), str(tmp_path / "out")]) == 2
    assert "model.safetensors is not a readable safetensors file" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_from_hf_refuses_a_masked_lm_folder_naming_the_fix(tmp_path):
    source = _text_folder(tmp_path, ModelConfig(**DIMS))
    folder = write_hf_folder(read_folder(source), opened(source), tmp_path / f"hf_mlm_{os.getpid()}",
                             tokenizer=TokenizerFiles.in_folder(source))
    load("AutoModelForMaskedLM", folder)[0].save_pretrained(tmp_path / "mlm")
    with pytest.raises(CheckpointError, match="WideNetForMaskedLM, which is none of widenet-ds's architectures.*"
                                              "load it with AutoModelForPreTraining"):
        from_hf(tmp_path / "mlm", tmp_path / "out")


def test_to_hf_of_a_text_model_needs_its_tokenizer(tmp_path, capsys):
    cfg = ModelConfig(**DIMS)
    source = save_folder(PortableCheckpoint(cfg, "WideNetForPreTraining", WideNetForPreTraining(cfg).state_dict()),
                         tmp_path / "ours")
    assert widenet_ds(["convert", "to-hf", str(source), str(tmp_path / "hf")]) == 2
    assert "no tokenizer was found with it; pass --tokenizer" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()


# --- dense models: transformers' own classes stay their path ----------------------------------------------
def test_dense_models_still_go_to_albert_and_hf_vit_and_to_hf_names_them(tmp_path, capsys):
    text = _text_folder(tmp_path, ModelConfig(**DIMS, ffn="dense", share_layernorm=True))
    assert widenet_ds(["convert", "to-albert", str(text), str(tmp_path / "albert")]) == 0
    assert json.loads((tmp_path / "albert" / "config.json").read_text())["model_type"] == "albert"
    capsys.readouterr()
    assert widenet_ds(["convert", "to-hf", str(text), str(tmp_path / "hf_text")]) == 0
    assert "can also write it as to-albert (transformers' own AlbertForPreTraining)" in capsys.readouterr().out
    cfg = VisionConfig.from_preset("vit-digits", head="cls")  # a dense ViT that HF's ViT holds
    image = save_folder(PortableCheckpoint(cfg, "ViTWideNetForImageClassification",
                                           ViTWideNetForImageClassification(cfg).state_dict()), tmp_path / "image")
    assert widenet_ds(["convert", "to-hf-vit", str(image), str(tmp_path / "vit")]) == 0
    assert json.loads((tmp_path / "vit" / "config.json").read_text())["model_type"] == "vit"
    capsys.readouterr()
    assert widenet_ds(["convert", "to-hf", str(image), str(tmp_path / "hf_image")]) == 0
    assert "can also write it as to-hf-vit (transformers' own ViTForImageClassification)" in capsys.readouterr().out
    (tmp_path / "moe").mkdir()
    moe = _text_folder(tmp_path / "moe", ModelConfig(**DIMS))
    assert widenet_ds(["convert", "to-hf", str(moe), str(tmp_path / "hf_moe")]) == 0
    assert "note:" not in capsys.readouterr().out  # a MoE model has no native class to name


# --- inputs: tokenizer and image processor ----------------------------------------------------------------
def test_the_exported_tokenizer_gives_our_ids(shared_data, tmp_path, monkeypatch):
    vocab = shared_data / "vocab" / "bert-base-uncased-vocab.txt"
    ours = load_tokenizer(vocab)
    cfg = ModelConfig.from_preset("widenet-tiny-e4", vocab_size=ours.get_vocab_size())
    source = save_folder(PortableCheckpoint(cfg, "WideNetForPreTraining", WideNetForPreTraining(cfg).state_dict()),
                         tmp_path / "ours", tokenizer=TokenizerFiles((vocab,)))
    assert widenet_ds(["convert", "to-hf", str(source), str(tmp_path / "hf")]) == 0
    text = "The Quick brown fox's naïve résumé, unbelievably!"
    with_code = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf", trust_remote_code=True)
    # as the model card shows, without the folder's code and without transformers asking whether to run it
    asked: list[str] = []  # transformers' "Do you wish to run the custom code? [y/N]", answered no
    monkeypatch.setattr("builtins.input", lambda prompt="": asked.append(prompt) or "n")
    plain = (transformers.AutoTokenizer.from_pretrained(tmp_path / "hf", tokenizer_type="bert"),
             transformers.BertTokenizerFast.from_pretrained(tmp_path / "hf"))
    assert asked == []
    transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")  # the bare call asks (docs/checkpoints.md: why)
    assert len(asked) == 1 and "custom code" in asked[0]
    for tokenizer in (with_code, *plain):
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == ours.encode(text, add_special_tokens=False).ids
        assert tokenizer.mask_token == "[MASK]" and tokenizer.model_max_length == cfg.max_position_embeddings
    card = (tmp_path / "hf" / "README.md").read_text()
    assert 'AutoTokenizer.from_pretrained(folder, tokenizer_type="bert")' in card
    assert "tokenizer = BertTokenizerFast.from_pretrained(folder)" in card


@pytest.mark.parametrize("channels, source_size, size", [(1, 8, 8), (1, 8, 16), (3, 20, 12)])
def test_the_image_processor_is_our_loaders_preprocessing(channels, source_size, size, tmp_path):
    from PIL import Image  # noqa: PLC0415

    cfg = VisionConfig.from_preset("widenet-vit-digits", image_size=size, patch_size=2, num_channels=channels)
    folder = export(tmp_path, f"processor-{channels}-{source_size}-{size}", PortableCheckpoint(
        cfg, "ViTWideNetForImageClassification", ViTWideNetForImageClassification(cfg).state_dict()))
    processor = transformers.AutoImageProcessor.from_pretrained(folder, trust_remote_code=True)
    images = np.random.default_rng(0).integers(0, 256, (3, source_size, source_size, channels), dtype=np.uint8)
    source = _array_source("test", images, np.zeros(3, dtype=np.int64), 10)
    ours = normalize(torch.stack([_Images(source, size, channels)[i][0] for i in range(3)]))
    pil = [Image.fromarray(image[..., 0] if channels == 1 else image) for image in images]
    for given in (pil, [p.convert("RGB") for p in pil], list(images)):  # the pipeline hands over RGB images
        got = processor(given, return_tensors="pt")["pixel_values"]
        assert max_diff(got, ours) <= 1e-6


def test_a_model_card_keeps_local_paths_out_and_explains_the_unused_sop_head(tmp_path):
    """Item 8: a card is made to be published: the run's data folder, tokenizer and checkpoint source show by their
    names, marked local, never as this machine's absolute paths; a masked-LM card says why transformers lists
    `sop_head.*` as UNEXPECTED."""
    from widenet_ds.interop.hf_model_card import model_card
    from widenet_ds.run_folder import RunFolder

    run = RunFolder(tmp_path / "secret-home" / "runs" / "x")
    run.path.mkdir(parents=True)
    data = tmp_path / "secret-home" / "data" / "wiki128"
    run.write_run_config({"task": "pretrain", "data": str(data), "output_dir": str(run.path),
                          "deepspeed_config": str(tmp_path / "ds.json")})
    cfg = ModelConfig(**DIMS, moe=MoEConfig(num_experts=2))
    model = randomised(WideNetForPreTraining(cfg), 0)
    tag = run.checkpoints / "step4"
    checkpoint = PortableCheckpoint(config=cfg, architecture="WideNetForPreTraining", state=model.state_dict(),
                                    provenance={"source": str(tag), "step": 4, "trained_with_ep_size": 1})
    hf_state = {"sop_head.weight": torch.zeros(2, 32), "sop_head.bias": torch.zeros(2), "x": torch.zeros(1)}
    card = model_card(checkpoint, tag, hf_state)
    assert str(tmp_path) not in card and "secret-home" not in card, card
    assert "- data: wiki128 (a local " in card and "- source: step4 (a local " in card
    assert "transformers lists `sop_head.weight` and `sop_head.bias` as UNEXPECTED" in card
