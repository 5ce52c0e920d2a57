"""LAMB with DeepSpeed's update rule and a per-tensor trust ratio, with or without ZeRO 1/2.

DeepSpeed's `Lamb` (`deepspeed.ops.lamb.FusedLamb`) is a CUDA kernel, and under ZeRO stage 1/2 it
sees one flat fp32 partition per parameter group, so its "layer-wise" trust ratio is computed per
partition (DeepSpeed issues #490, #1217). `Lamb` here runs anywhere, takes the same JSON
hyper-parameters, and -- once `enable_per_tensor_trust_ratio(engine)` has told it where each
original tensor lies in the partitions -- computes the trust ratio per tensor under ZeRO too.

Update rule of DeepSpeed's kernel (`ops/csrc/lamb/fused_lamb_cuda_kernel.cu`), per tensor:

    m = b1 m + (1 - b1) g ;  v = b2 v + (1 - b2) g^2
    u = m / (sqrt(v) + eps) + weight_decay * w          (eps_inside_sqrt: m / sqrt(v + eps))
    r = clamp(||w|| / ||u||, min_coeff, max_coeff), r = 1 when ||w|| or ||u|| is 0
    w = w - lr * sqrt(1 - b2^t) / (1 - b1^t) * r * u     (bias_correction=False: w - lr * r * u)

The bias correction sits in the step size, outside the trust ratio (unlike the LAMB paper and
`pytorch_optimizer.Lamb`); see docs/optimizer.md.

On a GPU the step is multi-tensor (`foreach=True`): the moments, updates, norms and trust ratios of
all the tensors of a param group (or all the tensor pieces of a flat ZeRO partition) go through
`torch._foreach_*` kernels, a handful of launches per group instead of a dozen per tensor, and nothing is
read on the host. On CPU, where `_foreach_*` is a loop over the tensors anyway, the step updates one tensor
after the other (`foreach=False`): the same kernels and numbers, but only one tensor's temporaries alive at a
time instead of every tensor's (for widenet-base-e8: 15 MiB instead of 288). `foreach=None`, the default,
picks by device; bench/bench_lamb.py compares the two.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as torch_dist
from torch import nn

from widenet_ds.errors import ConfigError


@dataclass(frozen=True)
class TensorSegment:
    """The part of one original tensor that lies in this rank's flat partition."""

    tensor_index: int  # position of the tensor in its ZeRO group, the same on every rank
    start: int  # offset in the flat partition
    numel: int


@dataclass(frozen=True)
class PartitionLayout:
    """Where the original tensors lie in one flat ZeRO partition, and who holds the rest."""

    partition: torch.Tensor  # held so that the id() key below cannot be reused
    segments: tuple[TensorSegment, ...]
    num_tensors: int  # tensors in the whole group, over all ranks of `process_group`
    process_group: object  # torch.distributed ProcessGroup; None when the group has one rank


class Lamb(torch.optim.Optimizer):
    """LAMB with DeepSpeed's hyper-parameters and update rule; the trust ratio is per tensor.

    Arguments are those of DeepSpeed's JSON `"optimizer": {"type": "Lamb", "params": {...}}`.
    `max_grad_norm` must stay 0 (DeepSpeed's engine never passes the norm it needs; use the
    top-level `"gradient_clipping"`), and `amsgrad` is refused as DeepSpeed does.
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        eps_inside_sqrt: bool = False,
        weight_decay: float = 0.0,
        max_grad_norm: float = 0.0,
        max_coeff: float = 10.0,
        min_coeff: float = 0.01,
        amsgrad: bool = False,
        foreach: bool | None = None,
    ):
        if lr < 0.0:
            raise ConfigError(f"Lamb lr={lr} is negative; give a learning rate >= 0")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ConfigError(f"Lamb betas={tuple(betas)} must each lie in [0, 1)")
        if eps < 0.0 or weight_decay < 0.0:
            raise ConfigError(f"Lamb eps={eps} and weight_decay={weight_decay} must be >= 0")
        if not 0.0 <= min_coeff <= max_coeff:
            raise ConfigError(f"Lamb needs 0 <= min_coeff <= max_coeff, got {min_coeff}, {max_coeff}")
        if max_grad_norm != 0.0:
            raise ConfigError(
                f"Lamb max_grad_norm={max_grad_norm}: DeepSpeed's engine never passes the gradient norm "
                'this needs; set it to 0 and clip with the top-level "gradient_clipping" instead'
            )
        if amsgrad:
            raise ConfigError("Lamb has no AMSGrad variant (DeepSpeed refuses it too); remove amsgrad")
        defaults = dict(
            lr=lr,
            bias_correction=bias_correction,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            max_grad_norm=max_grad_norm,
            max_coeff=max_coeff,
            min_coeff=min_coeff,
        )
        self.eps_inside_sqrt = eps_inside_sqrt
        self.foreach = foreach
        # Tensors this optimizer may update as whole tensors (those it was built with); anything
        # else -- a flat ZeRO partition -- must come with a layout, or step() refuses it.
        self._whole_tensor_ids: set[int] = set()
        self._built_shapes: list[list[torch.Size]] = []  # per param group, to know a group of fp32 copies
        self._layouts: dict[int, PartitionLayout] = {}
        self._partition_pieces: dict[int, tuple[PartitionLayout, _PartitionPieces]] = {}
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        self._whole_tensor_ids.update(id(p) for p in self.param_groups[-1]["params"])
        self._built_shapes.append([p.shape for p in self.param_groups[-1]["params"]])

    def _copies_of_built_tensors(self, index: int, group: dict) -> bool:
        """DeepSpeed's fp16/bf16 optimizer without ZeRO swaps each group's tensors for fp32 master copies, one per
        tensor in the same order, and steps once in its constructor (before `enable_per_tensor_trust_ratio` can
        run): whole tensors, registered here. A flat ZeRO partition never has the group's shapes."""
        params = group["params"]
        if [p.shape for p in params] != self._built_shapes[index] or any(id(p) in self._layouts for p in params):
            return False
        self._whole_tensor_ids.update(id(p) for p in params)
        return True

    def set_partition_layouts(self, layouts: Iterable[PartitionLayout]) -> None:
        """Per-tensor trust ratios for flat partitions (called by `enable_per_tensor_trust_ratio`)."""
        self._layouts = {id(layout.partition): layout for layout in layouts}

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for index, group in enumerate(self.param_groups):
            whole = []
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise ConfigError("Lamb does not support sparse gradients; use dense embeddings")
                layout = self._layouts.get(id(p))
                if layout is None and id(p) not in self._whole_tensor_ids and not self._copies_of_built_tensors(
                        index, group):
                    raise ConfigError(
                        "Lamb was handed a tensor it was not built with (DeepSpeed ZeRO replaces the "
                        "parameters by flat partitions): call widenet_ds.engine.lamb.enable_per_tensor_trust_ratio"
                        "(engine) right after deepspeed.initialize, or the trust ratio would be per partition"
                    )
                if not self._multi_tensor(p):
                    self._update(p, group, layout)
                elif layout is None:
                    whole.append(p)
                else:
                    self._update_partition(p, group, layout)
            if whole:
                self._update_tensors(whole, group)
        return loss

    def _multi_tensor(self, p: torch.Tensor) -> bool:
        """`foreach` as asked; by default on GPUs only (on CPU `_foreach_*` is a per-tensor loop anyway)."""
        return self.foreach if self.foreach is not None else p.device.type != "cpu"

    # ---- multi-tensor step ---------------------------------------------------------------------
    def _advance(self, params: list[torch.Tensor], group: dict) -> tuple[list, list, int]:
        """Step the states of `params` (all at the same step) and return (exp_avgs, updates, step)."""
        beta1, beta2 = group["betas"]
        states = [self.state[p] for p in params]
        for p, state in zip(params, states):
            if len(state) == 0:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            state["step"] += 1
        grads = [p.grad for p in params]
        exp_avgs = [s["exp_avg"] for s in states]
        exp_avg_sqs = [s["exp_avg_sq"] for s in states]
        torch._foreach_mul_(exp_avgs, beta1)
        torch._foreach_add_(exp_avgs, grads, alpha=1.0 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1.0 - beta2)
        if self.eps_inside_sqrt:
            denoms = torch._foreach_add(exp_avg_sqs, group["eps"])
            torch._foreach_sqrt_(denoms)
        else:
            denoms = torch._foreach_sqrt(exp_avg_sqs)
            torch._foreach_add_(denoms, group["eps"])
        updates = torch._foreach_div(exp_avgs, denoms)
        if group["weight_decay"] != 0.0:
            torch._foreach_add_(updates, params, alpha=group["weight_decay"])
        return exp_avgs, updates, states[0]["step"]

    def _step_size(self, group: dict, step: int) -> float:
        beta1, beta2 = group["betas"]
        if group["bias_correction"]:
            return group["lr"] * math.sqrt(1.0 - beta2**step) / (1.0 - beta1**step)
        return group["lr"]

    def _update_tensors(self, params: list[torch.Tensor], group: dict) -> None:
        """Whole tensors, batched by step count (tensors that missed a step's gradient lag behind)."""
        by_step: dict[int, list[torch.Tensor]] = {}
        for p in params:
            by_step.setdefault(self.state[p].get("step", 0), []).append(p)
        for batch in by_step.values():
            _, updates, step = self._advance(batch, group)
            coeffs = self._trust_ratio(torch.stack(torch._foreach_norm(batch)),
                                       torch.stack(torch._foreach_norm(updates)), group)
            torch._foreach_mul_(updates, list(coeffs.unbind()))
            torch._foreach_add_(batch, updates, alpha=-self._step_size(group, step))

    def _update_partition(self, p: torch.Tensor, group: dict, layout: PartitionLayout) -> None:
        """A flat ZeRO partition: moments and update over the whole partition, trust ratio per tensor piece."""
        _, (update,), step = self._advance([p], group)
        pieces = self._pieces(layout, p)
        # Sums of squares per original tensor: this rank's pieces, then summed over the ranks that hold
        # the other pieces of tensors straddling a partition boundary.
        sums = torch.zeros(2, layout.num_tensors, dtype=torch.float32, device=p.device)
        if pieces.tensor_index is not None:
            split_w, split_u = p.split(pieces.sizes), update.split(pieces.sizes)
            w_parts = [split_w[i] for i in pieces.segments]
            u_parts = [split_u[i] for i in pieces.segments]
            sums[:, pieces.tensor_index] = torch.stack([_sums_of_squares(w_parts), _sums_of_squares(u_parts)])
        if layout.process_group is not None:
            torch_dist.all_reduce(sums, op=torch_dist.ReduceOp.SUM, group=layout.process_group)
        if pieces.tensor_index is None:
            return
        coeffs = self._trust_ratio(sums[0].sqrt(), sums[1].sqrt(), group)[pieces.tensor_index]
        # Padding between and after tensors belongs to no segment and is left untouched.
        torch._foreach_mul_(u_parts, list(coeffs.unbind()))
        torch._foreach_add_(w_parts, u_parts, alpha=-self._step_size(group, step))

    def _pieces(self, layout: PartitionLayout, flat: torch.Tensor) -> "_PartitionPieces":
        cached = self._partition_pieces.get(id(layout))
        if cached is None or cached[0] is not layout:
            cached = (layout, _PartitionPieces.of(layout, flat))
            self._partition_pieces[id(layout)] = cached
        return cached[1]

    # ---- per-tensor step (foreach=False, the CPU default): the reference -------------------------
    def _update(self, p: torch.Tensor, group: dict, layout: PartitionLayout | None) -> None:
        state = self.state[p]
        if len(state) == 0:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        beta1, beta2 = group["betas"]
        state["step"] += 1
        step = state["step"]

        grad = p.grad
        exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
        # The update is computed in the denominator's buffer: one temporary tensor per step of a tensor
        if self.eps_inside_sqrt:
            update = (exp_avg_sq + group["eps"]).sqrt_()
        else:
            update = exp_avg_sq.sqrt().add_(group["eps"])
        torch.div(exp_avg, update, out=update)
        if group["weight_decay"] != 0.0:
            update.add_(p, alpha=group["weight_decay"])

        step_size = group["lr"]
        if group["bias_correction"]:
            step_size *= math.sqrt(1.0 - beta2**step) / (1.0 - beta1**step)

        if layout is None:
            coeff = self._trust_ratio(p.norm(), update.norm(), group)
            p.add_(update.mul_(coeff), alpha=-step_size)
            return

        # Sums of squares per original tensor: this rank's pieces, then summed over the ranks
        # that hold the other pieces of tensors straddling a partition boundary.
        sums = torch.zeros(2, layout.num_tensors, dtype=torch.float32, device=p.device)
        for seg in layout.segments:
            w = p.narrow(0, seg.start, seg.numel)
            u = update.narrow(0, seg.start, seg.numel)
            sums[0, seg.tensor_index] = w.float().square().sum()
            sums[1, seg.tensor_index] = u.float().square().sum()
        if layout.process_group is not None:
            torch_dist.all_reduce(sums, op=torch_dist.ReduceOp.SUM, group=layout.process_group)
        coeffs = self._trust_ratio(sums[0].sqrt(), sums[1].sqrt(), group)
        # Padding between and after tensors belongs to no segment and is left untouched.
        for seg in layout.segments:
            u = update.narrow(0, seg.start, seg.numel)
            p.narrow(0, seg.start, seg.numel).add_(u.mul_(coeffs[seg.tensor_index]), alpha=-step_size)

    @staticmethod
    def _trust_ratio(w_norm: torch.Tensor, u_norm: torch.Tensor, group: dict) -> torch.Tensor:
        """||w|| / ||u|| clamped to [min_coeff, max_coeff]; 1 where either norm is 0 (as DeepSpeed)."""
        ratio = (w_norm / u_norm).clamp(group["min_coeff"], group["max_coeff"])
        return torch.where((w_norm != 0) & (u_norm != 0), ratio, torch.ones_like(ratio))


def _sums_of_squares(parts: list[torch.Tensor]) -> torch.Tensor:
    """[len(parts)] fp32 sum of squares of each part.

    On CUDA one multi-tensor norm kernel (squared). On CPU, where `_foreach_*` is a per-tensor loop anyway,
    the reduction of the per-tensor step (square, then sum): bit-identical results to it, which the golden
    loss curves (ZeRO 1 on CPU) hold us to; the two forms differ by float rounding only (~1e-7 relative)."""
    if parts[0].device.type == "cpu":
        return torch.stack([part.float().square().sum() for part in parts])
    return torch.stack(torch._foreach_norm(parts)).float().square()


@dataclass(frozen=True)
class _PartitionPieces:
    """A flat partition cut into pieces (segments and the gaps between them): one `split` then gives
    views of every tensor piece, in segment order, for the multi-tensor kernels."""

    sizes: list[int]                  # split sizes covering the whole partition
    segments: list[int]               # which pieces are the layout's segments, in segment order
    tensor_index: torch.Tensor | None  # [segments] their tensor indices, on the partition's device

    @classmethod
    def of(cls, layout: PartitionLayout, flat: torch.Tensor) -> "_PartitionPieces":
        sizes, piece_of_segment, offset = [], {}, 0
        for i in sorted(range(len(layout.segments)), key=lambda i: layout.segments[i].start):
            seg = layout.segments[i]
            if seg.start > offset:
                sizes.append(seg.start - offset)
            piece_of_segment[i] = len(sizes)
            sizes.append(seg.numel)
            offset = seg.start + seg.numel
        if offset < flat.numel():
            sizes.append(flat.numel() - offset)
        index = None
        if layout.segments:
            index = torch.tensor([seg.tensor_index for seg in layout.segments], device=flat.device)
        return cls(sizes, [piece_of_segment[i] for i in range(len(layout.segments))], index)


def enable_per_tensor_trust_ratio(engine) -> None:
    """Make the engine's `Lamb` compute its trust ratio per original tensor.

    Call once, right after `deepspeed.initialize(model=..., optimizer=Lamb(...), config=...)`.
    Without ZeRO (stage 0: fp32, or fp16/bf16 with their fp32 copies) `Lamb` already sees whole tensors. Under ZeRO stage 1/2
    this reads DeepSpeed's partition bookkeeping and hands `Lamb` one layout per flat partition.
    Any other wrapper (bf16 optimizer, ZeRO-3, offload) is refused, never run per partition.
    """
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    wrapper = engine.optimizer
    lamb = getattr(wrapper, "optimizer", wrapper)
    if not isinstance(lamb, Lamb):
        raise ConfigError(
            f"the engine's optimizer is {type(lamb).__name__}, not widenet_ds.engine.lamb.Lamb; pass "
            "optimizer=Lamb(params, **lamb_params) to deepspeed.initialize (and no JSON optimizer)"
        )
    if wrapper is lamb:
        return  # stage 0 in fp32: whole tensors already
    if isinstance(wrapper, FP16_UnfusedOptimizer):
        # fp16/bf16 without ZeRO: one fp32 master copy per tensor (whole tensors). Its constructor stepped once
        # with zero gradients to create the state, which for LAMB is a real update (weight decay at the full
        # rate, step 1): undone, the masters copied again from the 16-bit weights they were made from.
        lamb.state.clear()
        wrapper.refresh_fp32_params()
        return
    if type(wrapper) is not DeepSpeedZeroOptimizer:
        raise ConfigError(
            f"per-tensor LAMB does not know the layout of DeepSpeed's {type(wrapper).__name__} "
            "(bf16 with ZeRO stage 1 and fp32 gradient accumulation, or ZeRO stage 3, lead here); "
            "use ZeRO stage 1/2 (bf16 stage 1: set data_types.grad_accum_dtype to bf16) or stage 0"
        )
    lamb.set_partition_layouts(zero_partition_layouts(wrapper))


def zero_partition_layouts(zero) -> list[PartitionLayout]:
    """One layout per param group of a `DeepSpeedZeroOptimizer` (ZeRO stage 1/2), checked."""
    if zero.cpu_offload or getattr(zero, "zenflow", False):
        raise ConfigError(
            "per-tensor LAMB under ZeRO offload / ZenFlow is not supported: remove "
            "zero_optimization.offload_optimizer (and zenflow) or use DeepSpeed's own optimizer"
        )
    layouts = []
    for i, flat in enumerate(zero.single_partition_of_fp32_groups):
        held = zero.optimizer.param_groups[i]["params"]
        if len(held) != 1 or held[0] is not flat:
            raise ConfigError(f"ZeRO param group {i} does not hold its flat fp32 partition; unknown layout")
        group = zero.real_dp_process_group[i]
        world = torch_dist.get_world_size(group=group)
        rank = torch_dist.get_rank(group=group)
        size = zero.partition_size[i]
        if flat.numel() != size:
            raise ConfigError(f"ZeRO group {i}: partition has {flat.numel()} elements, expected {size}")
        tensors = zero.round_robin_bit16_groups[i]
        offsets = zero.round_robin_bit16_offsets[i]
        begin, end = rank * size, (rank + 1) * size
        segments = []
        for index, (tensor, offset) in enumerate(zip(tensors, offsets, strict=True)):
            lo, hi = max(offset, begin), min(offset + tensor.numel(), end)
            if lo < hi:
                segments.append(TensorSegment(index, lo - begin, hi - lo))
                _check_segment(flat, tensor, lo - offset, segments[-1], i)
        in_partition = {id(t) for t in zero.params_in_partition[i]}
        if {id(tensors[s.tensor_index]) for s in segments} != in_partition:
            raise ConfigError(f"ZeRO group {i}: our segments disagree with DeepSpeed's params_in_partition")
        layouts.append(
            PartitionLayout(flat, tuple(segments), len(tensors), group if world > 1 else None)
        )
    return layouts


def _check_segment(flat: torch.Tensor, tensor: torch.Tensor, tensor_start: int, seg: TensorSegment, group: int):
    """The fp32 master slice must equal the model tensor's slice: proof we read the layout right."""
    master = flat.detach().narrow(0, seg.start, seg.numel).to(tensor.dtype)
    model = tensor.detach().reshape(-1).narrow(0, tensor_start, seg.numel).to(master.device)
    if not torch.equal(master, model):
        raise ConfigError(
            f"ZeRO group {group}: the flat partition does not hold tensor {seg.tensor_index} where its "
            "bookkeeping says; this DeepSpeed version lays partitions out differently, per-tensor LAMB refused"
        )


def build_param_groups(
    model: nn.Module,
    weight_decay: float,
    no_decay_modules: tuple[type[nn.Module], ...] = (nn.LayerNorm,),
) -> list[dict]:
    """Decay / no-decay groups (BERT: no weight decay on biases and LayerNorm weights), then the
    expert parameters split into their own groups as DeepSpeed MoE requires."""
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

    no_decay_ids = {
        id(p)
        for module in model.modules()
        if isinstance(module, no_decay_modules)
        for p in module.parameters(recurse=False)
    }
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if id(p) in no_decay_ids or name.rsplit(".", 1)[-1] == "bias":
            no_decay.append(p)
        else:
            decay.append(p)
    groups = [
        {"name": "decay", "params": decay, "weight_decay": weight_decay},
        {"name": "no_decay", "params": no_decay, "weight_decay": 0.0},
    ]
    groups = split_params_into_different_moe_groups_for_optimizer(groups)
    # DeepSpeed's ZeRO cannot flatten an empty group.
    return [g for g in groups if g["params"]]
