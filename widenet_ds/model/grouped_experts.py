"""The E experts' FFNs (fc_in, GELU, fc_out, biases) over expert-sorted rows, as grouped GEMMs.

Two layouts reach the experts:

* `grouped_expert_ffn(rows, group_ends, ...)`: rows [N, H] sorted by expert, expert e owning rows
  [group_ends[e-1], group_ends[e]) -- the dropless dispatch, whose group sizes are data. `group_ends` is
  a device tensor, so no size is read on the host: on CUDA in bf16 (Hopper and newer) this is
  `torch._grouped_mm` with device-side offsets, one kernel per GEMM for all experts.
* `batched_expert_ffn(groups)`: groups [E, R, H], R rows each -- DeepSpeed's capacity buffers, whose
  size is static: one batched GEMM with the bias fused (`torch.baddbmm`) per layer of the FFN, on every
  device. On CPU it gave the bits of DeepSpeed's per-expert `F.linear` calls on one rank (golden curves
  unchanged), not with expert parallelism, where those calls saw strided [ep, C, H] views: 1 float32 ulp
  in some losses (tests/assets/README.md).

`torch._grouped_mm`'s constraints (torch 2.13): int32 offsets (group ends), every row stride a multiple
of 16 bytes (H and F multiples of 8 in bf16, of 4 in fp32), no bias argument (added here from the expert id
of each row), output dtype = input dtype, and torch.compile takes it in bf16 only (its meta function). Its
fast kernel runs on sm90+; elsewhere it is a loop over the groups that reads the offsets on the host (on CPU
in C++: one operator for all groups, and no sync). It runs directly (`native`) where it can: bf16 on sm90+
CUDA (sync-free), and on CPU in eager mode or in bf16. The other cases take the custom op
`widenet_ds::grouped_mm`, opaque to torch.compile (its sizes are data), so the dropless path still compiles
whole: it calls `torch._grouped_mm` itself when the rows are aligned, else one GEMM per group
(`grouped_mm_per_group`, also the reference the tests hold both against). Group starts are padded to
`GROUP_ALIGNMENT_CUDA` rows by the dropless layout on CUDA (the weight-gradient grouped GEMM splits the K
dimension at the offsets); rows past the last group end would never be computed, so the layouts give the
last expert every remaining (padding) row.

The expert weights stay in DeepSpeed's `Experts` module (per-expert `fc_in` / `fc_out` Linear layers:
checkpoints and the engine's expert handling are unchanged) and are stacked on the fly, its backward
handing each expert its slice of the gradient. Each parameter's E copies are laid out as slices of one
tensor when the MoE is built (`pack_expert_parameters`), so in eager code that stack is a view, not a copy
of every expert weight per forward.

WideNet's D blocks share the experts, so each stacked weight gets D weight gradients per backward, which
autograd would compute as D fresh [E, out, in] tensors and sum (75 MB each for widenet-base-e8's fc_in).
On CPU, in eager training, the expert-sorted path (`_SharedWeightGroupedLinear`) sums them in place instead
(`SharedWeightGrad`, Megatron's gradient-accumulation fusion for a weight used D times): one buffer per
weight and backward, in the weight's own layout, so the experts' gradient slices also reach the parameters
without a copy. Its numbers differ from autograd's sums by float rounding only (summation order); the
capacity path (`batched_expert_ffn`, the default dispatch, whose bits the golden curves pin) is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch._subclasses.fake_tensor import is_fake
from torch.utils.flop_counter import register_flop_formula

# Rows per group boundary for torch._grouped_mm on CUDA (16 covers bf16's 16-byte TMA alignment and fp8's).
GROUP_ALIGNMENT_CUDA = 16


@dataclass
class ExpertWeights:
    """The local experts' parameters, stacked: w_in [E, F, H], b_in [E, F], w_out [E, H, F], b_out [E, H]."""

    w_in: Tensor
    b_in: Tensor
    w_out: Tensor
    b_out: Tensor
    approximate: str  # GELU: "none" (exact erf) or "tanh" (gelu_new)
    # In-place sums of w_in's / w_out's weight gradients over the calls of one backward (CPU, eager); None:
    # autograd sums them.
    w_in_grad: "SharedWeightGrad | None" = None
    w_out_grad: "SharedWeightGrad | None" = None

    @classmethod
    def stack(cls, experts: nn.ModuleList) -> "ExpertWeights":
        """Stack the `FeedForward` experts of DeepSpeed's `Experts.deepspeed_experts`."""
        w_in = stack_parameters([e.fc_in.weight for e in experts])
        shared = w_in.device.type == "cpu" and torch.is_grad_enabled() and not torch.compiler.is_compiling()
        return cls(w_in, stack_parameters([e.fc_in.bias for e in experts]),
                   stack_parameters([e.fc_out.weight for e in experts]),
                   stack_parameters([e.fc_out.bias for e in experts]),
                   experts[0].approximate, *((SharedWeightGrad(), SharedWeightGrad()) if shared else ()))

    def cast(self, dtype: torch.dtype) -> "ExpertWeights":
        if dtype == self.w_in.dtype:
            return self
        # Gradients through the cast: autograd's sums, in the weights' dtype.
        return ExpertWeights(self.w_in.to(dtype), self.b_in.to(dtype), self.w_out.to(dtype), self.b_out.to(dtype),
                             self.approximate)


def pack_expert_parameters(experts: nn.ModuleList) -> None:
    """Lay each of the experts' parameters (fc_in.weight, ...) out as slices of one [E, ...] tensor, so that
    `stack_parameters` is a view instead of a copy of them all (151 MB a forward for widenet-base-e8's
    weights). Values, names and Parameter objects are unchanged; a later per-tensor `.to()` (a GPU, another
    dtype) gives them storages of their own again and stacking copies, while ZeRO's flat partitions keep them
    evenly spaced (each expert's tensors in a row)."""
    for name, _ in experts[0].named_parameters():
        params = [expert.get_parameter(name) for expert in experts]
        packed = torch.stack([p.detach() for p in params])
        for p, slice_ in zip(params, packed.unbind()):
            p.data = slice_


def stack_parameters(tensors: list[Tensor]) -> Tensor:
    """torch.stack(tensors), differentiable; without a copy (a view of their storage) where they lie evenly
    spaced in one storage (`pack_expert_parameters`, ZeRO's flat partitions) and the code runs eagerly."""
    if len(tensors) > 1 and not torch.compiler.is_compiling() and (step := _even_step(tensors)) is not None:
        return _StackedView.apply(step, *tensors)
    return torch.stack(tensors)


def _even_step(tensors: list[Tensor]) -> int | None:
    """The storage offset from one tensor to the next where they lie evenly spaced in one storage, else None."""
    first = tensors[0]
    step = tensors[1].storage_offset() - first.storage_offset()
    even = first.is_contiguous() and step >= first.numel() and all(
        t.is_contiguous() and t.shape == first.shape and t.dtype == first.dtype and t.device == first.device
        and t.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
        and t.storage_offset() == first.storage_offset() + i * step
        for i, t in enumerate(tensors))
    return step if even else None


class _StackedView(torch.autograd.Function):
    """[G, ...] view of G evenly spaced tensors of one storage; its backward hands each its slice, as stack's."""

    @staticmethod
    def forward(ctx, step: int, *tensors: Tensor) -> Tensor:
        first = tensors[0]
        # Saved so that the backward fails, as for any saved tensor, if one was changed in place since
        # the forward: the GEMMs saved this view, not a copy.
        ctx.save_for_backward(*tensors)
        return first.as_strided((len(tensors), *first.shape), (step, *first.stride()), first.storage_offset())

    @staticmethod
    def backward(ctx, grad: Tensor):
        ctx.saved_tensors  # noqa: B018 -- the version check
        return None, *grad.unbind(0)


class SharedWeightGrad:
    """The weight gradient [G, out, in] of one stacked weight used by several calls, summed in place over the
    calls of one backward pass: the first call's backward hands autograd a fresh buffer, the later ones add
    their groups into it (`addmm_`) and hand back nothing, so autograd neither allocates nor sums one full
    gradient per call. Autograd runs the stacking's backward, which reads the buffer, only after every call's
    backward in that pass. Keyed by the pass (the engine's graph task): a second backward over a retained
    graph, or a partial one (`torch.autograd.grad` of an input), starts a sum of its own."""

    def __init__(self) -> None:
        self._task: int | None = None
        self._sum: Tensor | None = None

    def add(self, grad_out: Tensor, inputs: Tensor, group_ends: Tensor) -> Tensor | None:
        """Add grad_out[rows of g]^T @ inputs[rows of g] to group g's gradient; the buffer on a pass's first call."""
        task = torch._C._current_graph_task_id()
        fresh = self._sum is None or task != self._task
        if fresh:
            self._task = task
            self._sum = grad_out.new_empty(group_ends.shape[0], grad_out.shape[1], inputs.shape[1])
        ends = host_group_ends(group_ends, grad_out.shape[0])  # CPU only: no device to wait for
        for group, (start, end) in enumerate(zip([0] + ends[:-1], ends)):
            if fresh:
                torch.mm(grad_out[start:end].t(), inputs[start:end], out=self._sum[group])
            else:
                self._sum[group].addmm_(grad_out[start:end].t(), inputs[start:end])
        return self._sum if fresh else None


class _SharedWeightGroupedLinear(torch.autograd.Function):
    """rows[group g] @ w[g]^T (w [G, out, in], nn.Linear's layout): the grouped GEMM of `grouped_expert_ffn`,
    its weight gradient summed by a `SharedWeightGrad`. Forward and input gradient are `torch._grouped_mm`'s
    own operators (one GEMM per group where the rows are not aligned)."""

    @staticmethod
    def forward(ctx, rows: Tensor, w: Tensor, group_ends: Tensor, shared: SharedWeightGrad) -> Tensor:
        ctx.save_for_backward(rows, w, group_ends)
        ctx.shared = shared
        return _grouped_mm_eager(rows, w.transpose(1, 2), group_ends)

    @staticmethod
    def backward(ctx, grad: Tensor):
        rows, w, group_ends = ctx.saved_tensors
        grad = grad.contiguous()
        grad_rows = _grouped_mm_eager(grad, w, group_ends) if ctx.needs_input_grad[0] else None
        grad_w = ctx.shared.add(grad, rows, group_ends) if ctx.needs_input_grad[1] else None
        return grad_rows, grad_w, None, None


def _grouped_mm_eager(a: Tensor, b: Tensor, group_ends: Tensor) -> Tensor:
    if grouped_mm_aligned(a, b):
        return torch._grouped_mm(a, b, offs=group_ends)
    return grouped_mm_per_group(a, b, group_ends)


def host_group_ends(group_ends: Tensor, num_rows: int) -> list[int]:
    """The groups' end rows as host ints. Fake tensors hold no values (a dry run counting a step's memory,
    widenet_ds/engine/activation_memory.py): groups of even size then, which allocate what any sizes would."""
    if not torch.compiler.is_compiling() and is_fake(group_ends):
        groups = group_ends.shape[0]
        return [num_rows * (group + 1) // groups for group in range(groups)]
    return group_ends.tolist()


def group_alignment(device: torch.device) -> int:
    """Rows each expert's group is padded to: GROUP_ALIGNMENT_CUDA on CUDA, none elsewhere."""
    return GROUP_ALIGNMENT_CUDA if device.type == "cuda" else 1


def grouped_mm_aligned(a: Tensor, b: Tensor) -> bool:
    """Whether `torch._grouped_mm` takes a [N, K] @ b [G, K, M] (16-byte row strides)."""
    return (a.shape[1] * a.element_size()) % 16 == 0 and (b.shape[-1] * b.element_size()) % 16 == 0


def native_grouped_mm_usable(rows: Tensor, weights: ExpertWeights) -> bool:
    """Whether `torch._grouped_mm` runs the experts' GEMMs directly, without a host sync and traceably:
    16-byte aligned rows (H and F), and bf16 on a CUDA device of compute capability 9.0+, or on CPU eager
    (any dtype) or in bf16 (the only dtype torch.compile takes it in)."""
    hidden, inner = weights.w_in.shape[2], weights.w_in.shape[1]
    if (hidden * rows.element_size()) % 16 or (inner * rows.element_size()) % 16:
        return False
    if rows.is_cuda:
        return rows.dtype == torch.bfloat16 and torch.cuda.get_device_capability(rows.device)[0] >= 9
    return rows.device.type == "cpu" and (rows.dtype == torch.bfloat16 or not torch.compiler.is_compiling())


def grouped_expert_ffn(rows: Tensor, group_ends: Tensor, weights: ExpertWeights,
                       native: bool | None = None) -> Tensor:
    """fc_out(gelu(fc_in(x))) of expert e for the rows of group e; rows [N, H], group_ends int32 [E] with
    group_ends[-1] == N (every row belongs to a group). Returns [N, H] in the rows' dtype.

    `native`: run `torch._grouped_mm` directly (True) or the custom op (False); None: directly where it can
    (`native_grouped_mm_usable`). Forcing it on CPU runs the GPU's code path there (tests)."""
    weights = weights.cast(rows.dtype)
    expert_of_row = _expert_of_row(group_ends, rows.shape[0])
    # CPU training, eager: the weight gradients summed in place (a forced path, in the tests, runs as asked; a
    # compiled MoE layer, `--compile blocks`, gets weights stacked in eager code: autograd sums them there)
    in_place_sums = (native is None and weights.w_in_grad is not None and torch.is_grad_enabled()
                     and not torch.compiler.is_compiling())
    if native is None:
        native = native_grouped_mm_usable(rows, weights)
    grouped_mm = _native_grouped_mm if native else grouped_mm_by_group

    def linear(x: Tensor, w: Tensor, grad_sum: SharedWeightGrad | None) -> Tensor:
        if in_place_sums and w.requires_grad:
            return _SharedWeightGroupedLinear.apply(x, w, group_ends, grad_sum)
        return grouped_mm(x, w.transpose(1, 2), group_ends)

    hidden = linear(rows, weights.w_in, weights.w_in_grad)
    hidden = F.gelu(hidden + weights.b_in.index_select(0, expert_of_row), approximate=weights.approximate)
    out = linear(hidden, weights.w_out, weights.w_out_grad)
    return out + weights.b_out.index_select(0, expert_of_row)


def _expert_of_row(group_ends: Tensor, num_rows: int) -> Tensor:
    """The group of each row: how many group ends are <= the row (searchsorted, right side)."""
    rows = torch.arange(num_rows, device=group_ends.device, dtype=group_ends.dtype)
    if torch.compiler.is_compiling():
        # inductor generates this count inside the bias-add kernel; searchsorted would stay an ATen call
        return (rows.unsqueeze(1) >= group_ends.unsqueeze(0)).sum(dim=1)
    return torch.searchsorted(group_ends, rows, right=True)


def _native_grouped_mm(a: Tensor, b: Tensor, group_ends: Tensor) -> Tensor:
    # _grouped_mm's backward needs a dense output gradient (a broadcast one, e.g. from .sum(), is refused).
    return _DenseGrad.apply(torch._grouped_mm(a, b, offs=group_ends))


def grouped_mm_per_group(a: Tensor, b: Tensor, group_ends: Tensor) -> Tensor:
    """a [N, K] @ b[g] [K, M] for the rows of each group g: one GEMM per group, any dtype, device and alignment
    (the group sizes are read on the host: a sync on a GPU)."""
    ends = host_group_ends(group_ends, a.shape[0])
    starts = [0] + ends[:-1]
    return torch.cat([a[s:e] @ b[g] for g, (s, e) in enumerate(zip(starts, ends))])


@torch.library.custom_op("widenet_ds::grouped_mm", mutates_args=())
def grouped_mm_by_group(a: Tensor, b: Tensor, group_ends: Tensor) -> Tensor:
    """a [N, K] @ b[g] [K, M] for the rows of each group g, as one operator opaque to torch.compile (its sizes
    are data, which the compiler cannot trace), so the dropless path compiles whole where `torch._grouped_mm`
    cannot (fp32: the compiler only takes it in bf16). `torch._grouped_mm` inside when the rows are aligned
    (on CPU its C++ loop over the groups), else one GEMM per group."""
    if grouped_mm_aligned(a, b):
        return torch._grouped_mm(a, b, offs=group_ends)
    return grouped_mm_per_group(a, b, group_ends)


@grouped_mm_by_group.register_fake
def _(a: Tensor, b: Tensor, group_ends: Tensor) -> Tensor:
    return a.new_empty(a.shape[0], b.shape[2])


@torch.library.custom_op("widenet_ds::grouped_mm_weight_grad", mutates_args=())
def grouped_mm_weight_grad(a: Tensor, grad: Tensor, group_ends: Tensor) -> Tensor:
    """[G, K, M]: a[group g]^T @ grad[group g] for each group g (the weight gradient of grouped_mm)."""
    if grouped_mm_aligned(a, grad):
        return torch._grouped_mm(a.t(), grad, offs=group_ends)
    ends = host_group_ends(group_ends, a.shape[1])
    starts = [0] + ends[:-1]
    return torch.stack([a[s:e].t() @ grad[s:e] for s, e in zip(starts, ends)])


@grouped_mm_weight_grad.register_fake
def _(a: Tensor, grad: Tensor, group_ends: Tensor) -> Tensor:
    return a.new_empty(group_ends.shape[0], a.shape[1], grad.shape[1])


def _grouped_mm_setup_context(ctx, inputs, output) -> None:
    a, b, group_ends = inputs
    ctx.save_for_backward(a, b, group_ends)


def _grouped_mm_backward(ctx, grad: Tensor):
    a, b, group_ends = ctx.saved_tensors
    grad = grad.contiguous()
    grad_a = grouped_mm_by_group(grad, b.transpose(1, 2), group_ends) if ctx.needs_input_grad[0] else None
    grad_b = grouped_mm_weight_grad(a, grad, group_ends) if ctx.needs_input_grad[1] else None
    return grad_a, grad_b, None


grouped_mm_by_group.register_autograd(_grouped_mm_backward, setup_context=_grouped_mm_setup_context)


# FLOPs for torch.utils.flop_counter.FlopCounterMode (tests/model/test_counts.py counts the model with it): every
# row meets one group's matrix, 2 N K M in all, whatever the grouping.
@register_flop_formula([torch.ops.widenet_ds.grouped_mm, torch.ops.widenet_ds.grouped_mm_weight_grad])
def _grouped_mm_flops(a_shape, b_shape, group_ends_shape, out_shape=None, **kwargs) -> int:
    rows, inner = a_shape
    return 2 * rows * inner * (b_shape[-1])


@register_flop_formula(torch.ops.aten._grouped_mm)
def _native_grouped_mm_flops(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    # [N, K] @ [G, K, M] (rows by group) or [K, N] @ [N, M] -> [G, K, M] (weight gradient, N split by group).
    rows, inner = a_shape
    return 2 * rows * inner * b_shape[-1]


def batched_expert_ffn(groups: Tensor, weights: ExpertWeights) -> Tensor:
    """groups [E, ..., H]: expert e on groups[e]. Returns the same shape, contiguous."""
    weights = weights.cast(groups.dtype)
    flat = groups.reshape(groups.shape[0], -1, groups.shape[-1])
    hidden = _bmm_bias(flat, weights.w_in.transpose(1, 2), weights.b_in.unsqueeze(1))
    hidden = F.gelu(hidden, approximate=weights.approximate)
    out = _bmm_bias(hidden, weights.w_out.transpose(1, 2), weights.b_out.unsqueeze(1))
    return out.view(groups.shape)


def _bmm_bias(x: Tensor, w: Tensor, bias: Tensor) -> Tensor:
    # Eager: the GEMM accumulates onto the bias (one operator, F.linear's bits on CPU). Compiled: the bias add
    # fuses into the kernel that follows (GELU, the combine) instead of a copy of the bias before the GEMM.
    if torch.compiler.is_compiling():
        return torch.bmm(x, w) + bias
    return torch.baddbmm(bias, x, w)


def reference_expert_ffn(rows: Tensor, sizes: list[int], experts: nn.ModuleList) -> Tensor:
    """The experts' own modules on consecutive row chunks: what the grouped forms must equal (tests)."""
    return torch.cat([expert(chunk) for expert, chunk in zip(experts, rows.split(sizes))])


class _DenseGrad(torch.autograd.Function):
    """Identity whose backward makes the incoming gradient dense (contiguous)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad.contiguous()
