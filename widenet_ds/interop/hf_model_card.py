"""The model card (README.md) of a folder written by `widenet-ds convert to-hf`.

What a reader of the Hub needs to judge the model: the architecture in words, the parameter count (each
tensor once), the data and training steps, and the scores the run recorded. The run is found from the source:
a DeepSpeed tag folder's run (`<run>/checkpoints/<tag>`), a finetuned model's seed folder (`<run>/seed<N>/model`,
written by --save-model), or the run a portable folder's provenance names; what it cannot find, it says so.

A card is made to be published: a path of this machine (a data folder, a checkpoint's source) shows by its last
name only, marked local, never as the absolute path.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from torch import Tensor

from widenet_ds.errors import RunFolderError
from widenet_ds.model.config import ModelConfig
from widenet_ds.portable.format import PortableCheckpoint, is_folder
from widenet_ds.results import Results, numbers
from widenet_ds.run_folder import SEED_DIR, RunFolder
from widenet_ds.tasks import TASKS, task_of
from widenet_ds.tasks.classify.results import ClassifyResults
from widenet_ds.tasks.finetune.results import FinetuneResults, SeedResults
from widenet_ds.tasks.pretrain.results import PretrainResults
from widenet_ds.vision.config import VisionConfig

# run_config.json settings that say what the run trained on, in the order shown.
_DATA_SETTINGS = ("task", "glue_task", "version", "dataset", "data", "max_train_examples", "max_seq_length",
                  "tokenizer")


def public(value: Any) -> Any:
    """`value` as a published card shows it: a path of this machine by its last name ("wiki128 (a local folder)"),
    anything else as it is."""
    if not isinstance(value, str) or not os.path.isabs(value):
        return value
    path = Path(value)
    return f"{path.name or value} (a local {'folder' if path.is_dir() else 'file'})"


def find_run_folder(source: Path, provenance: dict[str, Any]) -> Path | None:
    """The run folder the checkpoint came from, if it is still there."""
    candidates = [source.parent] if is_folder(source) else []  # <run>/seed<N>/model (--save-model)
    tag = Path(provenance["source"]) if provenance.get("source") else None
    if tag is not None and tag.parent.name == "checkpoints":  # a DeepSpeed tag folder <run>/checkpoints/<tag>
        candidates.append(tag.parent.parent)
    for folder in candidates:
        run = RunFolder(folder)
        if run.results.is_file() or run.run_config.is_file():
            return folder
    return None


def _scores(run: RunFolder) -> list[str]:
    """Numeric results of a run (a finetuning seed's: its metrics per split; the seeds' median beside them)."""
    task = task_of(run)
    if SEED_DIR.match(run.path.name):
        sources = [("this run", run, SeedResults), ("all seeds of the run (median)", RunFolder(run.path.parent),
                                                    FinetuneResults)]
    else:
        sources = [("this run", run, TASKS[task].results)] if task is not None else []
    lines = []
    for label, folder, kind in sources:
        if not folder.results.is_file():
            continue
        try:
            results = folder.read_results(kind)
        except RunFolderError:
            continue
        shown = [f"{key} {value:.4g}" for key, value in _flat_scores(results).items() if math.isfinite(value)]
        if shown:
            lines.append(f"- {label}: " + ", ".join(shown))
    return lines


def _flat_scores(results: Results) -> dict[str, float]:
    """The scores of a results.json by key: "split/metric" (finetuning), "test/accuracy", "valid/mlm_loss"."""
    if isinstance(results, PretrainResults):
        return results.held_out
    if isinstance(results, ClassifyResults):
        return {**results.test, **{f"accuracy_by_branches/{k}": v for k, v in results.accuracy_by_branches.items()}}
    scores = results.metrics if isinstance(results, SeedResults) else results.median
    return {f"{split}/{name}": value for split, values in numbers(scores).items() for name, value in values.items()}


def _architecture(checkpoint: PortableCheckpoint) -> str:
    cfg = checkpoint.config
    shared = [name for name, on in (("attention", cfg.share_attention), ("FFN/MoE", cfg.share_ffn),
                                    ("LayerNorms", cfg.share_layernorm)) if on]
    ffn = (f"a Mixture-of-Experts FFN of {cfg.moe.num_experts} experts (width {cfg.experts_width}), top-"
           f"{cfg.moe.top_k} routing, capacity factor {cfg.moe.capacity_factor} (eval {cfg.moe.eval_capacity_factor}), "
           f"{cfg.moe.combine_weights} combine weights, {cfg.moe.balance_loss} balance loss x "
           f"{cfg.moe.balance_loss_weight}, dispatch {cfg.moe.dispatch}" if cfg.is_moe
           else f"a dense FFN of width {cfg.intermediate_size}")
    body = (f"{cfg.num_layers} blocks ({cfg.norm_position}-LN) of hidden size {cfg.hidden_size} and {cfg.num_heads} "
            f"heads, sharing {', '.join(shared) or 'nothing'} across blocks, with {ffn}")
    if cfg.num_branches > 1:
        body += f"; ParaFormer layout: {cfg.num_branches} parallel branches of {cfg.layers_per_branch} blocks"
    if isinstance(cfg, VisionConfig):
        return (f"ViT-WideNet image classifier: {cfg.image_size} px images in patches of {cfg.patch_size} "
                f"({cfg.num_channels} channel(s)), {body}; {cfg.head} pooling, {cfg.num_classes} classes.")
    assert isinstance(cfg, ModelConfig)
    return (f"{checkpoint.architecture}: ALBERT-style factorized embeddings ({cfg.vocab_size} words x "
            f"{cfg.embedding_size}), {body}.")


def model_card(checkpoint: PortableCheckpoint, source: Path, hf_state: dict[str, Tensor]) -> str:
    cfg, provenance = checkpoint.config, checkpoint.provenance
    image = isinstance(cfg, VisionConfig)
    parameters = sum(t.numel() for t in hf_state.values())
    run_path = find_run_folder(Path(source), provenance)
    run = RunFolder(run_path) if run_path is not None else None
    settings: dict[str, Any] = {}
    # A finetuning seed's settings are its run's (<run>/run_config.json beside <run>/seed<N>/).
    for folder in ([run, RunFolder(run.path.parent)] if run is not None else []):
        if folder.run_config.is_file():
            try:
                settings = folder.read_run_config()
            except RunFolderError:
                pass
            break
    data = [f"{key}: {public(settings[key])}" for key in _DATA_SETTINGS if settings.get(key) not in (None, "")]
    if not data:
        data = [f"{key}: {public(provenance[key])}" for key in ("task", "dataset") if provenance.get(key)]
    if provenance.get("init"):  # a finetuned model: the weights it started from
        data.append(f"initialised from: {public(provenance['init'])}")
    steps = provenance.get("step", provenance.get("steps"))
    auto = "AutoModelForImageClassification" if image else {
        "WideNetForSequenceClassification": "AutoModelForSequenceClassification",
        "WideNetForQuestionAnswering": "AutoModelForQuestionAnswering"}.get(checkpoint.architecture,
                                                                           "AutoModelForMaskedLM")
    pipeline = "image-classification" if image else "fill-mask" if auto == "AutoModelForMaskedLM" else None
    lines = ["---", "library_name: transformers", "tags: [widenet, mixture-of-experts]" if cfg.is_moe
             else "tags: [widenet]", "---", "",
             f"# {checkpoint.architecture} (WideNet, exported by widenet-ds)", "",
             "WideNet (Xue et al., \"Go Wider Instead of Deeper\", AAAI 2022) shares one attention and one "
             "Mixture-of-Experts layer across its blocks, each block keeping its own LayerNorms.", "",
             "## Model", "", f"- architecture: {_architecture(checkpoint)}",
             f"- parameters: {parameters:,} (each shared tensor once; every expert counted)",
             f"- trained with expert parallelism {provenance.get('trained_with_ep_size', 'unrecorded')}; this folder "
             f"holds every expert (by global index) and runs on one device", "",
             "## Data and training", ""]
    lines += [f"- {line}" for line in data] or ["- data: not recorded with this checkpoint"]
    lines += [f"- training steps: {steps if steps is not None else 'not recorded'}",
              f"- training precision: {provenance.get('training_precision', 'not recorded')}", "", "## Scores", ""]
    lines += (_scores(run) if run is not None else []) or ["- none recorded with this checkpoint"]
    lines += ["", "## Use", "", "Needs torch and transformers (>= 5); the model code is in this folder "
              "(`trust_remote_code=True`).", "", "```python", f"from transformers import {auto}",
              "folder = \"path/to/this/folder\"  # or its name on the Hub",
              f"model = {auto}.from_pretrained(folder, trust_remote_code=True)  # eval routing = widenet-ds's",
              f"# every route kept: {auto}.from_pretrained(folder, trust_remote_code=True, dispatch=\"dropless\")"]
    if not image:  # transformers' AutoTokenizer reads config.json before tokenizer_config.json, and its auto_map makes
        # AutoConfig ask to run this folder's code; a tokenizer type (or the class) skips config.json
        lines += ["from transformers import AutoTokenizer, BertTokenizerFast",
                  "tokenizer = AutoTokenizer.from_pretrained(folder, tokenizer_type=\"bert\")  # plain WordPiece: "
                  "no code of this folder runs",
                  "tokenizer = BertTokenizerFast.from_pretrained(folder)  # the same tokenizer"]
    if pipeline:
        lines += ["from transformers import pipeline",
                  f"pipe = pipeline(\"{pipeline}\", model=folder, trust_remote_code=True)"]
    lines += ["```", ""]
    if auto == "AutoModelForMaskedLM" and any(key.startswith("sop_head.") for key in hf_state):
        lines += ["Loaded as a masked LM, transformers lists `sop_head.weight` and `sop_head.bias` as UNEXPECTED "
                  "(\"not ok if you expect identical arch\"): they are pretraining's sentence-order-prediction head, "
                  "which the masked-LM model has no use for. Nothing is missing (a MISSING key would be a problem); "
                  "`AutoModelForPreTraining` (this folder's `WideNetForPreTraining`) loads them too.", ""]
    lines += ["Outputs carry `aux_loss` (the balance loss summed over the routing calls); with labels, "
              "`loss` = task loss + balance_loss_weight x aux_loss, what transformers' Trainer optimises.",
              "`widenet-ds convert from-hf` turns this folder back into a widenet-ds checkpoint folder.", "",
              "## Provenance", ""]
    lines += [f"- {key}: {public(value)}" for key, value in sorted(provenance.items())]
    return "\n".join(lines) + "\n"
