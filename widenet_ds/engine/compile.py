"""torch.compile of a model for training, in place (state-dict keys, DeepSpeed's MoE detection and
checkpoints are unchanged: `nn.Module.compile` compiles the module's call, it does not wrap the module).

Modes (`--compile`):
* "model": the whole model in one graph per distinct input signature. Best fusion; the longest build.
* "blocks": regional compile, each distinct encoder sub-module (the shared attention and the shared MoE
  layer or FFN; one of each when shared, D of each when not) compiled on its own. WideNet calls the same
  shared modules D times per forward, so the build is one graph per module, as fast as one block's; the
  embeddings, LayerNorms and heads stay eager.
The MoE layer (routing, dispatch, grouped experts) traces whole in both modes (tests/engine/test_compile.py
checks `fullgraph=True`); expert parallelism with the expert-sorted dispatches (dropless, compact) breaks the
graph at its all-to-all split sizes (host integers, see widenet_ds/model/dropless.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # a run configuration names the modes: importing them imports no torch
    from torch import nn

CompileMode = Literal["none", "model", "blocks"]


def compile_for_training(model: nn.Module, mode: CompileMode, backend: str = "inductor") -> None:
    """Compile `model` (a WideNet task model) in place; "none" leaves it eager."""
    if mode == "none":
        return
    if mode == "model":
        model.compile(backend=backend)
        return
    encoder = model.encoder  # text and image models alike
    distinct = {id(m): m for m in [*encoder.attention, *encoder.ffn]}
    for module in distinct.values():
        module.compile(backend=backend)
