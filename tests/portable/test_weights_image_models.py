"""Image models on the shared checkpoint stack.

A real image run (`python -m widenet_ds.train classify` on 2 launcher ranks, ep_size 2) writes a DeepSpeed checkpoint whose
marker names its architecture; `widenet-ds convert to-folder` makes a portable folder of it, whose model, in
one process (every expert) and on 2 ranks (ep 2, each rank its own experts), gives the logits of an engine that
loaded the checkpoint with DeepSpeed's own loader; `convert reshard` to ep 1 reads back the same weights. The
shared loader's rule for image models: a head of another shape is newly initialised and reported, the body
must fit (another image size, another branch layout, a text checkpoint: refused, naming the fix).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.scripts.image_checkpoint_logits import fixed_pixels
from tests.support.launching import REPO, run_deepspeed, run_train
from widenet_ds.checkpoint.marker import CheckpointMeta
from widenet_ds.checkpoint.source import CONVERT, CheckpointSource, load_pretrained
from widenet_ds.cli import main as widenet_ds
from widenet_ds.errors import CheckpointError
from widenet_ds.model.config import ModelConfig
from widenet_ds.model.widenet import WideNetForPreTraining
from widenet_ds.portable.format import PortableCheckpoint, read_folder, save_folder
from widenet_ds.portable.weights import match_weights
from widenet_ds.vision.config import VisionConfig
from widenet_ds.vision.model import ViTWideNetForImageClassification

pytestmark = pytest.mark.usefixtures("dist")


def init_weights_for(cfg: VisionConfig, folder: Path):
    """What the image trainer checks of an --init-from before it builds anything."""
    return match_weights(CheckpointSource.open(folder, "source", purpose=CONVERT).read_weights(), ARCHITECTURE, cfg, f"--init-from {folder}")
ARCHITECTURE = "ViTWideNetForImageClassification"
SCRIPT = REPO / "tests" / "scripts" / "image_checkpoint_logits.py"


@pytest.fixture(scope="module")
def image_run(tmp_path_factory) -> Path:
    """3 steps of widenet-vit-digits on digits, 2 ranks, ep_size 2, ZeRO 1 (vision_cpu_small.json, 16 images
    per step); the checkpoint of step 3."""
    root = tmp_path_factory.mktemp("image_run")
    config = json.loads((REPO / "ds_configs" / "vision_cpu_small.json").read_text())
    config.update(train_batch_size=16, train_micro_batch_size_per_gpu=8)
    (root / "ds.json").write_text(json.dumps(config))
    run_train("classify",
                  ["--model-config", "widenet-vit-digits", "--dataset", "digits", "--ep-size", "2",
                   "--deepspeed_config", str(root / "ds.json"), "--output-dir", str(root / "run"), "--max-steps", "3",
                   "--eval-interval", "0", "--max-eval-examples", "16", "--workers", "0", "--no-progress-bar",
                   "--no-tensorboard"], num_ranks=2)
    return root / "run"


@pytest.mark.multirank
def test_to_folder_of_an_ep2_run_gives_the_engines_logits(image_run, tmp_path):
    tag_dir = image_run / "checkpoints" / "step3"
    marker = CheckpointMeta.read(tag_dir)
    assert marker.architecture == ARCHITECTURE and marker.ep_size == 2 and marker.world_size == 2
    cfg = VisionConfig.from_preset("widenet-vit-digits")
    assert marker.model_config == cfg.to_dict()

    folder = tmp_path / "folder"
    assert widenet_ds(["convert", "to-folder", str(image_run), str(folder)]) == 0
    config = json.loads((folder / "config.json").read_text())
    assert config["architecture"] == ARCHITECTURE and config["model"] == cfg.to_dict()
    assert config["provenance"]["trained_with_ep_size"] == 2 and config["provenance"]["step"] == 3
    assert config["provenance"]["dataset"] == "digits" and config["provenance"]["zero_stage"] == 1
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    state = read_folder(folder).state
    assert sorted({k.split(".deepspeed_experts.")[1].split(".")[0] for k in state if ".deepspeed_experts." in k}) == \
        ["0", "1", "2", "3"]  # experts by global index, from both ranks' expert files

    run_deepspeed(SCRIPT, [str(tag_dir), str(folder), str(tmp_path / "logits")], num_ranks=2)
    model, report = load_pretrained(ViTWideNetForImageClassification, folder)  # ep_size 1: all 4 experts
    assert (report.saved_ep_size, report.ep_size, report.experts_on_this_rank) == (2, 1, [0, 1, 2, 3])
    assert not report.new and not report.unused and report.loaded == len(state)
    model.eval()
    engines = []
    for rank in (0, 1):  # rank 1's batch went through experts 2 and 3 on rank 1 of the engine
        engine = load_file(tmp_path / f"logits.rank{rank}.safetensors")["logits"]
        folder_ep2 = load_file(tmp_path / f"logits.folder.rank{rank}.safetensors")["logits"]
        with torch.no_grad():
            ours = model(fixed_pixels(cfg, rank)).logits
        # One process at ep 1 vs the engine at ep 2: the same weights and routes, but the compact dispatch's
        # expert GEMMs hold other rows (both ranks' routes at ep 2), so float rounding may differ (3e-8 seen).
        torch.testing.assert_close(ours, engine, atol=1e-6, rtol=0)
        assert torch.equal(folder_ep2, engine)  # the same layout as the engine: the same bits
        engines.append(engine)
    assert not torch.allclose(engines[0], engines[1])  # two batches, two answers: the logits carry signal

    # reshard to ep 1 on 1 rank; the shared DeepSpeed reader gives the folder's weights back
    assert widenet_ds(["convert", "reshard", str(image_run), str(tmp_path / "ep1"), "--ep-size", "1",
                       "--world-size", "1"]) == 0
    resharded = CheckpointSource.open(tmp_path / "ep1", "source", purpose=CONVERT).read_weights()
    assert resharded.architecture == ARCHITECTURE and resharded.config == cfg
    assert resharded.provenance["trained_with_ep_size"] == 1 and resharded.state.keys() == state.keys()
    assert all(torch.equal(resharded.state[k], state[k]) for k in state)
    # an image model has no tokenizer
    assert widenet_ds(["convert", "to-folder", str(image_run), str(tmp_path / "x"), "--tokenizer",
                       str(tmp_path)]) == 2 and not (tmp_path / "x").exists()


# --- the shared loader's rule for image models --------------------------------------------------------------
def image_folder(path: Path, preset: str = "widenet-vit-digits", **overrides) -> tuple[torch.nn.Module, Path]:
    torch.manual_seed(0)
    cfg = VisionConfig.from_preset(preset, **overrides)
    model = ViTWideNetForImageClassification(cfg)
    return model, save_folder(PortableCheckpoint(cfg, ARCHITECTURE, model.state_dict()), path)


def test_a_head_of_another_shape_is_newly_initialised_and_reported(tmp_path):
    source, folder = image_folder(tmp_path / "folder")
    fewer, report = load_pretrained(ViTWideNetForImageClassification, folder, model_overrides={"num_classes": 5})
    assert report.new == ["classifier.bias", "classifier.weight"] and not report.unused
    assert "newly initialised: classifier.bias, classifier.weight" in report.summary()
    assert report.loaded == len(source.state_dict()) - 2
    assert torch.equal(fewer.embeddings.position, source.embeddings.position)
    assert fewer.classifier.weight.shape == (5, 64)
    _, report = load_pretrained(ViTWideNetForImageClassification, folder, model_overrides={"pre_logits": True})
    assert report.new == ["pre_logits.bias", "pre_logits.weight"] and not report.unused
    _, with_pre_logits = image_folder(tmp_path / "pre_logits", pre_logits=True)
    _, report = load_pretrained(ViTWideNetForImageClassification, with_pre_logits,
                                model_overrides={"pre_logits": False})
    assert not report.new and report.unused == ["pre_logits.bias", "pre_logits.weight"]
    # the image trainer's --init-from: the same rule (global keys), before any model is built
    kept = init_weights_for(VisionConfig.from_preset("widenet-vit-digits", num_classes=5), folder).load
    assert "classifier.weight" not in kept and len(kept) == len(source.state_dict()) - 2


def test_a_body_that_does_not_fit_is_refused_naming_the_fix(tmp_path):
    _, folder = image_folder(tmp_path / "folder")
    with pytest.raises(CheckpointError, match=r"(?s)embeddings.position: \(1, 17, 64\) in the checkpoint, "
                                              r"\(1, 65, 64\) in the model.*image_size: 8 \(checkpoint\) vs 16"):
        load_pretrained(ViTWideNetForImageClassification, folder, model_overrides={"image_size": 16})
    with pytest.raises(CheckpointError, match="--init-from .* the weights do not fit the body"):
        init_weights_for(VisionConfig.from_preset("widenet-vit-digits", image_size=16), folder)
    # the same keys in another branch layout (12 blocks as 3 x 4 or 4 x 3): refused all the same
    _, branched = image_folder(tmp_path / "branched", "paraformer-tiny-3x4")
    with pytest.raises(CheckpointError, match="holds 3 branch.es. x 4 layers, the model 4 x 3.*"
                                              "--set num_branches=3 --set num_layers=12"):
        init_weights_for(VisionConfig.from_preset("paraformer-tiny-4x3"), branched)
    text = ModelConfig.from_preset("albert-tiny", vocab_size=50, num_layers=2)
    save_folder(PortableCheckpoint(text, "WideNetForPreTraining", WideNetForPreTraining(text).state_dict()),
                tmp_path / "text")
    with pytest.raises(CheckpointError, match="holds a WideNetForPreTraining, which reads text; it cannot initialise "
                                              "a ViTWideNetForImageClassification, which reads images"):
        load_pretrained(ViTWideNetForImageClassification, tmp_path / "text")
    with pytest.raises(CheckpointError, match="which reads images; it cannot initialise a WideNetForPreTraining"):
        load_pretrained(WideNetForPreTraining, folder)
