"""What a finished pretraining run scored (results.json): the step it ended at and the final held-out evaluation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from widenet_ds.results import ResultFields


@dataclass(frozen=True)
class PretrainResults:
    """Pretraining: the step it ended at and the final held-out evaluation (none without held-out data)."""

    WHAT: ClassVar[str] = "pretraining results"
    KIND: ClassVar[str] = "pretrain"  # the report's section (report/metrics.py)
    FORMAT: ClassVar[str] = "results.pretrain"  # its kind in widenet_ds/formats.py
    step: int
    held_out: dict[str, float] = field(default_factory=dict)  # "valid/...", "valid_branches_<k>/..." as logged

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, **self.held_out}

    @classmethod
    def from_json(cls, data: Any, where: str) -> Self:
        fields = ResultFields(data, where, cls.WHAT, cls.FORMAT)
        return cls(fields.integer("step"), fields.scalars([k for k in fields.keys() if k != "step"]))
