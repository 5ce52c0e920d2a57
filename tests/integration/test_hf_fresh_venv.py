"""WideNet in the HF ecosystem, as a new user meets it: real runs exported with `widenet-ds convert to-hf`, then
loaded in a fresh virtualenv that has torch, transformers and safetensors (+ Pillow, which transformers' image
pipelines need, and accelerate, which its Trainer needs) and neither widenet-ds nor DeepSpeed.

Runs (2 launcher ranks each, but SQuAD's and text-classification's): pretraining of widenet-tiny-e4 with ep_size 2;
SST-2 finetuning with ep_size 2 and --save-model; a short SQuAD run and a text-classification run on SST-2 as a
user's CSVs (its classes named in words) with --save-model (1 rank each, in this process); ViT-WideNet on digits
with ep_size 2. On the transformers side (tests/scripts/hf_fresh_venv_side.py, in the fresh venv's python):
  1. AutoModelForMaskedLM / ForPreTraining / ForSequenceClassification / ForQuestionAnswering /
     ForImageClassification give our model's eval outputs within 1e-5, with both dispatches and with eval
     dropping; pipeline("fill-mask"), pipeline("image-classification") and pipeline("text-classification")
     (the user's class names) give our predictions and scores;
  2. the SST-2 model scored with transformers on the dev set gives the accuracy our run reported;
  3. three Trainer steps on the masked-LM model lower its loss (aux loss included);
  4. (in this process) to-hf -> from-hf of the real runs is bit-identical.

The fresh venv is built once per requirement set (pip, with the machine's ordinary package set-up, installs
torch's CPU wheel and transformers, without compiling their bytecode: about 30 s, in the background while the runs train) and kept in the user's
cache (`~/.cache/widenet-ds/hf-fresh-venvs/<key>`), where later runs, other checkouts and CI on the same machine
reuse it. It is a cache only: deleted, it is built again; a failed build fails the test (never a skip).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.support.labelled_files import glue_rows, write_rows
from tests.support.launching import RANK_VARS, REPO, run_train
from tests.support.pretrain_support import prepare_data, train_in_process
from widenet_ds.checkpoint.source import CONVERT, CheckpointSource, load_pretrained
from widenet_ds.cli import main as widenet_ds
from widenet_ds.data.tokenizer import load_tokenizer
from widenet_ds.model.widenet import (
    WideNetForPreTraining,
    WideNetForQuestionAnswering,
    WideNetForSequenceClassification,
)
from widenet_ds.portable.format import read_folder
from widenet_ds.tasks.finetune.features import encode_pairs
from widenet_ds.vision.augment import normalize
from widenet_ds.vision.datasets import digits
from widenet_ds.vision.model import ViTWideNetForImageClassification

pytestmark = [pytest.mark.multirank, pytest.mark.slow, pytest.mark.usefixtures("dist")]
SIDE_SCRIPT = REPO / "tests" / "scripts" / "hf_fresh_venv_side.py"
ACCELERATE = "accelerate==1.15.0"  # transformers' Trainer needs it; what `pip install transformers[torch]` adds


# --- the fresh virtualenv ---------------------------------------------------------------------------------
def fresh_venv_requirements() -> list[str]:
    """The versions this checkout tests against (torch's local version tag dropped: pip takes the CPU wheel
    from the local mirror for `torch==X`)."""
    pins = [f"{name}=={importlib.metadata.version(name).split('+')[0]}"
            for name in ("torch", "transformers", "safetensors", "pillow")]
    return pins + [ACCELERATE]


@pytest.fixture(scope="session")
def fresh_hf_python():
    """A virtualenv's python with only the requirements (and their dependencies), built once per set of them.

    Yields a function that returns the python. A build starts at once, in the background, and that function
    waits for it: pip mostly unpacks wheels while the runs below mostly compute, so the two overlap."""
    requirements = fresh_venv_requirements()
    key = hashlib.sha256(" ".join(requirements).encode()).hexdigest()[:16]
    venv = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "widenet-ds" / "hf-fresh-venvs" / key
    if (venv / "READY").is_file():
        yield lambda: venv / "bin" / "python"
        return
    building = venv.with_name(f"{key}.tmp-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    building.parent.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    subprocess.run([sys.executable, "-m", "venv", str(building)], check=True, env=env)
    log = open(building / "pip.log", "w")
    # --no-compile: no .pyc for all of torch and transformers up front (most of pip's time here); the side's python
    # compiles what it imports, once.
    install = subprocess.Popen([str(building / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-compile",
                                *requirements],
                               stdout=log, stderr=subprocess.STDOUT, env=env)

    def python() -> Path:
        if not (venv / "READY").is_file():
            if install.wait(timeout=1200) != 0:
                pytest.fail(f"could not build the fresh venv ({' '.join(requirements)}):\n"
                            f"{(building / 'pip.log').read_text()[-3000:]}")
            (building / "READY").write_text(" ".join(requirements) + "\n")
            if not (venv / "READY").is_file():  # another session may have finished first: keep its venv
                shutil.rmtree(venv, ignore_errors=True)
                os.replace(building, venv)
        return venv / "bin" / "python"

    try:
        yield python
    finally:  # a session that never asked for the venv (or failed on the way) leaves no half-built one
        if install.poll() is None:
            install.kill()
            install.wait()
        log.close()
        shutil.rmtree(building, ignore_errors=True)


def run_hf_side(python: Path, job: dict, root: Path) -> dict:
    (root / "job.json").write_text(json.dumps(job, indent=2))
    # -I: no PYTHONPATH, no user site, not the script's folder: nothing of this checkout is importable there.
    # Nor this process's 1-rank group: the Trainer would join it (RANK, MASTER_PORT, ...).
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "VIRTUAL_ENV", "WIDENET")) and k not in RANK_VARS}
    env |= {"HF_HOME": str(root / "hf_home"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(python), "-I", str(SIDE_SCRIPT), str(root / "job.json"), str(root / "result.json")],
                          capture_output=True, text=True, env=env, timeout=900, cwd=root)
    assert proc.returncode == 0, f"the transformers side failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads((root / "result.json").read_text())


# --- real runs --------------------------------------------------------------------------------------------
COMMON = ["--no-progress-bar", "--no-tensorboard", "--log-interval", "10"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shared_data) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf_runs")
    vocab = str(shared_data / "vocab" / "bert-base-uncased-vocab.txt")
    small = json.loads((REPO / "ds_configs" / "finetune_cpu_small.json").read_text())
    small.update(train_batch_size=16, train_micro_batch_size_per_gpu=8)
    (root / "squad_ds.json").write_text(json.dumps(small))
    vision = json.loads((REPO / "ds_configs" / "vision_cpu_small.json").read_text())
    vision.update(train_batch_size=16, train_micro_batch_size_per_gpu=8)
    (root / "vision_ds.json").write_text(json.dumps(vision))
    data = prepare_data(root / "data", [shared_data / "corpus" / "books" / "pg11.txt"])  # 4 steps need little text
    run_train("pretrain", ["--model-config", "widenet-tiny-e4", "--ep-size", "2", "--data", str(data),
                           "--deepspeed_config", str(REPO / "ds_configs" / "cpu_small.json"), "--max-steps", "4",
                           "--eval-interval", "0", "--output-dir", str(root / "pretrain"), *COMMON])
    run_train("glue", ["--task", "sst2", "--data", str(shared_data / "glue" / "SST-2"), "--tokenizer", vocab,
                       "--model-config", "widenet-tiny-e4", "--ep-size", "2", "--deepspeed_config",
                       str(REPO / "ds_configs" / "finetune_cpu_small.json"), "--allow-recipe-mismatch",
                       "--max-steps", "60", "--max-train-examples", "2000", "--max-seq-length", "64", "--save-model",
                       "--output-dir", str(root / "sst2"), *COMMON], timeout=900)
    assert train_in_process("squad", [
        "--version", "1.1", "--data", str(shared_data / "squad" / "dev-v1.1.json"), "--tokenizer", vocab,
        "--model-config", "widenet-tiny-e4", "--deepspeed_config", str(root / "squad_ds.json"),
        "--allow-recipe-mismatch", "--max-steps", "3", "--max-train-examples", "32", "--max-eval-examples", "32",
        "--max-seq-length", "128", "--doc-stride", "32", "--save-model", "--output-dir", str(root / "squad"),
        *COMMON]) is not None
    words = {"0": "negative", "1": "positive"}  # SST-2 as a user's own CSVs, its classes named in words
    for split, file in (("train", "train.csv"), ("dev", "validation.csv")):
        write_rows(root / "reviews" / file, [{"review": row["sentence"], "sentiment": words[row["label"]]}
                                             for row in glue_rows(shared_data / "glue" / "SST-2" / f"{split}.tsv")[1]])
    assert train_in_process("text-classification", [
        "--data", str(root / "reviews"), "--text-fields", "review", "--label-field", "sentiment", "--tokenizer", vocab,
        "--model-config", "widenet-tiny-e4", "--deepspeed_config", str(REPO / "ds_configs" / "finetune_cpu_small.json"),
        "--allow-recipe-mismatch", "--max-steps", "30", "--max-train-examples", "1024", "--max-eval-examples", "64",
        "--max-seq-length", "64", "--save-model", "--output-dir", str(root / "own"), *COMMON]) is not None
    run_train("classify", ["--model-config", "widenet-vit-digits", "--dataset", "digits", "--ep-size", "2",
                           "--deepspeed_config", str(root / "vision_ds.json"), "--max-steps", "30",
                           "--eval-interval", "0", "--max-eval-examples", "64", "--workers", "0",
                           "--output-dir", str(root / "classify"), *COMMON])
    return {"pretrain": root / "pretrain", "sst2": root / "sst2", "squad": root / "squad",
            "classify": root / "classify", "own": root / "own"}


# --- our side: the folders and our model's eval outputs ---------------------------------------------------
def text_inputs(vocab_size: int, seq: int = 48) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab_size, (4, seq), generator=gen)
    ids[:, 0], ids[:, -1] = 2, 3  # [CLS] ... [SEP]
    mask = torch.ones_like(ids)
    mask[1, 30:] = 0
    types = torch.zeros_like(ids)
    types[:, seq // 2:] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def ours_eval(cls, auto: str, source: Path, inputs: dict[str, torch.Tensor], moe: dict) -> dict[str, torch.Tensor]:
    """Our model from the run's weights (one process, every expert) in eval mode: its outputs under the names the
    HF Auto class gives them."""
    model, _ = load_pretrained(cls, source, model_overrides={"moe": moe})
    model.ensure_process_groups()
    with torch.no_grad():
        if cls is ViTWideNetForImageClassification:
            out = model.eval()(inputs["pixel_values"])
        else:
            out = model.eval()(inputs["input_ids"], inputs["token_type_ids"], inputs["attention_mask"])
    outputs = {"aux_loss": out.balance_loss, "dropped_fraction": out.routing.dropped_fraction}
    if auto == "AutoModelForMaskedLM":
        return {"logits": out.mlm_logits, **outputs}
    if auto == "AutoModelForPreTraining":
        return {"prediction_logits": out.mlm_logits, "sop_logits": out.sop_logits, **outputs}
    if auto == "AutoModelForQuestionAnswering":
        return {"start_logits": out.start_logits, "end_logits": out.end_logits, **outputs}
    return {"logits": out.logits, **outputs}


# (name, run, our class, HF Auto class, the MoE overrides of both sides)
PARITY = [
    ("mlm-ep2", "pretrain", WideNetForPreTraining, "AutoModelForMaskedLM", {}),
    ("mlm-ep2-dropless", "pretrain", WideNetForPreTraining, "AutoModelForMaskedLM", {"dispatch": "dropless"}),
    ("mlm-ep2-eval-drops", "pretrain", WideNetForPreTraining, "AutoModelForMaskedLM", {"eval_capacity_factor": 0.5}),
    ("pretraining-ep2", "pretrain", WideNetForPreTraining, "AutoModelForPreTraining", {}),
    ("sst2-ep2", "sst2", WideNetForSequenceClassification, "AutoModelForSequenceClassification", {}),
    ("sst2-ep2-dropless", "sst2", WideNetForSequenceClassification, "AutoModelForSequenceClassification",
     {"dispatch": "dropless"}),
    ("squad", "squad", WideNetForQuestionAnswering, "AutoModelForQuestionAnswering", {}),
    ("squad-dropless", "squad", WideNetForQuestionAnswering, "AutoModelForQuestionAnswering", {"dispatch": "dropless"}),
    ("vit-ep2", "classify", ViTWideNetForImageClassification, "AutoModelForImageClassification", {}),
    ("vit-ep2-dropless", "classify", ViTWideNetForImageClassification, "AutoModelForImageClassification",
     {"dispatch": "dropless"}),
]


def weights_source(runs: dict[str, Path], run: str) -> Path:
    """What to-hf converts: the DeepSpeed checkpoints of pretraining and images (ep 2), the finetuned models'
    folders (--save-model; finetuning removes a seed's checkpoints once it is done)."""
    return runs[run] / "seed1234" / "model" if run in ("sst2", "squad", "own") else runs[run]


@pytest.fixture(scope="module")
def exported(runs, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf_folders")
    folders = {}
    for run in runs:
        folders[run] = root / f"widenet_{run}_{os.getpid()}"  # transformers caches remote code per folder name
        assert widenet_ds(["convert", "to-hf", str(weights_source(runs, run)), str(folders[run])]) == 0
    return folders


@pytest.fixture(scope="module")
def digit_images(tmp_path_factory) -> tuple[list[Path], torch.Tensor]:
    """8 digits test images as PNG files (what the pipeline reads), and our loader's pixels of them."""
    from PIL import Image

    root = tmp_path_factory.mktemp("digits")
    test = digits()["test"]
    arrays = [test.load(i, 1) for i in range(8)]
    paths = []
    for i, array in enumerate(arrays):
        Image.fromarray(array[..., 0], mode="L").save(root / f"{i}.png")
        paths.append(root / f"{i}.png")
    pixels = normalize(torch.stack([torch.from_numpy(np.array(a)).permute(2, 0, 1) for a in arrays]))
    return paths, pixels


@pytest.fixture(scope="module")
def hf_side(runs, exported, digit_images, fresh_hf_python, shared_data, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("hf_side")
    job: dict = {"parity": {}}
    ours: dict = {"parity": {}}
    for name, run, cls, auto, moe in PARITY:
        source = weights_source(runs, run)
        inputs = {"pixel_values": digit_images[1]} if run == "classify" else \
            text_inputs(CheckpointSource.open(source, "source", purpose=CONVERT).read_weights().config.vocab_size)
        expected = ours_eval(cls, auto, source, inputs, moe)
        save_file({k: v.contiguous() for k, v in inputs.items()}, root / f"{name}.inputs.safetensors")
        save_file({k: v.contiguous() for k, v in expected.items()}, root / f"{name}.expected.safetensors")
        job["parity"][name] = {"folder": str(exported[run]), "auto": auto, "kwargs": moe,
                               "inputs": str(root / f"{name}.inputs.safetensors"),
                               "expected": str(root / f"{name}.expected.safetensors")}
        ours["parity"][name] = expected

    # fill-mask: our model's top 5 at the [MASK] of a sentence our tokenizer encodes
    text = "the old man said that he had [MASK] the house ."
    tokenizer = load_tokenizer(runs["pretrain"] / "tokenizer.json")  # [CLS] text [SEP], as our examples are built
    ids = torch.tensor([[tokenizer.token_to_id("[CLS]"), *tokenizer.encode(text, add_special_tokens=False).ids,
                         tokenizer.token_to_id("[SEP]")]])
    model, _ = load_pretrained(WideNetForPreTraining, runs["pretrain"])
    model.ensure_process_groups()
    with torch.no_grad():
        logits = model.eval()(ids).mlm_logits[0, ids[0].tolist().index(tokenizer.token_to_id("[MASK]"))]
    top = torch.softmax(logits, dim=-1).topk(5)
    ours["fill_mask"] = list(zip(top.indices.tolist(), top.values.tolist()))
    job["fill_mask"] = {"folder": str(exported["pretrain"]), "text": text, "top_k": 5}

    # image-classification: our model's class probabilities of the PNG files' pixels, one image per call as the
    # pipeline runs them (with capacity dropping, an image's routes depend on the batch it is routed with)
    model, _ = load_pretrained(ViTWideNetForImageClassification, runs["classify"])
    model.ensure_process_groups()
    with torch.no_grad():
        ours["image_probs"] = torch.cat([torch.softmax(model.eval()(image[None]).logits, dim=-1)
                                         for image in digit_images[1]])
    job["image_classification"] = {"folder": str(exported["classify"]), "images": [str(p) for p in digit_images[0]],
                                   "top_k": 3}

    # text-classification: our model's class probabilities of dev sentences, one a call as the pipeline runs them
    sentences = [row["sentence"] for row in glue_rows(shared_data / "glue" / "SST-2" / "dev.tsv")[1][:8]]
    model, _ = load_pretrained(WideNetForSequenceClassification, weights_source(runs, "own"))
    model.ensure_process_groups()
    tokenizer = load_tokenizer(weights_source(runs, "own") / "tokenizer.json")
    with torch.no_grad():
        ours["text_probs"] = []
        for sentence in sentences:
            encoded = encode_pairs(tokenizer, [sentence], None, 64)
            ids, types = torch.tensor(encoded.input_ids), torch.tensor(encoded.token_type_ids)
            ours["text_probs"].append(torch.softmax(model.eval()(ids, types, torch.ones_like(ids)).logits[0], dim=-1))
    job["text_classification"] = {"folder": str(exported["own"]), "texts": sentences}

    job["sst2"] = {"folder": str(exported["sst2"]), "dev": str(shared_data / "glue" / "SST-2" / "dev.tsv"),
                   "max_length": 64}
    corpus = (shared_data / "glue" / "SST-2" / "dev.tsv").read_text().splitlines()[1:9]
    job["trainer"] = {"folder": str(exported["pretrain"]), "texts": [line.split("\t")[0] for line in corpus],
                      "output": str(root / "trainer")}
    return {"theirs": run_hf_side(fresh_hf_python(), job, root), "ours": ours}


# --- the checks -------------------------------------------------------------------------------------------
def test_the_fresh_venv_has_transformers_without_widenet_ds_or_deepspeed(hf_side):
    assert hf_side["theirs"]["isolated"] == {"widenet_ds": True, "deepspeed": True}
    assert hf_side["theirs"]["versions"]["transformers"] == importlib.metadata.version("transformers")


@pytest.mark.parametrize("name", [case[0] for case in PARITY])
def test_auto_classes_give_our_eval_outputs(hf_side, name):
    result = hf_side["theirs"]["parity"][name]
    loading = result["loading"]
    assert not loading["missing_keys"] and not loading["mismatched_keys"], loading
    expected_unused = ["sop_head.bias", "sop_head.weight"] if name.startswith("mlm") else []
    assert loading["unexpected_keys"] == expected_unused, loading
    print(name, result["max_diff"])
    for output, diff in result["max_diff"].items():
        assert diff <= 1e-5, (name, output, diff)
    ours = hf_side["ours"]["parity"][name]
    if name.endswith("drops") or name.startswith("vit-ep2") and not name.endswith("dropless"):
        assert ours["dropped_fraction"].sum() > 0  # eval dropping is exercised, and matched (diff 0 above)


def test_fill_mask_pipeline_gives_our_predictions(hf_side):
    theirs = hf_side["theirs"]["fill_mask"]
    ours = hf_side["ours"]["fill_mask"]
    assert [r["token"] for r in theirs] == [token for token, _ in ours]
    assert max(abs(r["score"] - score) for r, (_, score) in zip(theirs, ours)) <= 1e-5


def test_image_classification_pipeline_gives_our_predictions(hf_side):
    probs = hf_side["ours"]["image_probs"]
    for row, results in zip(probs, hf_side["theirs"]["image_classification"]):
        top = row.topk(3)
        assert [r["label"] for r in results] == [str(i) for i in top.indices.tolist()]  # digits' names: "0".."9"
        assert max(abs(r["score"] - p) for r, p in zip(results, top.values.tolist())) <= 1e-5


def test_the_text_classification_pipeline_names_the_classes_of_the_users_file(hf_side, exported, tmp_path):
    """A model finetuned on a user's own CSV (text-classification, classes named in words): its HF export's id2label
    holds those names, pipeline("text-classification") prints them with our model's probabilities, and from-hf
    keeps them."""
    theirs = hf_side["theirs"]["text_classification"]
    assert theirs["id2label"] == {"0": "negative", "1": "positive"}
    names = ["negative", "positive"]
    for probs, result in zip(hf_side["ours"]["text_probs"], theirs["results"]):
        assert result["label"] == names[int(probs.argmax())], (result, probs)
        assert abs(result["score"] - float(probs.max())) <= 1e-5
    assert len(theirs["results"]) == 8
    assert widenet_ds(["convert", "from-hf", str(exported["own"]), str(tmp_path / "back")]) == 0
    assert read_folder(tmp_path / "back").provenance["label_names"] == names
    assert "- task: text-classification" in (exported["own"] / "README.md").read_text()


def test_sst2_scored_with_transformers_gives_the_accuracy_our_run_reported(runs, hf_side):
    reported = json.loads((runs["sst2"] / "results.json").read_text())["per_seed"][0]["metrics"]["dev"]["acc"]
    theirs = hf_side["theirs"]["sst2"]
    print(f"SST-2 dev accuracy: our run {reported}, transformers {theirs['accuracy']} ({theirs['examples']} examples)")
    assert theirs["examples"] == 872 and theirs["id2label"] == {"0": "negative", "1": "positive"}
    assert theirs["accuracy"] == reported
    assert reported > 444 / 872  # the run learned something beyond the majority class


def test_three_trainer_steps_lower_the_loss_aux_loss_included(hf_side):
    trainer = hf_side["theirs"]["trainer"]
    print("Trainer:", trainer)
    (loss_before, aux_before), (loss_after, aux_after) = trainer["before"], trainer["after"]
    assert len(trainer["train_losses"]) == 3 and aux_before > 0 and aux_after > 0
    assert loss_after < loss_before - 0.01
    assert trainer["router_changed"]  # the router trains (through the combine weights and the aux loss)


def test_model_cards_say_what_the_runs_were(runs, exported):
    card = (exported["sst2"] / "README.md").read_text()
    acc = json.loads((runs["sst2"] / "results.json").read_text())["per_seed"][0]["metrics"]["dev"]["acc"]
    parameters = sum(t.numel() for t in load_file(exported["sst2"] / "model.safetensors").values())
    assert f"- parameters: {parameters:,}" in card and f"dev/acc {acc:.4g}" in card
    assert "- training steps: 60" in card and "- task: glue" in card and "- glue_task: sst2" in card
    assert "- max_seq_length: 64" in card and "initialised from: preset:widenet-tiny-e4" in card
    assert "4 experts" in card and "trained with expert parallelism 2" in card
    pretrain_card = (exported["pretrain"] / "README.md").read_text()
    assert "- training steps: 4" in pretrain_card and "valid/mlm_loss" in pretrain_card
    assert "pipeline(\"fill-mask\"" in pretrain_card
    image_card = (exported["classify"] / "README.md").read_text()
    assert "test/accuracy" in image_card and "- dataset: digits" in image_card


@pytest.mark.parametrize("run", ["pretrain", "sst2", "classify", "own"])
def test_real_runs_round_trip_bit_identical(runs, exported, run, tmp_path):
    assert widenet_ds(["convert", "from-hf", str(exported[run]), str(tmp_path / "back")]) == 0
    original, back = CheckpointSource.open(weights_source(runs, run), "source", purpose=CONVERT).read_weights(), read_folder(tmp_path / "back")
    assert back.architecture == original.architecture and back.config == original.config
    assert back.num_labels == original.num_labels
    assert back.state.keys() == original.state.keys()
    assert all(torch.equal(back.state[k], original.state[k]) for k in original.state)
