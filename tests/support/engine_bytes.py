"""What a real DeepSpeed engine holds, summed from its tensors (each storage once): the module's weights, its
gradients (the parameters' own, ZeRO's partition buffers and reduce buckets), the fp32 master weights, the optimizer's
states, and every other tensor reachable from the engine (`other`: a few scalars). Measured where a step's gradients
peak: after the step's last backward, before its optimizer step."""

from __future__ import annotations

import torch
from torch import nn

DEEPSPEED_TYPES = ("deepspeed", "widenet_ds", "torch")


def _storages(tensors) -> dict[int, int]:
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors
            if isinstance(t, torch.Tensor)}


def _reachable(obj, engine, seen: set[int], found: dict[int, int], depth: int = 0) -> None:
    """Every tensor reachable from `engine` through attributes, containers and gradients."""
    if depth > 12 or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        found.update(_storages([obj]))
        for extra in (obj.grad, getattr(obj, "grad_accum", None)):
            _reachable(extra, engine, seen, found, depth + 1)
        return
    if isinstance(obj, dict):
        for key, value in obj.items():
            _reachable(key, engine, seen, found, depth + 1)
            _reachable(value, engine, seen, found, depth + 1)
        return
    if isinstance(obj, (list, tuple, set)):
        for value in obj:
            _reachable(value, engine, seen, found, depth + 1)
        return
    if isinstance(obj, nn.Module):
        for tensor in [*obj.parameters(), *obj.buffers()]:
            _reachable(tensor, engine, seen, found, depth + 1)
        if obj is not engine:
            return
    if (hasattr(obj, "__dict__") and not isinstance(obj, (type, torch.distributed.ProcessGroup))
            and type(obj).__module__.split(".")[0] in DEEPSPEED_TYPES):
        for name, value in vars(obj).items():
            if not (isinstance(obj, nn.Module) and name in ("_parameters", "_buffers", "_modules")):
                _reachable(value, engine, seen, found, depth + 1)


def engine_bytes(engine) -> dict[str, int]:
    module, wrapper = engine.module, engine.optimizer
    inner = getattr(wrapper, "optimizer", wrapper)  # ZeRO's and the 16-bit optimizers wrap the client's
    weights = _storages([*module.parameters(), *module.buffers()])
    if hasattr(wrapper, "single_partition_of_fp32_groups"):
        masters = list(wrapper.single_partition_of_fp32_groups)
    else:
        masters = [p for group in getattr(wrapper, "fp32_groups", []) for p in group]
    master = _storages(masters)
    states = _storages([value for state in inner.state.values() for value in state.values()])
    grads = [getattr(p, name, None) for p in module.parameters() for name in ("grad", "grad_accum")]
    for held in (getattr(wrapper, "averaged_gradients", None) or {}).values():
        grads += list(held) if isinstance(held, (list, tuple)) else [getattr(held, "flat_partition", held)]
    grads.append(getattr(wrapper, "grads_in_partition", None))
    for bucket in (getattr(wrapper, "ipg_buckets", None) or {}).values():
        grads += list(bucket.buffer)
    gradients = {ptr: size for ptr, size in _storages(grads).items() if ptr not in weights}
    found: dict[int, int] = {}
    _reachable(engine, engine, set(), found)
    counted = {**weights, **master, **states, **gradients}
    return {"weights": sum(weights.values()), "gradients": sum(gradients.values()), "master": sum(master.values()),
            "states": sum(states.values()), "other": sum(size for ptr, size in found.items() if ptr not in counted)}


def pretraining_batch(generator: torch.Generator, micro: int, seq: int, vocab: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, vocab, (micro, seq), generator=generator)
    labels = torch.where(torch.rand(ids.shape, generator=generator) < 0.15, ids, torch.full_like(ids, -100))
    return {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": torch.ones_like(ids),
            "mlm_labels": labels, "sop_labels": torch.randint(0, 2, (micro,), generator=generator)}


def bytes_at_the_gradient_peak(engine, generator: torch.Generator, micro: int, seq: int, vocab: int) -> dict[str, int]:
    """Two steps of the engine's accumulation: measured after the second step's last backward."""
    accumulation = engine.gradient_accumulation_steps()
    for step in range(2):
        for micro_step in range(accumulation):
            output = engine(**pretraining_batch(generator, micro, seq, vocab))
            engine.backward(output.loss)
            del output
            if step == 1 and micro_step == accumulation - 1:
                measured = engine_bytes(engine)
            engine.step()
    return measured
