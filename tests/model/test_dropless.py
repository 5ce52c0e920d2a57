"""Expert-sorted dispatches: dropless equals DeepSpeed's capacity path when nothing overflows and drops no route
when skewed; compact equals the capacity path with its drops, on one rank and with expert parallelism."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from widenet_ds.model.config import ModelConfig
from widenet_ds.model.moe import MoEFeedForward
from widenet_ds.model.widenet import WideNetForPreTraining

from tests.scripts import dropless_expert_parallel
from tests.support.launching import REPO, run_deepspeed

pytestmark = pytest.mark.usefixtures("dist")


def _layer(dispatch: str, **moe) -> MoEFeedForward:
    cfg = ModelConfig.from_preset("widenet-tiny-e4", hidden_size=16, num_heads=2, intermediate_size=32,
                                  moe={"noise": "none", "dispatch": dispatch, **moe})
    layer = MoEFeedForward(cfg)
    layer.ensure_process_groups()
    return layer


def _pair(**moe) -> tuple[MoEFeedForward, MoEFeedForward]:
    """A capacity-path layer with room for every route (B = K * C * T / E >= T) and its dropless twin."""
    torch.manual_seed(0)
    stock = _layer("deepspeed", capacity_factor=4.0, eval_capacity_factor=4.0, **moe)
    dropless = _layer("dropless", **moe)
    dropless.load_state_dict(stock.state_dict())
    return stock, dropless


def _run(layer: MoEFeedForward, x: torch.Tensor):
    x = x.detach().clone().requires_grad_(True)
    out, routing = layer.train()(x)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    grads = {name: p.grad.clone() for name, p in layer.named_parameters()}
    return out, routing, x.grad, grads


@pytest.mark.parametrize("moe", [dict(top_k=2, combine_weights="raw"), dict(top_k=2, combine_weights="renormalize"),
                                 dict(top_k=1, combine_weights="raw"), dict(top_k=2, num_experts=3)])
def test_dropless_equals_deepspeed_path_when_nothing_overflows(moe):
    stock, dropless = _pair(**moe)
    x = torch.randn(3, 7, 16)
    out_a, routing_a, dx_a, grads_a = _run(stock, x)
    out_b, routing_b, dx_b, grads_b = _run(dropless, x)
    assert int(routing_a.dropped_routes) == 0 == int(routing_b.dropped_routes)
    assert torch.equal(routing_a.expert_index, routing_b.expert_index)
    assert torch.equal(routing_a.expert_counts, routing_b.expert_counts)
    assert torch.equal(routing_a.balance_loss, routing_b.balance_loss)
    torch.testing.assert_close(out_b, out_a, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(dx_b, dx_a, atol=1e-6, rtol=1e-5)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], atol=1e-6, rtol=1e-5, msg=name)


def _skewed(layer: MoEFeedForward) -> MoEFeedForward:
    with torch.no_grad():
        layer.gate.wg.weight.zero_()
        layer.gate.wg.weight[0, 0] = 10.0      # x[0] > 0: every token's first choice is expert 0
        layer.gate.wg.weight[1, 0] = 5.0       # ... and its second choice expert 1
    return layer


def test_dropless_drops_nothing_under_a_skewed_router():
    torch.manual_seed(1)
    capacity_layer = _skewed(_layer("deepspeed", capacity_factor=1.2, min_capacity=0))
    dropless = _skewed(_layer("dropless"))
    dropless.load_state_dict(capacity_layer.state_dict())
    x = torch.randn(2, 20, 16)
    x[..., 0] = x[..., 0].abs() + 1.0
    capped, capped_routing = capacity_layer.train()(x)
    out, routing = dropless.train()(x)
    tokens = x.shape[0] * x.shape[1]
    # capacity ceil(2 * 1.2 * 40 / 4) = 24 slots for 40 first choices: the capacity path drops
    assert capped_routing.expert_counts.tolist()[:2] == [tokens, tokens]
    assert int(capped_routing.dropped_routes) == 2 * (tokens - 24)
    assert (capped.reshape(tokens, -1).abs().sum(dim=1) == 0).sum() == tokens - 24
    # dropless: every route runs, every token gets an output
    assert int(routing.dropped_routes) == 0 and torch.all(routing.expert_index >= 0)
    assert torch.all(out.reshape(tokens, -1).abs().sum(dim=1) > 0)
    # and that output is the routed experts' weighted sum, token by token
    flat = x.reshape(tokens, -1)
    expected = torch.stack([
        sum(routing.weight[j, t] * dropless.experts[int(routing.expert_index[j, t])](flat[t]) for j in range(2))
        for t in range(tokens)])
    torch.testing.assert_close(out.reshape(tokens, -1), expected, atol=1e-6, rtol=1e-5)
    assert torch.equal(routing.balance_loss, capped_routing.balance_loss)


def test_dropless_pretraining_model_matches_the_capacity_path():
    ids = torch.randint(0, 200, (2, 16), generator=torch.Generator().manual_seed(3))
    labels = torch.where(torch.rand(2, 16, generator=torch.Generator().manual_seed(4)) < 0.3, ids, -100)
    results = []
    for moe in (dict(dispatch="deepspeed", capacity_factor=4.0), dict(dispatch="dropless")):
        torch.manual_seed(0)
        cfg = ModelConfig.from_preset("widenet-tiny-e4", vocab_size=200, routing_groups=2,
                                      moe={"noise": "none", **moe})
        model = WideNetForPreTraining(cfg)
        model.ensure_process_groups()
        out = model(ids, mlm_labels=labels, sop_labels=torch.tensor([0, 1]))
        out.loss.backward()
        results.append((out, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (a, grads_a), (b, grads_b) = results
    torch.testing.assert_close(b.loss, a.loss, atol=1e-6, rtol=1e-6)
    assert torch.equal(a.routing.expert_counts, b.routing.expert_counts)
    assert torch.all(b.routing.dropped_fraction == 0)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("capacity_factor", [0.5, 1.2])
def test_compact_equals_the_capacity_path_with_its_drops(capacity_factor):
    """The same routing decisions (slots, drops, weights, balance loss) and the same outputs and gradients as
    DeepSpeed's buffers, with padding in the batch; at C 0.5 a third of the routes are dropped."""
    torch.manual_seed(2)
    moe = dict(capacity_factor=capacity_factor, min_capacity=0)
    stock, compact = _layer("deepspeed", **moe), _layer("compact", **moe)
    compact.load_state_dict(stock.state_dict())
    x = torch.randn(3, 20, 16)
    mask = torch.ones(3, 20, dtype=torch.bool)
    mask[1, 13:] = False
    results = []
    for layer in (stock, compact):
        xx = x.clone().requires_grad_(True)
        out, routing = layer.train()(xx, token_mask=mask)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        results.append((out, routing, xx.grad, {name: p.grad.clone() for name, p in layer.named_parameters()}))
    (out_a, routing_a, dx_a, grads_a), (out_b, routing_b, dx_b, grads_b) = results
    if capacity_factor < 1:
        assert int(routing_a.dropped_routes) > 20
    for field in ("expert_index", "location", "weight", "expert_counts", "slot", "balance_loss"):
        assert torch.equal(getattr(routing_a, field), getattr(routing_b, field)), field
    assert torch.all(out_b[1, 13:] == 0), "padding gets no expert output"
    torch.testing.assert_close(out_b, out_a, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(dx_b, dx_a, atol=1e-6, rtol=1e-5)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], atol=1e-6, rtol=1e-5, msg=name)


EXPERT_PARALLEL_CASES = [("dropless", "dropless"), ("compact", "deepspeed"), ("deepspeed", "deepspeed")]


@pytest.fixture(scope="module")
def ep2_outputs(tmp_path_factory) -> Path:
    """Every dispatch of EXPERT_PARALLEL_CASES at ep_size 2 on 2 launcher ranks, in one launch."""
    prefix = tmp_path_factory.mktemp("dropless_ep2") / "ep2"
    run_deepspeed(REPO / "tests/scripts/dropless_expert_parallel.py",
                  [str(prefix), "2", *(dispatch for dispatch, _ in EXPERT_PARALLEL_CASES)], num_ranks=2)
    return prefix


@pytest.mark.multirank
@pytest.mark.parametrize("dispatch, reference", EXPERT_PARALLEL_CASES)
def test_expert_parallel_over_two_ranks_matches_ep1_forward_and_gradients(ep2_outputs, dispatch, reference):
    """Every dispatch's all-to-all (the kept rows' variable-size one; DeepSpeed's capacity buffers): ep_size 2
    on 2 launcher ranks equals ep_size 1 in one process, logits and gradients (experts see both ranks' tokens;
    everything else this rank's own). Compact and the capacity buffers at capacity factor 0.5 (routes dropped
    on both ranks) against DeepSpeed's capacity buffers at ep_size 1."""
    got = [load_file(f"{ep2_outputs}.{dispatch}.rank{rank}.safetensors") for rank in (0, 1)]
    want = [dropless_expert_parallel.run(dropless_expert_parallel.build(1, reference), rank) for rank in (0, 1)]
    for rank in (0, 1):
        torch.testing.assert_close(got[rank]["mlm_logits"], want[rank]["mlm_logits"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got[rank]["loss"], want[rank]["loss"], atol=1e-6, rtol=1e-6)
        assert torch.equal(got[rank]["expert_counts"], want[rank]["expert_counts"])
        assert torch.equal(got[rank]["dropped_fraction"], want[rank]["dropped_fraction"])
        assert bool(torch.all(got[rank]["dropped_fraction"] > 0)) == (dispatch != "dropless")
        expert_grads = [n for n in got[rank] if ".expert" in n]
        assert len(expert_grads) == 4 * 2, "each rank holds 2 of the 4 experts' 4 tensors"
        for name, grad in got[rank].items():
            if not name.startswith("grad."):
                continue
            # An expert's gradient sums the routes of both ranks' tokens; the rest is this rank's batch alone.
            expected = want[0][name] + want[1][name] if ".expert" in name else want[rank][name]
            torch.testing.assert_close(grad, expected, atol=1e-5, rtol=1e-4, msg=f"rank {rank} {name}")
        dense = {n for n in want[rank] if n.startswith("grad.") and ".expert" not in n}
        assert dense and dense <= got[rank].keys(), "every non-expert gradient is compared"
