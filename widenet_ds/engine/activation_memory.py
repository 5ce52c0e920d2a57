"""The bytes a training step's forward and backward allocate beyond the model's states, counted without computing
anything: the module runs once on fake tensors (torch's FakeTensorMode: shapes, dtypes and storages, no data) while
`LiveBytes`, a TorchDispatchMode, adds up the storage of every tensor an operator creates and subtracts it when the
tensor is freed. The peak over the forward and backward, above what was alive before it, is the activations' share of
the step's peak: the tensors autograd saves, the temporaries of the operators, the gradients in flight (the
parameters' own gradients are held already, as between the micro-batches of a step).

The module is laid out as DeepSpeed lays it out for the step (`fake_engine_module`): cast to 16 bits per parameter, and
under ZeRO 1/2 each parameter group flattened into one buffer, the parameters views of it; views of one storage in
the built module (the experts' packed weights) stay views of one storage otherwise.

What fake tensors cannot say is settled where the model reads it: a value read on the host (an expert's group sizes,
the all-to-all split sizes) comes back 0 (`LiveBytes` answers `aten._local_scalar_dense`); where that would change
shapes the model asks `torch._subclasses.fake_tensor.is_fake` and takes even splits (widenet_ds/model/dropless.py).
torch's CPU grouped GEMM takes fp32, its shape rule only bf16: `LiveBytes` gives that operator its output shape.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch._utils import _flatten_dense_tensors
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages alive that operators created since `held` (what existed before is not counted), and
    their peak."""

    def __init__(self, held: list[torch.Tensor] = ()) -> None:
        super().__init__()
        self.live = self.peak = 0
        self._tracked: dict[int, weakref.finalize | None] = {id(t.untyped_storage()): None for t in held}

    def _track(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = id(storage)  # torch keeps one Python object per storage while it lives
        if key in self._tracked:
            return
        size = storage.nbytes()
        self.live += size
        self.peak = max(self.peak, self.live)

        def freed() -> None:
            self.live -= size
            self._tracked.pop(key, None)

        self._tracked[key] = weakref.finalize(storage, freed)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default:
            return 0  # a value read on the host: fake tensors hold none
        if func is torch.ops.aten._grouped_mm.default and args[0].dtype != torch.bfloat16:
            out = _grouped_mm_output(*args, **kwargs)
        else:
            out = func(*args, **kwargs)
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor):
                self._track(tensor)
        return out


def _grouped_mm_output(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None = None, *_, **kwargs):
    """torch._grouped_mm's output, allocated: a [N, K] @ b [G, K, M] -> [N, M]; a [K, N] @ b [N, M] -> [G, K, M]."""
    offs = kwargs.get("offs", offs)
    if a.dim() == 2 and b.dim() == 3:
        return a.new_empty(a.shape[0], b.shape[-1])
    return a.new_empty(offs.shape[0], a.shape[0], b.shape[-1])


def fake_engine_module(module: nn.Module, groups: Callable[[nn.Module], list[list[nn.Parameter]]], precision: str,
                       zero_stage: int, own_storages: bool, mode: FakeTensorMode) -> None:
    """`module` (built on the meta device) as fake CPU tensors laid out as DeepSpeed's engine lays it out: views of one
    storage stay views (the experts' packed weights), unless the engine casts it to 16 bits or moves it to a device
    (`own_storages`), which gives each parameter a storage of its own (`module.to`); under ZeRO 1/2 each optimizer
    parameter group (`groups`: the optimizer's groups of the module) is one flat buffer, its parameters views of it
    (DeepSpeedZeroOptimizer)."""
    storages: dict[int, torch.Tensor] = {}
    converted: dict[int, torch.Tensor] = {}

    def fake(tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) not in converted:  # a parameter shared by two modules stays one
            storage = tensor.untyped_storage()
            base = storages.get(id(storage))
            if base is None:
                base = storages[id(storage)] = torch.empty(storage.nbytes() // tensor.element_size(),
                                                           dtype=tensor.dtype)
            view = base.as_strided(tensor.shape, tensor.stride(), tensor.storage_offset())
            if isinstance(tensor, nn.Parameter):
                view = nn.Parameter(view, requires_grad=tensor.requires_grad)
                view.__dict__.update(tensor.__dict__)  # DeepSpeed's marks of an expert parameter
            converted[id(tensor)] = view
        return converted[id(tensor)]

    with mode:
        for child in module.modules():
            for name, tensor in child._parameters.items():
                if tensor is not None:
                    child._parameters[name] = fake(tensor)
            for name, tensor in child._buffers.items():
                if tensor is not None:
                    child._buffers[name] = fake(tensor)
        if precision != "fp32" or own_storages:
            for p in module.parameters():
                p.data = p.data.to(DTYPES[precision], copy=True)
        if zero_stage > 0:
            for params in groups(module):
                flat = _flatten_dense_tensors([p.data for p in params])
                offset = 0
                for p in params:
                    p.data = flat.narrow(0, offset, p.numel()).view(p.shape)
                    offset += p.numel()


def step_activation_bytes(module: nn.Module, forward: Callable[[nn.Module], Any], loss: Callable[[Any], torch.Tensor],
                          mode: FakeTensorMode) -> int:
    """The peak bytes one forward (`forward(module)`, which makes its own fake batch) and backward (of `loss(output)`)
    of the fake `module` allocate beyond its parameters and their gradients (held, as between micro-batches). The
    output stays alive through the backward, as the trainer keeps it for the step's metrics (training/trainer.py)."""
    with mode:
        for p in module.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        held = [t for p in module.parameters() for t in (p, p.grad) if t is not None] + list(module.buffers())
        tracker = LiveBytes(held)
        with tracker:
            output = forward(module)
            loss(output).backward()
            del output
        for p in module.parameters():
            p.grad = None
    return tracker.peak
