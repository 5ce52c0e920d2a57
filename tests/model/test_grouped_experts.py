"""The experts' grouped GEMMs against the experts' own modules, forward and backward: the GPU's native
`torch._grouped_mm` path forced on CPU (fp32 and bf16), the custom op torch.compile sees (aligned and not), and
the batched GEMMs of the capacity buffers. And the experts' weight gradients summed in place over WideNet's D
calls of the shared MoE (CPU, eager, expert-sorted dispatches): the same gradients as autograd's own sums, in
every way a backward can run. And the experts' parameters packed so that stacking them is a view: the bits
of a copy."""

import dataclasses

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from widenet_ds.model import grouped_experts
from widenet_ds.model.config import ModelConfig
from widenet_ds.model.grouped_experts import (
    ExpertWeights,
    _expert_of_row,
    batched_expert_ffn,
    grouped_expert_ffn,
    grouped_mm_by_group,
    grouped_mm_per_group,
    native_grouped_mm_usable,
    reference_expert_ffn,
    stack_parameters,
)
from widenet_ds.model.moe import FeedForward
from widenet_ds.model.widenet import WideNetForPreTraining

SIZES = [5, 0, 9, 2]  # uneven groups, one empty


def _experts(hidden: int, inner: int, count: int = len(SIZES), dtype=torch.float32) -> torch.nn.ModuleList:
    torch.manual_seed(0)
    experts = torch.nn.ModuleList(FeedForward(hidden, inner, "gelu") for _ in range(count))
    with torch.no_grad():
        for expert in experts:  # non-zero biases: the per-row bias of the grouped path is checked too
            expert.fc_in.bias.normal_()
            expert.fc_out.bias.normal_()
    return experts.to(dtype)


def _ends(sizes: list[int]) -> torch.Tensor:
    return torch.tensor(sizes).cumsum(0).to(torch.int32)


def _forward_backward(fn, rows: torch.Tensor, experts: torch.nn.ModuleList):
    rows = rows.detach().clone().requires_grad_(True)
    experts.zero_grad(set_to_none=True)
    out = fn(rows)
    (out.float() * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return out.detach(), rows.grad, {n: p.grad.clone() for n, p in experts.named_parameters()}


def _assert_same(got, want, **tolerance):
    torch.testing.assert_close(got[0], want[0], **tolerance)
    torch.testing.assert_close(got[1], want[1], **tolerance)
    assert got[2].keys() == want[2].keys()
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name], msg=name, **tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_native_grouped_mm_forced_on_cpu_equals_the_per_group_path(dtype):
    """The code path an sm90 GPU runs (torch._grouped_mm with device offsets, _DenseGrad, per-row biases)
    equals one GEMM per group with the experts' own modules, forward and backward."""
    experts = _experts(16, 32, dtype=dtype)
    rows = torch.randn(sum(SIZES), 16, generator=torch.Generator().manual_seed(1)).to(dtype)
    ends = _ends(SIZES)
    native = _forward_backward(lambda x: grouped_expert_ffn(x, ends, ExpertWeights.stack(experts), native=True),
                               rows, experts)
    per_group = _forward_backward(lambda x: reference_expert_ffn(x, SIZES, experts), rows, experts)
    custom_op = _forward_backward(lambda x: grouped_expert_ffn(x, ends, ExpertWeights.stack(experts), native=False),
                                  rows, experts)
    tolerance = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    _assert_same(native, per_group, **tolerance)
    _assert_same(custom_op, per_group, **tolerance)


def test_native_path_is_the_cpu_eager_default_where_aligned():
    weights = ExpertWeights.stack(_experts(16, 32))
    assert native_grouped_mm_usable(torch.zeros(4, 16), weights)
    assert native_grouped_mm_usable(torch.zeros(4, 16, dtype=torch.bfloat16), weights.cast(torch.bfloat16))
    unaligned = ExpertWeights.stack(_experts(6, 10))  # 24-byte fp32 rows: torch._grouped_mm refuses them
    assert not native_grouped_mm_usable(torch.zeros(4, 6), unaligned)


def test_unaligned_rows_take_one_gemm_per_group():
    experts = _experts(6, 10)
    rows = torch.randn(sum(SIZES), 6, generator=torch.Generator().manual_seed(2))
    got = _forward_backward(lambda x: grouped_expert_ffn(x, _ends(SIZES), ExpertWeights.stack(experts)), rows, experts)
    want = _forward_backward(lambda x: reference_expert_ffn(x, SIZES, experts), rows, experts)
    _assert_same(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "unaligned"])
def test_custom_op_equals_one_gemm_per_group(aligned):
    width = 8 if aligned else 6
    a = torch.randn(sum(SIZES), width, generator=torch.Generator().manual_seed(3), requires_grad=True)
    b = torch.randn(len(SIZES), width, 12, generator=torch.Generator().manual_seed(4), requires_grad=True)
    ends = _ends(SIZES)
    grad = torch.randn(sum(SIZES), 12, generator=torch.Generator().manual_seed(5))
    out = grouped_mm_by_group(a, b, ends)
    grads = torch.autograd.grad(out, (a, b), grad)
    want = grouped_mm_per_group(a, b, ends)
    want_grads = torch.autograd.grad(want, (a, b), grad)
    torch.testing.assert_close(out, want)
    for got_grad, want_grad in zip(grads, want_grads):
        torch.testing.assert_close(got_grad, want_grad)


def test_batched_experts_equal_the_experts_modules():
    """The capacity buffers [E, B, H] through two batched GEMMs with fused biases."""
    experts = _experts(16, 32, count=3)
    buffers = torch.randn(3, 1, 7, 16, generator=torch.Generator().manual_seed(6))
    got = _forward_backward(lambda x: batched_expert_ffn(x, ExpertWeights.stack(experts)), buffers, experts)
    want = _forward_backward(lambda x: torch.stack([expert(x[e]) for e, expert in enumerate(experts)]),
                             buffers, experts)
    _assert_same(got, want, atol=1e-5, rtol=1e-5)


def test_flop_counter_counts_the_native_grouped_gemm():
    """2 N K M per GEMM whatever the grouping, forward (rows x weights) and backward (weight gradient too)."""
    a = torch.randn(16, 8, requires_grad=True)
    b = torch.randn(len(SIZES), 8, 12, requires_grad=True)
    ends = torch.tensor([5, 5, 14, 16], dtype=torch.int32)
    with FlopCounterMode(display=False) as counter:
        out = torch._grouped_mm(a, b, offs=ends)
        out.backward(torch.ones_like(out))
    assert counter.get_total_flops() == 3 * 2 * 16 * 8 * 12


@pytest.mark.parametrize("align", [1, 16])
def test_compiled_group_layout_equals_eager(align):
    # Under torch.compile the group ends and each row's group are masked sums that inductor generates in a
    # kernel (cumsum and searchsorted stay ATen calls): the same integers as eager's, empty groups included.
    from widenet_ds.model.dropless import aligned_groups, padded_rows

    counts = torch.tensor(SIZES + [7, 0, 0, 3], dtype=torch.long)
    total = padded_rows(int(counts.sum()), counts.numel(), align)

    def layout(counts: torch.Tensor):
        starts, ends = aligned_groups(counts, align, total)
        return starts, ends, _expert_of_row(ends, total)

    torch._dynamo.reset()
    eager = layout(counts)
    compiled = torch.compile(layout, backend="inductor", fullgraph=True)(counts)
    for got, want in zip(compiled, eager):
        assert got.dtype == want.dtype and torch.equal(got, want)
    assert torch.equal(eager[2], torch.searchsorted(eager[1], torch.arange(total, dtype=torch.int32), right=True))


# --- the weight gradients of the D calls, summed in place ---------------------------------------------------
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


@pytest.mark.usefixtures("dist")
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


@pytest.mark.usefixtures("dist")
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


@pytest.mark.usefixtures("dist")
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


@pytest.mark.usefixtures("dist")
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


# --- stacking the experts' parameters without a copy ----------------------------------------------------------
def _loss_and_grads(model: WideNetForPreTraining):
    model.zero_grad(set_to_none=True)
    loss = model(**_batch()).loss
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.usefixtures("dist")
@pytest.mark.parametrize("dispatch", ["deepspeed", "compact", "dropless"])
def test_packed_experts_stack_as_a_view_with_the_bits_of_a_copy(dispatch, monkeypatch):
    model = _model(dispatch)
    experts = model.widenet.encoder.ffn[0].experts
    weights = ExpertWeights.stack(experts)
    for stacked, name in [(weights.w_in, "fc_in.weight"), (weights.b_in, "fc_in.bias"),
                          (weights.w_out, "fc_out.weight"), (weights.b_out, "fc_out.bias")]:
        params = [expert.get_parameter(name) for expert in experts]
        assert stacked.data_ptr() == params[0].data_ptr(), f"{name}: stacked by a copy"
        assert torch.equal(stacked, torch.stack(params)), name
    viewed = _loss_and_grads(model)
    monkeypatch.setattr(grouped_experts, "_even_step", lambda tensors: None)
    copied = _loss_and_grads(model)
    assert torch.equal(viewed[0], copied[0])
    assert viewed[1].keys() == copied[1].keys() and len(viewed[1]) == len(list(model.parameters()))
    for name in viewed[1]:
        assert torch.equal(viewed[1][name], copied[1][name]), name


@pytest.mark.usefixtures("dist")
def test_an_expert_weight_changed_between_forward_and_backward_is_refused():
    """The GEMMs saved a view of the weights, not a copy: changing one before the backward must not pass."""
    model = _model("dropless")
    loss = model(**_batch()).loss
    with torch.no_grad():
        model.widenet.encoder.ffn[0].experts[2].fc_out.weight.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_evenly_spaced_slices_of_a_flat_buffer_stack_as_a_view_and_others_by_copy():
    """ZeRO's flat partitions hold each expert's tensors in a row: its weights are evenly spaced with the
    biases between them. Tensors with storages of their own (after a per-tensor `.to()`) are copied."""
    flat = torch.randn(3 * (12 + 4))
    weights = [torch.nn.Parameter(flat[e * 16:e * 16 + 12].view(4, 3)) for e in range(3)]
    stacked = stack_parameters(weights)
    assert stacked.data_ptr() == flat.data_ptr() and stacked.shape == (3, 4, 3)
    assert torch.equal(stacked, torch.stack([w.detach() for w in weights]))
    scale = torch.randn(3, 4, 3)
    (stacked * scale).sum().backward()
    for e, w in enumerate(weights):
        assert torch.equal(w.grad, scale[e])
    separate = [torch.nn.Parameter(w.detach().double()) for w in weights]
    copied = stack_parameters(separate)
    assert copied.data_ptr() not in {w.data_ptr() for w in separate}
    assert torch.equal(copied, torch.stack([w.detach() for w in separate]))
    uneven = [weights[0], weights[2], weights[1]]
    assert torch.equal(stack_parameters(uneven), torch.stack([w.detach() for w in uneven]))
