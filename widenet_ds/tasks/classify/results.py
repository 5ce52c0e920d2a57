"""What a finished image-classification run scored (results.json): the test split's scores of the final model,
what trained it, and for ParaFormer models the test accuracy of each prefix of branches."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from widenet_ds.results import ResultFields, is_number


@dataclass(frozen=True)
class ClassifyResults:
    """Image classification: the test split's scores of the final model and what trained it."""

    WHAT: ClassVar[str] = "image-classification results"
    KIND: ClassVar[str] = "classify"
    FORMAT: ClassVar[str] = "results.classify"
    step: int
    dataset: str
    model_config: str | None  # the preset or config file (or the --init-from folder) the run started from
    ep_size: int
    world_size: int
    parameters: int | None    # the whole model's trainable parameters (older ep > 1 runs: null)
    test: dict[str, float]    # "test/accuracy" (always), "test/task_loss", ...
    branch_schedule: str | None = None  # ParaFormer models only, with accuracy_by_branches
    accuracy_by_branches: dict[int, float] = field(default_factory=dict)  # k -> test accuracy of the first k

    @property
    def accuracy(self) -> float:
        return self.test["test/accuracy"]

    def to_json(self) -> dict[str, Any]:
        out = {"step": self.step, "dataset": self.dataset, "model_config": self.model_config, "ep_size": self.ep_size,
               "world_size": self.world_size, "parameters": self.parameters, **self.test}
        if self.accuracy_by_branches:
            out["branch_schedule"] = self.branch_schedule
            out["accuracy_by_branches"] = {str(k): v for k, v in self.accuracy_by_branches.items()}
        return out

    @classmethod
    def from_json(cls, data: Any, where: str) -> Self:
        fields = ResultFields(data, where, cls.WHAT, cls.FORMAT)
        fields.number("test/accuracy")  # required: what an image run is for
        by_branches = fields.get("accuracy_by_branches", lambda v: isinstance(v, dict) and all(
            k.isdigit() and is_number(a) for k, a in v.items()), 'an object {"<k>": accuracy}', {})
        return cls(fields.integer("step"), fields.text("dataset"), fields.text("model_config", nullable=True),
                   fields.integer("ep_size"), fields.integer("world_size"),
                   fields.integer("parameters", nullable=True),
                   fields.scalars([k for k in fields.keys() if k.startswith("test/")]),
                   fields.text("branch_schedule", None, nullable=True),
                   {int(k): float(a) for k, a in by_branches.items()})
