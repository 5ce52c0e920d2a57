"""The model: config and presets, the WideNet encoder and its task heads, routing, the shared MoE layer
(capacity, compact and dropless dispatch), parameter and FLOP counts. Written for one device; expert parallelism
is a run setting passed in by the trainer.

`from widenet_ds.model import WideNetForPreTraining` works (resolved lazily, so that importing
`widenet_ds.model.config` stays light and does not import DeepSpeed).
"""

from importlib import import_module

_EXPORTS = {
    "ModelConfig": "config", "MoEConfig": "config", "PRESETS": "config",
    "WideNetModel": "widenet", "WideNetForPreTraining": "widenet", "WideNetForSequenceClassification": "widenet",
    "WideNetForQuestionAnswering": "widenet",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
