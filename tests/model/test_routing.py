"""Routing of the shared MoE on small hand-checked cases, and parity with DeepSpeed's gate."""

import math

import pytest
import torch
from deepspeed.moe.sharded_moe import _capacity, _route_slots, top2gating

from widenet_ds.model.config import ModelConfig, MoEConfig
from widenet_ds.model.moe import FeedForward, MoEFeedForward, WideNetGate
from widenet_ds.model.routing import expert_capacity, route_tokens
from widenet_ds.model.widenet import WideNetForPreTraining

pytestmark = pytest.mark.usefixtures("dist")


def test_capacity_formula():
    # B = ceil(K * C * T / E)
    assert expert_capacity(10, 4, 2, 1.2) == 6
    assert expert_capacity(4096, 8, 2, 1.2) == math.ceil(2 * 1.2 * 4096 / 8) == 1229
    assert expert_capacity(25, 4, 2, 1.2) == 15          # 2 * 1.2 * 25 / 4 = 15 exactly
    # DeepSpeed's float32 capacity adds a slot here; ours follows the formula exactly.
    assert int(_capacity(torch.zeros(25, 4), torch.tensor(1.2 * 2), torch.tensor(0))) == 16
    cfg = MoEConfig(num_experts=4, top_k=2, capacity_factor=1.2, min_capacity=0, noise="none")
    assert route_tokens(torch.randn(10, 4), cfg, training=True).capacity == 6
    cfg = MoEConfig(num_experts=4, top_k=2, capacity_factor=0.1, min_capacity=4, noise="none")
    assert route_tokens(torch.randn(10, 4), cfg, training=True).capacity == 4   # min_capacity wins


def test_overflowing_tokens_are_dropped_in_arrival_order():
    # 6 tokens, 3 experts, top-2, C = 0.5 -> capacity ceil(2 * 0.5 * 6 / 3) = 2.
    # Every token's first choice is expert 0, second choice expert 1 (tokens 0-3) or 2 (tokens 4-5).
    logits = torch.tensor([[3.0, 2.0, 0.0]] * 4 + [[3.0, 0.0, 2.0]] * 2)
    cfg = MoEConfig(num_experts=3, top_k=2, capacity_factor=0.5, min_capacity=0, noise="none",
                    combine_weights="raw")
    r = route_tokens(logits, cfg, training=True)
    assert r.capacity == 2
    # first choices: tokens 0, 1 fit expert 0; tokens 2-5 overflow
    assert r.expert_index[0].tolist() == [0, 0, -1, -1, -1, -1]
    assert r.location[0].tolist()[:2] == [0, 1]
    # second choices go after ALL first choices (DeepSpeed's order): expert 1 has no first choices, so
    # tokens 0, 1 take its two slots; expert 2 takes tokens 4, 5.
    assert r.expert_index[1].tolist() == [1, 1, -1, -1, 2, 2]
    assert r.expert_counts.tolist() == [6, 4, 2]
    assert int(r.dropped_routes) == 6
    # raw combine weights are the softmax probabilities themselves
    probs = torch.softmax(logits, dim=1)
    assert torch.allclose(r.weight[0, :2], probs[:2, 0]) and torch.allclose(r.weight[1, 4:], probs[4:, 2])
    assert torch.all(r.weight[0, 2:] == 0)


def test_dropped_tokens_skip_the_experts():
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset("widenet-tiny-e4", hidden_size=8, num_heads=2, intermediate_size=16,
                                  moe={"num_experts": 2, "top_k": 1, "capacity_factor": 0.5, "min_capacity": 0,
                                       "noise": "none"})
    layer = MoEFeedForward(cfg)
    layer.ensure_process_groups()
    with torch.no_grad():
        layer.gate.wg.weight.zero_()
        layer.gate.wg.weight[0, 0] = 10.0                  # every token with x[0] > 0 prefers expert 0
    x = torch.ones(1, 8, 8)                                # 8 tokens -> capacity ceil(0.5 * 8 / 2) = 2
    out, routing = layer.train()(x)
    assert routing.capacity == 2
    assert routing.expert_index[0].tolist() == [0, 0, -1, -1, -1, -1, -1, -1]
    assert torch.all(out[0, 2:] == 0) and torch.all(out[0, :2] != 0)


def test_balance_loss_values_by_hand():
    logits = torch.tensor([[2.0, 1.0, 0.0, 0.0], [0.0, 3.0, 1.0, 0.0], [1.0, 0.0, 0.0, 2.0]])
    probs = torch.softmax(logits, dim=1)
    P = probs.mean(dim=0)
    top1 = torch.tensor([[1.0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 1]]).mean(dim=0)
    top2 = torch.tensor([[0, 1.0, 0, 0], [0, 0, 1, 0], [1, 0, 0, 0]]).mean(dim=0)
    switch = route_tokens(logits, MoEConfig(noise="none", balance_loss="switch"), training=True)
    assert torch.allclose(switch.balance_loss, 4 * (P * top1).sum())
    tf = route_tokens(logits, MoEConfig(noise="none", balance_loss="widenet_tf"), training=True)
    assert torch.allclose(tf.balance_loss, 4 * (P * (top1 + top2) / 2).sum())
    # perfectly balanced routing gives the minimum, 1
    uniform = route_tokens(torch.zeros(8, 4), MoEConfig(noise="none"), training=True)
    assert torch.allclose(uniform.balance_loss, torch.tensor(1.0))


def test_noise_only_in_training():
    gate = WideNetGate(16, MoEConfig(num_experts=4, noise="gaussian", second_expert_sampling=True))
    x = torch.randn(64, 16)
    gate.eval()
    a, b = gate(x), gate(x)
    assert torch.equal(a.expert_index, b.expert_index) and torch.equal(a.weight, b.weight)
    gate.train()
    torch.manual_seed(0)
    c = gate(x)
    torch.manual_seed(1)
    d = gate(x)
    assert not torch.equal(c.weight, d.weight)
    quiet = WideNetGate(16, MoEConfig(num_experts=4, noise="none"))
    quiet.load_state_dict(gate.state_dict())
    quiet.train()
    assert torch.equal(quiet(x).weight, quiet(x).weight)


def test_paper_noise_has_std_one_over_e():
    torch.manual_seed(0)
    logits = torch.zeros(20000, 8)
    # with zero logits, softmax(eps) = exp(eps)/sum(exp(eps)); recover eps spread from log-probs
    r = route_tokens(logits, MoEConfig(num_experts=8, top_k=1, noise="gaussian", combine_weights="raw",
                                       drop_tokens=False), training=True)
    # top-1 prob of 8 with N(0, 1/64) noise is close to 1/8 but spread; compare to a direct simulation
    eps = torch.randn(20000, 8) / 8
    expected = torch.softmax(eps, dim=1).max(dim=1).values.mean()
    assert abs(r.weight[0].mean().item() - expected.item()) < 2e-3


@pytest.mark.parametrize("tokens,experts,factor", [(64, 4, 1.2), (40, 8, 1.0), (96, 4, 0.5), (30, 2, 2.0)])
def test_matches_deepspeed_top2gating(tokens, experts, factor):
    """With DeepSpeed's choices (renormalised weights, no noise, no sampling) we are its top2gating."""
    torch.manual_seed(tokens)
    logits = torch.randn(tokens, experts)
    cfg = MoEConfig(num_experts=experts, top_k=2, capacity_factor=factor, min_capacity=4, noise="none",
                    combine_weights="renormalize", balance_loss="switch")
    ours = route_tokens(logits, cfg, training=True)
    l_aux, capacity, _, idx, loc, gates, counts = top2gating(logits.clone(), factor, 4, drop_tokens=True,
                                                             top2_2nd_expert_sampling=False, sparse_routes=True)
    assert ours.capacity == int(capacity)
    assert torch.equal(ours.expert_index, idx) and torch.equal(ours.location, loc)
    assert torch.equal(ours.slot, _route_slots(idx, loc, experts, int(capacity)))
    assert torch.allclose(ours.weight, gates, atol=1e-7)
    assert torch.allclose(ours.balance_loss, l_aux) and torch.equal(ours.expert_counts, counts)


def test_one_expert_moe_equals_dense_ffn_forward_and_backward():
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset("widenet-tiny-e4", hidden_size=16, num_heads=2, intermediate_size=32,
                                  moe={"num_experts": 1, "top_k": 1, "noise": "none", "drop_tokens": False})
    moe = MoEFeedForward(cfg)
    moe.ensure_process_groups()
    dense = FeedForward(16, 32, cfg.activation)
    dense.load_state_dict(moe.experts[0].state_dict())
    x = torch.randn(2, 5, 16, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    out, _ = moe(x)
    ref = dense(x2)
    assert torch.allclose(out, ref, atol=1e-6)
    out.sum().backward()
    ref.sum().backward()
    assert torch.allclose(x.grad, x2.grad, atol=1e-6)
    assert torch.allclose(moe.experts[0].fc_in.weight.grad, dense.fc_in.weight.grad, atol=1e-5)


def _tiny(**overrides):
    return ModelConfig.from_preset("widenet-tiny-e4", vocab_size=200, **overrides)


def test_one_router_routes_every_block_with_different_decisions():
    torch.manual_seed(0)
    model = WideNetForPreTraining(_tiny())
    model.ensure_process_groups()
    gates = [m for m in model.modules() if isinstance(m, WideNetGate)]
    assert len(gates) == 1
    calls = []
    gates[0].register_forward_hook(lambda mod, inp, out: calls.append(out))
    ids = torch.randint(0, 200, (4, 32))
    labels = torch.where(torch.rand(4, 32) < 0.15, ids, torch.full_like(ids, -100))
    out = model(ids, mlm_labels=labels, sop_labels=torch.tensor([0, 1, 0, 1]))
    assert len(calls) == model.cfg.num_layers == out.routing.expert_counts.shape[0]
    # the balance loss is the sum over every routing call
    assert torch.allclose(out.balance_loss, torch.stack([c.balance_loss for c in calls]).sum())
    assert torch.allclose(out.loss, out.mlm_loss + out.sop_loss + 0.01 * out.balance_loss)
    decisions = [c.expert_index for c in calls]
    assert any(not torch.equal(decisions[0], d) for d in decisions[1:])
    out.loss.backward()
    moe = model.widenet.encoder.ffn[0]
    assert moe.gate.wg.weight.grad is not None and moe.gate.wg.weight.grad.abs().sum() > 0
    for expert in moe.experts:
        assert expert.fc_in.weight.grad.abs().sum() > 0 and expert.fc_out.weight.grad.abs().sum() > 0


def test_routing_groups_reuse_the_first_blocks_decisions():
    torch.manual_seed(0)
    model = WideNetForPreTraining(_tiny(routing_groups=2))
    model.ensure_process_groups()
    calls = []
    model.widenet.encoder.ffn[0].gate.register_forward_hook(lambda mod, inp, out: calls.append(out))
    out = model(torch.randint(0, 200, (2, 16)))
    assert len(calls) == 2 == out.routing.expert_counts.shape[0]


def test_unshared_ffn_is_plain_moe_bert():
    model = WideNetForPreTraining(_tiny(share_ffn=False, share_attention=False))
    assert len([m for m in model.modules() if isinstance(m, WideNetGate)]) == model.cfg.num_layers


def test_eval_is_deterministic_even_with_deepspeed_sampling():
    torch.manual_seed(0)
    model = WideNetForPreTraining(_tiny(moe={"second_expert_sampling": True, "noise": "jitter"}))
    model.ensure_process_groups()
    model.eval()
    ids = torch.randint(0, 200, (2, 16))
    with torch.no_grad():
        assert torch.equal(model(ids).mlm_logits, model(ids).mlm_logits)


def test_activation_checkpointing_gives_the_same_loss_and_gradients():
    ids = torch.randint(0, 200, (2, 16))
    labels = torch.where(torch.rand(2, 16) < 0.3, ids, torch.full_like(ids, -100))
    results = []
    for flag in (False, True):
        torch.manual_seed(0)
        model = WideNetForPreTraining(_tiny(routing_groups=2))
        model.set_activation_checkpointing(flag)
        model.ensure_process_groups()
        torch.manual_seed(1)
        out = model(ids, mlm_labels=labels, sop_labels=torch.tensor([0, 1]))
        out.loss.backward()
        results.append((out.loss.detach(), model.widenet.encoder.ffn[0].gate.wg.weight.grad.clone()))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.allclose(results[0][1], results[1][1], atol=1e-6)


def test_experts_are_initialised_from_their_global_index():
    torch.manual_seed(5)
    a = WideNetForPreTraining(_tiny())
    experts = a.widenet.encoder.ffn[0].experts
    assert not torch.equal(experts[0].fc_in.weight, experts[1].fc_in.weight)
    torch.manual_seed(5)
    b = WideNetForPreTraining(_tiny())
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
