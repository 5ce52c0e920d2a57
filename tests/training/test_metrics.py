"""Window sums on real model outputs: losses averaged over micro-batches, accuracies counted, expert load per
routing call, a new window after each reduction, no MoE scalars for a dense model, branch-parallel replicas
counted once."""

from __future__ import annotations

import pytest
import torch

from widenet_ds.model.config import ModelConfig
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


def test_the_ranks_of_a_branch_group_count_their_examples_once(dist):
    """Branch parallelism: every rank of a group reduces the same examples' figures; counts are one copy's,
    averages and expert loads as they are."""
    model, batch = model_and_batch()
    out = model(**batch)
    once, replicated = PretrainMetrics([0, 1, 2, 3], 4), PretrainMetrics([0, 1, 2, 3], 4, replicas=2)
    once.add(out, batch)
    for _ in range(2):  # what two replicas contribute to the all-reduce
        replicated.add(out, batch)
    (scalars, counts), (scalars2, counts2) = once.reduce("train"), replicated.reduce("train")
    assert counts2 == counts
    assert scalars2 == pytest.approx(scalars)
