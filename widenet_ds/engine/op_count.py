"""How many operators a piece of work runs: the host overhead that makes a small-kernel model launch-bound.

On a GPU every operator is at least one kernel launch plus Python and dispatcher time on the host, whatever
the tensor sizes; a model whose step runs thousands of small operators waits on its host. That count is the
same on every host, so it can be measured (and pinned by tests) on a CPU.

`count_ops(fn)` runs `fn` under torch.profiler and counts the operators that do work: the leaves of the
aten call tree (an `aten::linear` that calls `aten::addmm` counts once) and the kernels torch.compile
generated (inductor's C++ kernels, `graph_<n>_cpp_fused_...`, see `record_compiled_kernels`). Views,
metadata-only operators (`view`, `transpose`, `detach`, `empty`, `resolve_conj`, ...) and composite
operators that called nothing launch nothing and are left out (`launches_nothing`), and so are copies and
fills of 0-dim tensors (`_scalar_bookkeeping`: a CPU kernel's Python-number arguments).

Leaves count what runs, an operator's internal ones included: CPU `addmm` copies its bias into the output
(`copy_`) before the GEMM, SDPA's backward zeroes its buffers (`zero_`). These ops are what torch.profiler
shows; a GPU's kernels differ in detail (its `addmm` fuses the bias), not in order of magnitude.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch._inductor.config as inductor_config
from torch.profiler import ProfilerActivity, profile

# Operators that only allocate or change metadata: no kernel on any device.
METADATA_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "resize_", "resolve_conj",
    "resolve_neg", "lift_fresh", "set_", "_has_same_storage_numel", "is_same_size", "_unsafe_view",
})
SCALAR_BOOKKEEPING_OPS = frozenset({"aten::copy_", "aten::_to_copy", "aten::fill_", "aten::zero_"})
# One kernel on a GPU, whatever its CPU fallback calls inside.
ONE_KERNEL_OPS = frozenset({"aten::_grouped_mm"})
# Prefixes of events that name kernels torch.compile generated (inductor C++ kernels with kernel profiling on).
COMPILED_KERNEL_MARKERS = ("cpp_fused_", "cpp_kernel_")


@functools.cache
def launches_nothing(op: str) -> bool:
    """Whether aten::`op` never runs a kernel of its own: metadata, a view (an overload returns an alias of an
    input: `view`, `transpose`, `detach`, `to`/`contiguous` when there is nothing to do), or a composite
    (CompositeImplicitAutograd: it only calls other operators, so as a leaf it did nothing, e.g. dropout
    with p = 0)."""
    if op in METADATA_OPS:
        return True
    packet = getattr(torch.ops.aten, op, None)
    if packet is None:
        return False
    schemas = [getattr(packet, overload)._schema for overload in packet.overloads()]
    if any(s.returns and all(r.alias_info is not None and not r.alias_info.is_write for r in s.returns)
           for s in schemas):
        return True
    composite = [overload.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd)
                 for overload in _functional_overloads(packet)]
    return bool(composite) and all(composite)


def _functional_overloads(packet) -> list:
    """The overloads the dispatcher knows, `out=` variants left out (TorchScript's list / scalar builtins,
    e.g. `slice.t` or `__and__.bool`, are not dispatcher ops)."""
    found = []
    for name in packet.overloads():
        if name == "out" or name.endswith("_out"):
            continue
        try:
            torch._C._dispatch_find_schema_or_throw(packet._qualified_op_name, "" if name == "default" else name)
        except RuntimeError:
            continue
        found.append(getattr(packet, name))
    return found


def is_counted(name: str) -> bool:
    """Whether a profiler event is an operator that may do work (see the module docstring)."""
    if name.startswith("aten::"):
        return not launches_nothing(name[len("aten::"):])
    return any(marker in name for marker in COMPILED_KERNEL_MARKERS)


@dataclass
class OpCount:
    """The counted operators of one run of a function, by name."""

    ops: Counter

    @property
    def total(self) -> int:
        return sum(self.ops.values())

    def __sub__(self, other: "OpCount") -> "OpCount":
        return OpCount(self.ops - other.ops)


def count_ops(fn: Callable[[], object]) -> OpCount:
    """Run `fn` once under torch.profiler and count its operators: leaves of the call tree that do work.

    `torch._grouped_mm` counts once: on a GPU it is one kernel; its CPU fallback's per-group GEMMs inside it
    are not counted. Functions compiled with torch.compile show their kernels only if compiled after
    `record_compiled_kernels()`."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    counted = Counter()
    for event in prof.events():
        if (_works(event) and not _inside(event, ONE_KERNEL_OPS)
                and (event.name in ONE_KERNEL_OPS or not _has_counted_descendant(event))):
            counted[_short_name(event.name)] += 1
    return OpCount(counted)


def _scalar_bookkeeping(event) -> bool:
    """A copy or fill of 0-dim tensors only: how CPU kernels take a Python number (`x * 2` converts the 2 to a
    0-dim tensor of x's dtype) or start a full reduction (`sum` fills its 0-dim output). A GPU kernel takes
    the number as an argument: no kernel, no launch."""
    return (event.name in SCALAR_BOOKKEEPING_OPS and bool(event.input_shapes)
            and all(shape == [] for shape in event.input_shapes if isinstance(shape, list)))


def record_compiled_kernels() -> None:
    """Make inductor record a profiler event per generated C++ kernel (read when a graph is compiled: call
    this before the first call of a compiled function)."""
    inductor_config.cpp.enable_kernel_profile = True


def _works(event) -> bool:
    return is_counted(event.name) and not _scalar_bookkeeping(event)


def _has_counted_descendant(event) -> bool:
    return any(_works(child) or _has_counted_descendant(child) for child in event.cpu_children)


def _inside(event, names: frozenset[str]) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name in names:
            return True
        parent = parent.cpu_parent
    return False


def _short_name(name: str) -> str:
    # "graph_3_cpp_fused_add_gelu_7" -> "compiled kernel": one name for every generated kernel.
    return "compiled kernel" if any(marker in name for marker in COMPILED_KERNEL_MARKERS) else name
