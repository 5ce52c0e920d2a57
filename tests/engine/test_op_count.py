"""The operator count of widenet_ds.engine.op_count on small functions whose operators are known."""

import pytest
import torch
import torch.nn.functional as F

from widenet_ds.engine.op_count import (
    count_ops,
    launches_nothing,
    record_compiled_kernels,
)


def test_views_metadata_and_no_op_composites_launch_nothing():
    for op in ("view", "transpose", "t", "expand", "detach", "slice", "to", "contiguous", "empty", "resolve_conj",
               "dropout"):
        assert launches_nothing(op), op
    for op in ("add", "mm", "addmm", "copy_", "fill_", "cumsum", "index_select", "_grouped_mm", "gelu"):
        assert not launches_nothing(op), op


def test_counts_the_leaves_that_do_work():
    x = torch.randn(4, 8)
    w = torch.randn(6, 8)
    assert count_ops(lambda: x.view(2, 16).t().unsqueeze(0).expand(3, 16, 2)[1:]).total == 0
    assert count_ops(lambda: F.dropout(x, p=0.0, training=True)).total == 0
    assert count_ops(lambda: (x + 1).tanh()).ops == {"aten::add": 1, "aten::tanh": 1}
    # linear -> matmul -> mm: the leaf counts, not the composites around it
    assert count_ops(lambda: F.linear(x, w)).ops == {"aten::mm": 1}
    # a real copy counts; the 0-dim copy that wraps the Python number 2 for the CPU kernel does not
    assert count_ops(lambda: x.t().contiguous() * 2).ops == {"aten::copy_": 1, "aten::mul": 1}


def test_counts_the_backward_and_one_grouped_gemm_as_one():
    a = torch.randn(12, 8, requires_grad=True)
    b = torch.randn(3, 8, 8, requires_grad=True)
    ends = torch.tensor([4, 4, 12], dtype=torch.int32)
    grad = torch.randn(12, 8)
    # CPU's _grouped_mm loops over the groups inside (one GEMM per group); on a GPU it is one kernel
    forward = count_ops(lambda: torch._grouped_mm(a, b, offs=ends))
    assert forward.ops == {"aten::_grouped_mm": 1}
    both = count_ops(lambda: torch._grouped_mm(a, b, offs=ends).backward(grad))
    assert both.ops == {"aten::_grouped_mm": 3}  # forward, input gradient, weight gradient


def test_counts_the_kernels_torch_compile_generated():
    record_compiled_kernels()
    fn = torch.compile(lambda x: (x * 2).relu().sum(dim=1), backend="inductor")
    x = torch.randn(4, 8)
    fn(x)  # compiles
    ops = count_ops(lambda: fn(x))
    assert ops.ops == {"compiled kernel": 1}  # mul, relu and sum fused into one loop


@pytest.mark.parametrize("dispatch, bound, mask_ops_per_call", [("deepspeed", 2.1, 16), ("dropless", 2.2, 27)])
def test_widenet_step_runs_about_twice_albert_operators(dispatch, bound, mask_ops_per_call, dist):
    """The host overhead of issue 26: widenet-base-e4's structure (12 blocks, 4 experts, tiny dims) ran 4.6x
    (capacity) and 3.6x (dropless) albert-base's operators per forward + backward before its routing and
    dispatch were rewritten; now about 2x (bench/bench_host_overhead.py, docs/benchmarks.md), with the routing
    of that issue (padding routed, `moe.route_padding = true`). Keeping padding out of the experts (issue 24,
    the default) costs a bounded number of operators per routing call on top (measured 14 capacity, 25
    dropless: the mask's repeat and count, the masked balance loss, the dropless tail rows). Dropless on CPU
    sums the experts' weight gradients in place, one `addmm_` per expert where autograd ran one grouped GEMM
    and one sum (grouped_experts.SharedWeightGrad): 2 more operators per expert GEMM call with 4 experts, 50 a
    step (1,532 -> 1,582 with padding routed), for 2-4% more tokens/s at batch 8 x 128."""
    from widenet_ds.model.config import ModelConfig
    from widenet_ds.model.widenet import WideNetForPreTraining

    tiny = dict(hidden_size=64, intermediate_size=128, num_heads=4, embedding_size=32, vocab_size=1000)
    batch = dict(input_ids=torch.randint(5, 1000, (2, 32), generator=torch.Generator().manual_seed(0)),
                 token_type_ids=torch.zeros(2, 32, dtype=torch.long), attention_mask=torch.ones(2, 32, dtype=torch.long),
                 mlm_labels=torch.full((2, 32), -100).index_fill_(1, torch.tensor([3, 9]), 7),
                 sop_labels=torch.tensor([0, 1]))
    counts = {}
    for name, preset, moe in (("albert", "albert-base", {}),
                              ("literal", "widenet-base-e4", {"dispatch": dispatch, "route_padding": True}),
                              ("masked", "widenet-base-e4", {"dispatch": dispatch})):
        torch.manual_seed(0)
        cfg = ModelConfig.from_preset(preset, moe=moe, **tiny)
        model = WideNetForPreTraining(cfg).train()
        step = lambda: model(**batch).loss.backward()  # noqa: E731
        step()
        counts[name] = count_ops(step).total
    assert counts["literal"] <= bound * counts["albert"], counts
    assert counts["masked"] - counts["literal"] <= mask_ops_per_call * cfg.num_routing_calls, counts
