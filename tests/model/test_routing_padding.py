"""Padding stays out of the experts (widenet_ds/model/routing.py): a padding position gets no route, takes no
capacity slot and no share of the balance loss or the routing counts, in both dispatches, with routing groups
and branches; `moe.route_padding = true` routes it as the paper does (and as every run before the switch did:
the SST-2 golden curve under the switch is the one recorded before it, tests/integration/test_golden_losses.py).
Expert parallelism: tests/integration/test_padding_routing_ep2.py."""

from __future__ import annotations

import pytest
import torch

from widenet_ds.model.config import ModelConfig, MoEConfig
from widenet_ds.model.routing import route_tokens
from widenet_ds.model.widenet import WideNetForSequenceClassification

pytestmark = pytest.mark.usefixtures("dist")

DISPATCHES = ["deepspeed", "dropless"]


def _logits(padding: torch.Tensor) -> torch.Tensor:
    """[T, E] logits: real tokens from a fixed draw; padding positions pushed hard onto expert 0 and placed
    first, so that, routed, they would fill expert 0's slots before any real token."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(padding.numel(), 4, generator=g)
    logits[padding] = torch.tensor([9.0, 8.0, 0.0, 0.0]) + torch.randn(int(padding.sum()), 4, generator=g)
    return logits


@pytest.mark.parametrize("dispatch", DISPATCHES)
@pytest.mark.parametrize("training", [True, False])
def test_padding_positions_change_no_decision_capacity_or_balance_loss(dispatch, training):
    cfg = MoEConfig(num_experts=4, top_k=2, capacity_factor=1.0, eval_capacity_factor=1.0, min_capacity=0,
                    noise="none", dispatch=dispatch)
    real = torch.ones(24, dtype=torch.bool)
    real[:10] = False                                       # 10 padding positions, before every real token
    logits = _logits(~real)
    other = logits.clone()
    other[~real] = torch.randn(10, 4) * 5                   # any other padding content
    a = route_tokens(logits, cfg, training=training, token_mask=real)
    b = route_tokens(other, cfg, training=training, token_mask=real)
    for routing in (a, b):
        assert torch.all(routing.expert_index[:, ~real] == -1) and torch.all(routing.weight[:, ~real] == 0)
        assert int(routing.expert_counts.sum()) == 2 * int(real.sum())      # real routes only
    assert a.capacity == b.capacity == (0 if dispatch == "dropless" else 2 * 24 // 4)   # T counts every position
    for name in ("expert_index", "location", "weight", "expert_counts", "balance_loss"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    if dispatch == "deepspeed":
        assert torch.equal(a.slot, b.slot)
    assert torch.equal(a.dropped_routes, b.dropped_routes)

    # The real tokens are routed as if the padding were not there (the same capacity given by min_capacity).
    alone_cfg = MoEConfig(**{**cfg.__dict__, "capacity_factor": 0.01, "eval_capacity_factor": 0.01,
                             "min_capacity": a.capacity})
    alone = route_tokens(logits[real], alone_cfg, training=training)
    assert alone.capacity == a.capacity
    for name in ("expert_index", "location", "weight"):
        assert torch.equal(getattr(a, name)[:, real], getattr(alone, name)), name
    assert torch.equal(a.expert_counts, alone.expert_counts)
    torch.testing.assert_close(a.balance_loss, alone.balance_loss, rtol=1e-6, atol=0)

    # Paper-literal (no mask): the same padding takes expert 0's slots and real routes are lost to it.
    literal = route_tokens(logits, cfg, training=training)
    assert int(literal.expert_counts.sum()) == 2 * 24
    assert not torch.equal(literal.balance_loss, a.balance_loss)
    if dispatch == "deepspeed":
        real_dropped = lambda r: int((r.expert_index[:, real] == -1).sum())  # noqa: E731
        assert real_dropped(literal) > real_dropped(a)


def test_an_all_padding_call_routes_nothing_and_has_no_balance_loss():
    cfg = MoEConfig(noise="none")
    r = route_tokens(torch.randn(8, 4), cfg, training=True, token_mask=torch.zeros(8, dtype=torch.bool))
    assert torch.all(r.expert_index == -1) and torch.all(r.weight == 0)
    assert int(r.expert_counts.sum()) == 0 and float(r.balance_loss) == 0.0


def _batch():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 200, (3, 16), generator=g)
    mask = torch.ones_like(ids)
    mask[0, 5:] = 0                                          # 11 padding positions
    mask[2, 12:] = 0
    other = ids.masked_fill(mask == 0, 7)                    # the same real tokens, other padding ids
    return ids, other, mask


@pytest.mark.parametrize("dispatch", DISPATCHES)
@pytest.mark.parametrize("layout", [{}, {"routing_groups": 2}, {"num_branches": 2}], ids=["blocks", "groups", "branches"])
def test_padding_content_changes_nothing_the_real_tokens_get(dispatch, layout):
    ids, other, mask = _batch()
    labels = torch.tensor([0, 1, 1])
    results = {}
    for route_padding in (False, True):
        torch.manual_seed(0)
        cfg = ModelConfig.from_preset("widenet-tiny-e4", vocab_size=200, hidden_dropout=0.0, attention_dropout=0.0,
                                      classifier_dropout=0.0, **layout,
                                      moe={"dispatch": dispatch, "noise": "none", "capacity_factor": 1.0,
                                           "min_capacity": 0, "route_padding": route_padding})
        model = WideNetForSequenceClassification(cfg, num_labels=2).train()
        outs = []
        for batch_ids in (ids, other):
            out = model(batch_ids, attention_mask=mask, labels=labels)
            out.loss.backward()
            grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
            model.zero_grad()
            outs.append((out, grads))
        results[route_padding] = outs
    (a, grads_a), (b, grads_b) = results[False]
    assert torch.equal(a.logits, b.logits) and torch.equal(a.balance_loss, b.balance_loss)
    assert torch.equal(a.routing.expert_counts, b.routing.expert_counts)
    assert torch.equal(a.routing.dropped_fraction, b.routing.dropped_fraction)
    assert int(a.routing.expert_counts[0].sum()) == 2 * int(mask.sum()) * (2 if "num_branches" in layout else 1)
    # Gradients too, except the embedding rows of the padding ids themselves (attention never reads padding,
    # the MoE gives it no route; its own residual stream still trains its embeddings, unread by anyone).
    for name in grads_a:
        if name.endswith("embeddings.word.weight"):
            keep = torch.ones(grads_a[name].shape[0], dtype=torch.bool)
            keep[ids[mask == 0]] = False
            keep[7] = False
            assert torch.equal(grads_a[name][keep], grads_b[name][keep]), name
        else:
            assert torch.equal(grads_a[name], grads_b[name]), name
    # Paper-literal: padding routes, so its content moves the balance loss (and the counts see every position).
    (la, _), (lb, _) = results[True]
    assert not torch.equal(la.balance_loss, lb.balance_loss)
    assert int(la.routing.expert_counts[0].sum()) == 2 * mask.numel() * (2 if "num_branches" in layout else 1)


def test_route_padding_is_stored_only_when_set():
    cfg = ModelConfig.from_preset("widenet-tiny-e4")
    assert "route_padding" not in cfg.to_dict()["moe"]        # presets and old configs: the same bytes and hash
    assert cfg.moe.route_padding is False
    literal = cfg.replace(moe={"route_padding": True})
    assert literal.to_dict()["moe"]["route_padding"] is True
    assert ModelConfig.from_dict(literal.to_dict()) == literal
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
