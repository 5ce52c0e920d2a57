"""The experts' weight gradients summed in place over WideNet's D calls of the shared MoE (CPU, eager,
expert-sorted dispatches): the same gradients as autograd's own sums, in every way a backward can run."""

import dataclasses

import pytest
import torch

from widenet_ds.model import grouped_experts
from widenet_ds.model.config import ModelConfig
from widenet_ds.model.grouped_experts import ExpertWeights
from widenet_ds.model.widenet import WideNetForPreTraining

pytestmark = pytest.mark.usefixtures("dist")


def _model(dispatch: str) -> WideNetForPreTraining:
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset("widenet-tiny-e4", vocab_size=200, num_layers=3, hidden_dropout=0.0,
                                  attention_dropout=0.0, classifier_dropout=0.0,
                                  moe={"noise": "none", "dispatch": dispatch, "capacity_factor": 0.8})
    model = WideNetForPreTraining(cfg)
    model.ensure_process_groups()
    return model.train()


def _batch():
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 200, (3, 16), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0
    labels = torch.where(torch.rand(ids.shape, generator=gen) < 0.3, ids, -100)
    return dict(input_ids=ids, attention_mask=mask, mlm_labels=labels, sop_labels=torch.tensor([0, 1, 1]))


def _expert_grads(model: WideNetForPreTraining) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if ".experts." in name}


@pytest.fixture
def autograd_sums(monkeypatch):
    """Switch the in-place sums off: the stacked weights' gradients summed by autograd (the reference)."""
    stack = ExpertWeights.stack

    def without(cls, experts):
        return dataclasses.replace(stack(experts), w_in_grad=None, w_out_grad=None)
    return lambda: monkeypatch.setattr(ExpertWeights, "stack", classmethod(without))


@pytest.fixture
def add_calls(monkeypatch):
    """How many times a SharedWeightGrad added a call's gradient."""
    calls = []
    add = grouped_experts.SharedWeightGrad.add

    def counted(self, *args):
        calls.append(self)
        return add(self, *args)
    monkeypatch.setattr(grouped_experts.SharedWeightGrad, "add", counted)
    return calls


@pytest.mark.parametrize("dispatch", ["compact", "dropless"])
def test_in_place_sums_equal_autograds_over_the_d_calls(dispatch, add_calls, autograd_sums):
    model = _model(dispatch)
    model(**_batch()).loss.backward()
    fused = _expert_grads(model)
    # 3 blocks x (fc_in, fc_out), into 2 buffers
    assert len(add_calls) == 6 and len(set(map(id, add_calls))) == 2
    for name, p in model.named_parameters():
        if ".experts." in name and p.dim() == 2:
            assert p.grad.is_contiguous(), f"{name}: the buffer is in the weight's layout, no copy needed"
    model.zero_grad(set_to_none=True)
    autograd_sums()
    model(**_batch()).loss.backward()
    assert len(add_calls) == 6, "the reference ran without the in-place sums"
    reference = _expert_grads(model)
    assert fused.keys() == reference.keys() and len(fused) == 16
    for name in fused:
        torch.testing.assert_close(fused[name], reference[name], atol=1e-6, rtol=1e-5, msg=name)
        assert fused[name].abs().sum() > 0, name


def test_a_second_backward_over_the_retained_graph_adds_its_own_sum():
    model = _model("dropless")
    once = model(**_batch()).loss
    once.backward()
    single = _expert_grads(model)
    model.zero_grad(set_to_none=True)
    loss = model(**_batch()).loss
    loss.backward(retain_graph=True)
    loss.backward()
    for name, grad in _expert_grads(model).items():
        torch.testing.assert_close(grad, 2 * single[name], atol=1e-6, rtol=1e-5, msg=name)


def test_a_partial_backward_first_leaves_the_full_one_unchanged():
    """torch.autograd.grad of the embeddings (adversarial training's first pass) runs the experts' backward
    without the stacking's; the full backward after it still gets exactly one sum."""
    model = _model("dropless")
    model(**_batch()).loss.backward()
    single = _expert_grads(model)
    model.zero_grad(set_to_none=True)
    embeddings = []
    hook = model.widenet.embeddings.register_forward_hook(lambda module, args, out: embeddings.append(out))
    loss = model(**_batch()).loss
    hook.remove()
    (grad_embeddings,) = torch.autograd.grad(loss, embeddings[0], retain_graph=True)
    assert grad_embeddings.abs().sum() > 0
    assert all(p.grad is None for p in model.parameters())
    loss.backward()
    for name, grad in _expert_grads(model).items():
        torch.testing.assert_close(grad, single[name], atol=1e-6, rtol=1e-5, msg=name)


def test_activation_checkpointing_gives_the_same_sums(add_calls):
    """Non-reentrant checkpointing re-runs each block's forward inside the backward: no second sum."""
    model = _model("compact")
    model(**_batch()).loss.backward()
    plain = _expert_grads(model)
    model.zero_grad(set_to_none=True)
    add_calls.clear()
    model.set_activation_checkpointing(True)
    model(**_batch()).loss.backward()
    assert len(add_calls) == 6
    for name, grad in _expert_grads(model).items():
        torch.testing.assert_close(grad, plain[name], atol=1e-6, rtol=1e-5, msg=name)
