"""ParaFormer compression and expansion through the real folder files and `widenet-ds branches`: a folder
compressed to k branches gives the full model's forward(branches=k) logits for every k (images, WideNet x
ParaFormer, text post-LN dense and pre-LN WideNet); an expanded folder keeps the old model's outputs at the old
branch count and changes them with the new branches; a real digits run, converted with `widenet-ds convert
to-folder`, compresses to its k-prefix and continues from an expanded folder (loss near the old run's last,
accuracy per branch count for the new count); bad branch counts and unbranched models are clear errors."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
import torch

from tests.support.launching import REPO, child_env, python_train_command
from tests.support.pretrain_support import events, train_losses
from widenet_ds.checkpoint.source import load_pretrained
from widenet_ds.cli import main as widenet_ds_main
from widenet_ds.errors import CheckpointError, ConfigError
from widenet_ds.model.config import ModelConfig
from widenet_ds.model.widenet import WideNetForPreTraining, WideNetForSequenceClassification
from widenet_ds.portable.branches import compress, expand, expanded_config
from widenet_ds.portable.format import PortableCheckpoint, read_folder, save_folder
from widenet_ds.vision.config import VisionConfig
from widenet_ds.vision.model import ViTWideNetForImageClassification

VISION_PRESETS = ["paraformer-tiny-3x4", "widenet-paraformer-tiny-3x4"]


def perturbed(model: torch.nn.Module) -> torch.nn.Module:
    """Non-trivial LayerNorms and biases (fresh ones are 1 / 0), so a block taken from the wrong place shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


# --- vision -------------------------------------------------------------------------------------------
def vision_folder(preset: str, path: Path) -> tuple[ViTWideNetForImageClassification, Path]:
    torch.manual_seed(0)
    cfg = VisionConfig.from_preset(preset)
    model = perturbed(ViTWideNetForImageClassification(cfg))
    return model, save_folder(PortableCheckpoint(cfg, "ViTWideNetForImageClassification", model.state_dict()), path)


def load_image_folder(path: Path) -> ViTWideNetForImageClassification:
    model, report = load_pretrained(ViTWideNetForImageClassification, path)
    assert not report.new and not report.unused
    return model.eval()


@pytest.mark.parametrize("preset", VISION_PRESETS)
def test_vision_k_branch_folder_gives_the_full_models_k_prefix_logits(dist, tmp_path, preset, capsys):
    model, full = vision_folder(preset, tmp_path / "full")
    pixels = torch.randn(4, 1, 28, 28)
    prefixes = []
    for k in range(1, model.cfg.num_branches + 1):
        assert widenet_ds_main(["branches", "compress", str(full), str(tmp_path / f"k{k}"), "--branches", str(k)]) == 0
        small = load_image_folder(tmp_path / f"k{k}")
        assert (small.cfg.num_branches, small.cfg.num_layers) == (k, k * model.cfg.layers_per_branch)
        with torch.no_grad():
            want, got = model(pixels, branches=k).logits, small(pixels).logits
        assert torch.equal(got, want), (k, (got - want).abs().max().item())
        prefixes.append(want)
    assert "wrote" in capsys.readouterr().out
    # the prefixes differ: a compression that kept the wrong blocks could not pass by accident
    assert all(not torch.allclose(a, b, atol=1e-3) for a, b in zip(prefixes, prefixes[1:]))


@pytest.mark.parametrize("preset", VISION_PRESETS)
def test_vision_expansion_keeps_the_old_outputs_and_adds_fresh_branches(dist, tmp_path, preset):
    model, full = vision_folder(preset, tmp_path / "full")
    old_n = model.cfg.num_branches
    assert widenet_ds_main(["branches", "expand", str(full), str(tmp_path / "wide"), "--branches", str(old_n + 2),
                            "--seed", "3"]) == 0
    wide = load_image_folder(tmp_path / "wide")
    assert (wide.cfg.num_branches, wide.cfg.layers_per_branch) == (old_n + 2, model.cfg.layers_per_branch)
    pixels = torch.randn(4, 1, 28, 28)
    with torch.no_grad():
        old = model(pixels).logits
        assert torch.equal(wide(pixels, branches=old_n).logits, old)
        assert not torch.allclose(wide(pixels).logits, old, atol=1e-3)
    first_new_block = old_n * model.cfg.layers_per_branch
    state = read_folder(tmp_path / "wide").state
    if "widenet" in preset:  # a new branch owns only LayerNorms (attention and MoE are shared): fresh ones
        assert torch.equal(state[f"encoder.attention_norm.{first_new_block}.weight"], torch.ones(64))
    else:  # a seeded fresh initialisation: the same seed gives the same weights, another seed others
        for name, seed in (("again", "3"), ("other", "4")):
            widenet_ds_main(["branches", "expand", str(full), str(tmp_path / name), "--branches", str(old_n + 2),
                             "--seed", seed])
        again, other = (read_folder(tmp_path / name).state for name in ("again", "other"))
        key = f"encoder.attention.{first_new_block}.query.weight"
        assert torch.equal(state[key], again[key]) and not torch.equal(state[key], other[key])
    provenance = json.loads((tmp_path / "wide" / "config.json").read_text())["provenance"]
    assert provenance["branches"] == f"{old_n} trained + 2 new (seed 3)"


# --- text ---------------------------------------------------------------------------------------------
TEXT_MODELS = {
    "bert-post-ln": (WideNetForPreTraining, dict(preset="bert-tiny-factorized", hidden_dropout=0.0,
                                                 attention_dropout=0.0)),
    "widenet-pre-ln": (WideNetForSequenceClassification, dict(preset="widenet-tiny-e4", norm_position="pre")),
}


def text_folder(name: str, path: Path):
    cls, spec = TEXT_MODELS[name]
    spec = dict(spec)
    cfg = ModelConfig.from_preset(spec.pop("preset"), vocab_size=64, num_layers=4, num_branches=2, **spec)
    kwargs = {"num_labels": 3} if cls is WideNetForSequenceClassification else {}
    torch.manual_seed(0)
    model = perturbed(cls(cfg, **kwargs))
    save_folder(PortableCheckpoint(cfg, cls.__name__, model.state_dict(), kwargs.get("num_labels")), path)
    return model, path


def text_logits(model, ids, mask, branches=None) -> torch.Tensor:
    with torch.no_grad():
        out = model(ids, attention_mask=mask, branches=branches)
    return out.mlm_logits if isinstance(model, WideNetForPreTraining) else out.logits


def text_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 64, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    return ids, mask


@pytest.mark.parametrize("name", list(TEXT_MODELS))
def test_text_k_branch_folder_gives_the_full_models_k_prefix_logits(dist, tmp_path, name):
    model, full = text_folder(name, tmp_path / "full")
    ids, mask = text_inputs()
    for k in (1, 2):
        assert widenet_ds_main(["branches", "compress", str(full), str(tmp_path / f"k{k}"), "--branches", str(k)]) == 0
        small, _ = load_pretrained(type(model), tmp_path / f"k{k}")
        assert (small.cfg.num_branches, small.cfg.num_layers) == (k, 2 * k)
        want, got = text_logits(model, ids, mask, branches=k), text_logits(small.eval(), ids, mask)
        assert torch.allclose(got, want, atol=1e-6, rtol=0), (k, (got - want).abs().max().item())
    assert not torch.allclose(text_logits(model, ids, mask, 1), text_logits(model, ids, mask, 2), atol=1e-3)


@pytest.mark.parametrize("name", list(TEXT_MODELS))
def test_text_expansion_keeps_the_old_outputs(dist, tmp_path, name):
    model, full = text_folder(name, tmp_path / "full")
    assert widenet_ds_main(["branches", "expand", str(full), str(tmp_path / "wide"), "--branches", "3"]) == 0
    wide, report = load_pretrained(type(model), tmp_path / "wide")
    assert not report.new and wide.cfg.num_branches == 3 and wide.cfg.num_layers == 6
    ids, mask = text_inputs()
    old = text_logits(model, ids, mask)
    assert torch.allclose(text_logits(wide.eval(), ids, mask, branches=2), old, atol=1e-6, rtol=0)
    with torch.no_grad():  # the body's output: a fresh classifier's logits are too small to show it
        body_old = model.widenet(ids, attention_mask=mask).sequence
        assert torch.allclose(wide.widenet(ids, attention_mask=mask, branches=2).sequence, body_old, atol=1e-5)
        assert not torch.allclose(wide.widenet(ids, attention_mask=mask).sequence, body_old, atol=1e-2)


# --- a real run continued from an expanded folder ------------------------------------------------------
DIGITS_MODEL = ["--model-config", "paraformer-tiny-3x4", "--set", "image_size=8", "--set", "patch_size=2",
                "--set", "num_layers=4", "--set", "num_branches=2"]


def run_classify(tmp_path: Path, out: Path, steps: int, *extra: str) -> None:
    config = json.loads((REPO / "ds_configs" / "paraformer_cpu_small.json").read_text())
    config.update(train_batch_size=32, train_micro_batch_size_per_gpu=32)
    config["scheduler"]["params"].update(total_num_steps=steps, warmup_num_steps=max(1, steps // 10))
    ds = tmp_path / f"ds{steps}.json"
    ds.write_text(json.dumps(config))
    proc = subprocess.run(python_train_command("classify", [
        *DIGITS_MODEL, "--dataset", "digits", "--deepspeed_config", str(ds), "--output-dir", str(out),
        "--eval-interval", "0", "--workers", "0", "--no-progress-bar", "--no-tensorboard", *extra]),
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.mark.slow  # a 40-step run, a refused start and 10 steps after the expansion (23 s of CPU)
def test_training_continues_from_an_expanded_folder(dist, tmp_path):
    run_classify(tmp_path, tmp_path / "old", 40, "--log-interval", "5")
    assert widenet_ds_main(["convert", "to-folder", str(tmp_path / "old"), str(tmp_path / "two")]) == 0
    # the trained run's first branch alone: the full model's 1-prefix
    assert widenet_ds_main(["branches", "compress", str(tmp_path / "two"), str(tmp_path / "one"), "--branches", "1"]) == 0
    trained, first = load_image_folder(tmp_path / "two"), load_image_folder(tmp_path / "one")
    pixels = torch.rand(8, 1, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        assert torch.equal(first(pixels).logits, trained(pixels, branches=1).logits)
        assert not torch.allclose(first(pixels).logits, trained(pixels).logits, atol=1e-3)
    assert widenet_ds_main(["branches", "expand", str(tmp_path / "two"), str(tmp_path / "three"), "--branches", "3"]) == 0
    # the preset's layout instead of the folder's: refused, naming the fix
    proc = subprocess.run(python_train_command("classify", [
        *DIGITS_MODEL, "--dataset", "digits", "--deepspeed_config",
        str(REPO / "ds_configs" / "paraformer_cpu_small.json"), "--output-dir", str(tmp_path / "wrong"),
        "--init-from", str(tmp_path / "three")]),
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "--set num_branches=3 --set num_layers=6" in proc.stdout + proc.stderr
    run_classify(tmp_path, tmp_path / "new", 10, "--log-interval", "1", "--init-from", str(tmp_path / "three"),
                 "--set", "num_layers=6", "--set", "num_branches=3")
    old, new = train_losses(tmp_path / "old"), train_losses(tmp_path / "new")
    first_old, last_old, first_new = old[min(old)], old[max(old)], new[min(new)]
    # a fresh start sits near chance (ln 10 = 2.30); the continued run starts near where the old one ended
    assert first_old > math.log(10) - 0.2 and last_old < first_old - 0.6, old
    assert abs(first_new - last_old) < 0.5 and first_new < math.log(10) - 0.4, (first_new, last_old)
    assert any(str(tmp_path / "three") in e for e in events(tmp_path / "new"))
    results = json.loads((tmp_path / "new" / "results.json").read_text())
    assert sorted(results["accuracy_by_branches"]) == ["1", "2", "3"]
    # the accuracy-per-k table and plot of both runs (the report's ParaFormer section)
    md = tmp_path / "branches.md"
    assert widenet_ds_main(["report", str(tmp_path / "old"), str(tmp_path / "new"), "--output",
                            str(tmp_path / "report"), "--branches-table", str(md)]) == 0
    table = md.read_text().splitlines()[2:]
    assert table[0] == "| run | k = 1 | k = 2 | k = 3 |"
    assert table[3] == "| new | " + " | ".join(f"{results['accuracy_by_branches'][k]:.4f}" for k in "123") + " |"
    assert table[2].startswith("| old | ") and table[2].endswith(" |  |")  # the old run has no third branch
    assert (tmp_path / "report" / "accuracy_by_branches.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"old run: loss {first_old:.3f} -> {last_old:.3f}; continued with 3 branches from {first_new:.3f}\n"
          + md.read_text())


# --- errors -------------------------------------------------------------------------------------------
def test_bad_branch_counts_and_unbranched_models_are_clear_errors(dist, tmp_path, capsys):
    cfg = VisionConfig.from_preset("paraformer-tiny-3x4")
    state = ViTWideNetForImageClassification(cfg).state_dict()
    for k in (0, 4, 1.5):
        with pytest.raises(ConfigError, match=r"in 1\.\.3; the model has 3 branches of 4 layers"):
            compress(cfg.to_dict(), state, k)
    with pytest.raises(ConfigError, match="of at least 4; the model has 3 already"):
        expanded_config(cfg.to_dict(), 3)
    with pytest.raises(ConfigError, match=r"no branches \(num_branches = 1\)"):
        compress(VisionConfig.from_preset("paraformer-tiny-1x12").to_dict(), state, 1)
    short = {k: v for k, v in state.items() if not k.startswith("encoder.ffn_norm.11.")}
    with pytest.raises(CheckpointError, match=r"encoder.ffn_norm has blocks 0..10 \(11 of them\), the config says 3 "
                                              r"branches x 4 layers"):
        compress(cfg.to_dict(), short, 2)
    fresh = ViTWideNetForImageClassification(VisionConfig.from_dict(expanded_config(cfg.to_dict(), 4))).state_dict()
    with pytest.raises(CheckpointError, match="unexpected.*classifier.extra"):
        expand(cfg.to_dict(), {**state, "classifier.extra": torch.zeros(1)}, 4, fresh)
    # through the commands: exit code 2, the message, and no output folder (not even a partial one)
    _, full = vision_folder("paraformer-tiny-3x4", tmp_path / "full")
    assert widenet_ds_main(["branches", "compress", str(full), str(tmp_path / "out"), "--branches", "5"]) == 2
    assert "in 1..3" in capsys.readouterr().err
    _, text = text_folder("bert-post-ln", tmp_path / "text")
    assert widenet_ds_main(["branches", "expand", str(text), str(tmp_path / "out"), "--branches", "2"]) == 2
    assert "of at least 3" in capsys.readouterr().err
    _, sequential = vision_folder("paraformer-tiny-1x12", tmp_path / "sequential")
    assert widenet_ds_main(["branches", "compress", str(sequential), str(tmp_path / "out"), "--branches", "1"]) == 2
    assert "no branches (num_branches = 1)" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full", "sequential", "text"]
    assert read_folder(text).config.num_branches == 2  # the sources are untouched
    assert read_folder(full).config.num_branches == 3
