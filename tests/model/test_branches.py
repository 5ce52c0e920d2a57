"""ParaFormer's branch layout on the WideNet encoder: exact parameter counts at the paper's dims, the batched
branch computation against a plain per-branch reference, the schedules, and on a real DeepSpeed engine that
a prefix step moves exactly the active branches and the shared parts (resting branches keep weights and
optimizer state bit for bit)."""

from __future__ import annotations

import json

import deepspeed
import pytest
import torch

from tests.support.launching import REPO
from widenet_ds.distributed.groups import init_distributed
from widenet_ds.engine.build import build_engine
from widenet_ds.engine.ds_config import load_ds_config, validate_ds_config
from widenet_ds.errors import ConfigError
from widenet_ds.model.config import ModelConfig
from widenet_ds.model.widenet import WideNetForSequenceClassification
from widenet_ds.training.branch_schedule import (
    BranchSchedule,
    check_branch_updates_isolated,
)
from widenet_ds.vision.config import VisionConfig
from widenet_ds.vision.model import (
    ViTWideNetForImageClassification,
    build_model,
    count_trainable_parameters,
)


# --- parameter counts: a hand count of the authors' modules ---------------------------------------------
def paraformer_layer(hidden: int, heads: int, head_dim: int, ffn: int) -> int:
    """One layer of the authors' code: PreNorm(Attention) + PreNorm(FeedForward)."""
    to_qkv = hidden * 3 * heads * head_dim          # Linear(dim, inner*3, bias=False)
    to_out = heads * head_dim * hidden + hidden      # Linear(inner, dim)
    feed_forward = hidden * ffn + ffn + ffn * hidden + hidden
    layer_norms = 2 * 2 * hidden
    return to_qkv + to_out + feed_forward + layer_norms


def paraformer_model(layers: int, image: int, patch: int, channels: int, classes: int, hidden: int = 192) -> int:
    patches = (image // patch) ** 2
    embedding = patch * patch * channels * hidden + hidden   # Rearrange + Linear(p*p*C, dim)
    cls_and_positions = hidden + (patches + 1) * hidden
    head = 2 * hidden + hidden * classes + classes           # LayerNorm + Linear
    return embedding + cls_and_positions + layers * paraformer_layer(hidden, 3, 64, 4 * hidden) + head


def test_paraformer_layer_is_444288_parameters_at_the_papers_dims():
    assert paraformer_layer(192, 3, 64, 768) == 444_288
    one = count_trainable_parameters(build_model(VisionConfig.from_preset("paraformer-1x12"), device="meta"))
    two = count_trainable_parameters(build_model(VisionConfig.from_preset("paraformer-1x12", num_layers=13,
                                                                          num_branches=1), device="meta"))
    assert two - one == 444_288


@pytest.mark.parametrize("preset,layers", [("paraformer-12x1", 12), ("paraformer-6x2", 12), ("paraformer-4x3", 12),
                                           ("paraformer-3x4", 12), ("paraformer-2x6", 12), ("paraformer-1x12", 12),
                                           ("paraformer-24x1", 24), ("paraformer-12x2", 24), ("paraformer-6x4", 24),
                                           ("paraformer-4x6", 24), ("paraformer-2x12", 24)])
def test_table1_variants_have_the_hand_counted_size(preset, layers):
    cfg = VisionConfig.from_preset(preset)
    assert cfg.num_layers == layers and cfg.num_branches * cfg.layers_per_branch == layers
    model = build_model(cfg, device="meta")
    assert count_trainable_parameters(model) == paraformer_model(layers, 224, 16, 3, 10)
    # 5.52M and 10.85M, as the paper's 12- and 24-layer rows
    assert round(count_trainable_parameters(model) / 1e6, 2) == {12: 5.52, 24: 10.85}[layers]


def test_widenet_x_paraformer_shares_attention_and_one_moe_with_layer_norms_per_layer():
    cfg = VisionConfig.from_preset("widenet-paraformer-3x4")
    model = build_model(cfg, device="meta")
    hidden, experts, ffn = 192, cfg.moe.num_experts, 768
    attention = hidden * 3 * hidden + hidden * hidden + hidden
    moe = hidden * experts + experts * (hidden * ffn + ffn + ffn * hidden + hidden)   # router + experts
    norms = 12 * 2 * 2 * hidden
    outside = paraformer_model(0, 224, 16, 3, 10)
    assert count_trainable_parameters(model) == outside + attention + moe + norms
    assert len(model.encoder.attention) == 1 and len(model.encoder.ffn) == 1
    assert len(model.encoder.attention_norm) == 12


# --- the batched computation against a per-branch reference ---------------------------------------------
def reference_logits(model: ViTWideNetForImageClassification, pixels: torch.Tensor, branches: int) -> torch.Tensor:
    """Each branch run alone, block after block (the encoder's sequential block code), then summed."""
    encoder, cfg = model.encoder, model.cfg
    x0 = model.embeddings(pixels)
    total = torch.zeros_like(x0)
    for branch in range(branches):
        x = x0
        for depth in range(cfg.layers_per_branch):
            x, _ = encoder._block(branch * cfg.layers_per_branch + depth, x, None, None)
        total = total + x
    pooled = encoder.final_norm(total)[:, 0]
    return model.classifier(pooled)


@pytest.mark.parametrize("preset", ["paraformer-tiny-3x4", "paraformer-tiny-4x3"])
def test_batched_branches_equal_each_branch_run_alone(preset):
    torch.manual_seed(0)
    model = ViTWideNetForImageClassification(VisionConfig.from_preset(preset)).eval()
    pixels = torch.randn(5, 1, 28, 28)
    for k in range(1, model.cfg.num_branches + 1):
        torch.testing.assert_close(model(pixels, branches=k).logits, reference_logits(model, pixels, k),
                                   atol=1e-5, rtol=1e-5)
    # the prefixes differ from each other: the test would catch a branch ignored by the batched path
    assert not torch.allclose(model(pixels, branches=1).logits, model(pixels, branches=2).logits, atol=1e-3)


def test_text_body_branches_post_ln_equal_reference():
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset("bert-tiny-factorized", vocab_size=64, num_layers=4, num_branches=2,
                                  hidden_dropout=0.0, attention_dropout=0.0)
    model = WideNetForSequenceClassification(cfg, num_labels=3).eval()
    ids = torch.randint(0, 64, (3, 9))
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    encoder = model.widenet.encoder
    x0 = model.widenet.embeddings(ids, torch.zeros_like(ids))
    attend = mask.bool()[:, None, None, :]
    total = sum(encoder._block(2 * b + 1, encoder._block(2 * b, x0, attend, None)[0], attend, None)[0]
                for b in range(2))
    expected = model.classifier(torch.tanh(model.widenet.pooler(total[:, 0])))
    torch.testing.assert_close(model(ids, attention_mask=mask).logits, expected, atol=1e-5, rtol=1e-5)


def test_widenet_x_paraformer_routes_once_per_depth_over_all_active_branches():
    torch.manual_seed(0)
    cfg = VisionConfig.from_preset("widenet-paraformer-tiny-3x4")
    model = ViTWideNetForImageClassification(cfg).eval()
    out = model(torch.randn(2, 1, 28, 28), branches=2)
    assert out.routing.expert_counts.shape == (4, cfg.moe.num_experts)  # 4 depths
    # 2 branches x 2 images x (16 patches + CLS), top-2 routes each
    assert out.routing.expert_counts.sum(-1).tolist() == [2 * 2 * 17 * 2] * 4


def test_branch_layout_errors_name_the_fix():
    with pytest.raises(ConfigError, match="must divide num_layers"):
        VisionConfig.from_preset("paraformer-tiny-3x4", num_branches=5)
    with pytest.raises(ConfigError, match="same function"):
        ModelConfig.from_preset("albert-tiny", num_branches=2)
    with pytest.raises(ConfigError, match="pre-LN form"):
        ModelConfig.from_preset("widenet-tiny-e4", residual="normed")
    model = ViTWideNetForImageClassification(VisionConfig.from_preset("paraformer-tiny-3x4"))
    with pytest.raises(ConfigError, match="pick 1..3"):
        model(torch.randn(1, 1, 28, 28), branches=4)


# --- schedules ----------------------------------------------------------------------------------------
def test_prefix_schedule_follows_the_authors_phases_and_resumes_between_batches():
    schedule = BranchSchedule.build("prefix", 3, batches_per_epoch=100, cycle_batches=2)
    counts = [schedule.branch_counts(batch, 0) for batch in range(6)]
    assert counts == [[1, 2, 3], [1, 2, 3], [3], [3], [1, 2, 3], [1, 2, 3]]
    step = 0
    for batch in range(9):
        assert schedule.batch_at_step(step) == batch
        step += len(schedule.branch_counts(batch, step))
    with pytest.raises(ConfigError, match="inside a batch"):
        schedule.batch_at_step(1)
    assert [schedule.end_step(s) for s in (5, 6, 7, 9, 13)] == [6, 6, 7, 11, 14]
    assert BranchSchedule.build("prefix", 3, batches_per_epoch=100).cycle_batches == 100  # one epoch by default


def test_staged_schedule_adds_a_branch_at_each_threshold():
    schedule = BranchSchedule.build("staged", 3, batches_per_epoch=10, stage_steps=[5])
    assert [schedule.branch_counts(s, s)[0] for s in (0, 4, 5, 9, 10, 50)] == [1, 1, 2, 2, 3, 3]
    with pytest.raises(ConfigError, match="give one value or 2"):
        BranchSchedule.build("staged", 3, batches_per_epoch=10, stage_steps=[1, 2, 3])
    with pytest.raises(ConfigError, match="needs --stage-steps"):
        BranchSchedule.build("staged", 3, batches_per_epoch=10)
    with pytest.raises(ConfigError, match="needs a model with branches"):
        BranchSchedule.build("prefix", 1, batches_per_epoch=10)


@pytest.mark.parametrize("stage,precision", [(1, None), (2, None), (0, "bf16")])
def test_schedules_refuse_set_ups_that_would_update_resting_branches(tmp_path, stage, precision):
    config = json.loads((REPO / "ds_configs" / "paraformer_cpu_small.json").read_text())
    config["zero_optimization"]["stage"] = stage
    if precision:
        config[precision] = {"enabled": True}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    ds = validate_ds_config(load_ds_config(path), world_size=1, has_moe=False, cuda_available=precision is not None)
    with pytest.raises(ConfigError, match="no update of any kind.*ZeRO stage 0"):
        check_branch_updates_isolated(ds, "prefix")


# --- a real DeepSpeed engine: resting branches do not move ----------------------------------------------
def branch_tensors(model, branch: int) -> dict[str, torch.Tensor]:
    owned = {id(p) for m in model.encoder.branch_modules(branch) for p in m.parameters()}
    return {n: p.detach().clone() for n, p in model.named_parameters() if id(p) in owned}


def shared_tensors(model) -> dict[str, torch.Tensor]:
    owned = {id(p) for b in range(model.cfg.num_branches) for m in model.encoder.branch_modules(b)
             for p in m.parameters()}
    return {n: p.detach().clone() for n, p in model.named_parameters() if id(p) not in owned}


def optimizer_state(engine, model, names) -> dict[str, dict]:
    params = dict(model.named_parameters())
    return {n: {k: v.clone() if torch.is_tensor(v) else v for k, v in engine.optimizer.state.get(params[n], {}).items()}
            for n in names}


@pytest.mark.parametrize("optimizer", ["AdamW", "Lamb"])
@pytest.mark.parametrize("preset", ["paraformer-tiny-3x4", "widenet-paraformer-tiny-3x4"])
def test_prefix_steps_move_only_active_branches_and_shared_parts(tmp_path, preset, optimizer):
    init_distributed()
    config = json.loads((REPO / "ds_configs" / "paraformer_cpu_small.json").read_text())
    config.update(train_batch_size=4, train_micro_batch_size_per_gpu=4)
    config["scheduler"]["params"].update(warmup_num_steps=1)
    if optimizer == "Lamb":
        config["optimizer"] = {"type": "Lamb", "params": {"lr": 0.002, "weight_decay": 0.01}}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    ds = validate_ds_config(load_ds_config(path), world_size=1, has_moe="widenet" in preset, cuda_available=False)
    torch.manual_seed(0)
    model = ViTWideNetForImageClassification(VisionConfig.from_preset(preset, num_layers=6, num_branches=3))
    engine, _ = build_engine(model, ds)
    pixels, labels = torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,))

    def step(k: int) -> None:
        model.encoder.set_trainable_branches(k)
        engine.backward(engine(pixels, labels, branches=k).loss)
        engine.step()

    resting = branch_tensors(model, 2)
    before = {b: branch_tensors(model, b) for b in range(3)}
    shared = shared_tensors(model)
    for k in (1, 2, 1, 2):  # prefixes of the first two branches, four optimizer steps
        step(k)
    after = {b: branch_tensors(model, b) for b in range(3)}
    for name, tensor in resting.items():
        assert torch.equal(after[2][name], tensor), f"resting branch 2 moved: {name}"
    assert optimizer_state(engine, model, resting) == {n: {} for n in resting}, "resting branch got optimizer state"
    for b in (0, 1):
        assert all(not torch.equal(after[b][n], before[b][n]) for n in before[b]), f"branch {b} did not train"
    moved = [n for n, t in shared_tensors(model).items() if not torch.equal(t, shared[n])]
    assert "classifier.weight" in moved and "encoder.final_norm.weight" in moved
    assert any(n.startswith("embeddings.") for n in moved)
    if "widenet" in preset:  # the shared attention and MoE train with every prefix
        assert any(".attention.0." in n for n in moved) and any("experts" in n for n in moved)
    step(3)  # the joint step reaches branch 2
    assert all(not torch.equal(p, resting[n]) for n, p in branch_tensors(model, 2).items())
    deepspeed.comm.barrier()
