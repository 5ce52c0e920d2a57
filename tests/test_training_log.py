"""PretrainMetrics on real model outputs; TrainingLog's TensorBoard and metrics.jsonl read back."""

from __future__ import annotations

import pytest
import torch

from widenet_ds.model.config import ModelConfig
from widenet_ds.run_folder import RunFolder, read_metrics
from widenet_ds.training.log import TrainingLog
from widenet_ds.training.metrics import PretrainMetrics


def model_and_batch(preset="widenet-tiny-e4"):
    from widenet_ds.model.widenet import WideNetForPreTraining

    torch.manual_seed(0)
    model = WideNetForPreTraining(ModelConfig.from_preset(preset, vocab_size=200, max_position_embeddings=32))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 200, (4, 16), generator=g)
    mask = torch.ones_like(ids)
    mask[0, 10:] = 0
    batch = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": mask,
             "mlm_labels": torch.where(torch.rand(4, 16, generator=g) < 0.3, ids, -100),
             "sop_labels": torch.tensor([0, 1, 1, 0])}
    return model, batch


def test_step_metrics_average_losses_and_count_accuracy_over_micro_batches(dist):
    model, batch = model_and_batch()
    metrics = PretrainMetrics(blocks_of_calls=[0, 1, 2, 3], num_experts=4)
    outputs = [model(**batch) for _ in range(2)]  # gate noise: two different micro-batch outputs
    for out in outputs:
        metrics.add(out, batch)
    scalars, counts = metrics.reduce("train")
    assert scalars["train/loss"] == pytest.approx(sum(o.loss.item() for o in outputs) / 2)
    predicted = batch["mlm_labels"] != -100
    correct = sum(((o.mlm_logits.argmax(-1) == batch["mlm_labels"]) & predicted).sum().item() for o in outputs)
    assert scalars["train/mlm_accuracy"] == pytest.approx(correct / (2 * predicted.sum().item()))
    assert counts == {"samples": 8, "tokens": 2 * (64 - 6)}
    for block in range(4):
        loads = [scalars[f"moe/block_{block:02d}/expert_{e:02d}_load"] for e in range(4)]
        assert sum(loads) == pytest.approx(1.0)
        expected = sum(o.routing.expert_counts[block].double() for o in outputs)
        assert loads == pytest.approx((expected / expected.sum()).tolist())
        assert 0 <= scalars[f"moe/block_{block:02d}/dropped_fraction"] < 1
    metrics.add(outputs[0], batch)  # reduce() started a new window
    assert metrics.reduce("train")[0]["train/loss"] == pytest.approx(outputs[0].loss.item())


def test_dense_model_has_no_moe_scalars(dist):
    model, batch = model_and_batch("albert-tiny")
    metrics = PretrainMetrics(blocks_of_calls=[], num_experts=0)
    metrics.add(model(**batch), batch)
    scalars, _ = metrics.reduce("valid")
    assert not any(name.startswith("moe/") for name in scalars)
    assert set(scalars) == {f"valid/{n}" for n in ("loss", "mlm_loss", "sop_loss", "balance_loss",
                                                   "mlm_accuracy", "sop_accuracy")}


def test_log_writes_tensorboard_and_jsonl_and_a_resume_rewrites_later_steps(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = TrainingLog(RunFolder(tmp_path), enabled=True, tensorboard=True, progress_bar=False, start_step=0, max_steps=4)
    for step in range(1, 5):
        log.record(step, {"optim/lr": 0.1 * step, "x/y": 1.0 / 3.0 + step})
    log.event(4, "checkpoint saved")
    log.close()
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in metrics.records] == [1, 2, 3, 4] and [e["step"] for e in metrics.events] == [4]
    assert metrics.records[0]["x/y"] == 1.0 / 3.0 + 1  # full float repr, bit for bit

    # Resume from step 2: records of steps 3-4 of the interrupted run go, the new ones come after.
    log = TrainingLog(RunFolder(tmp_path), enabled=True, tensorboard=True, progress_bar=False, start_step=2, max_steps=4)
    log.record(3, {"optim/lr": 0.33, "x/y": 7.0})
    log.close()
    assert [(r["step"], r.get("optim/lr")) for r in read_metrics(tmp_path / "metrics.jsonl").records] == \
        [(1, 0.1), (2, 0.2), (3, 0.33)]
    accumulator = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    accumulator.Reload()
    assert [(e.step, round(e.value, 6)) for e in accumulator.Scalars("optim/lr")] == [(1, 0.1), (2, 0.2), (3, 0.33)]


def test_disabled_log_on_other_ranks_writes_nothing(tmp_path):
    log = TrainingLog(RunFolder(tmp_path / "out"), enabled=False, tensorboard=True, progress_bar=True, start_step=0,
                      max_steps=1)
    log.record(1, {"optim/lr": 1.0})
    log.event(1, "x")
    log.close()
    assert not (tmp_path / "out").exists()
