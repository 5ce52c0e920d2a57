"""The settings of MLM + sentence-order pretraining: the prepared data folder and the held-out evaluation's size."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from widenet_ds.tasks.pretrain.results import PretrainResults
from widenet_ds.training.flags import flag
from widenet_ds.training.run_config import DATA_HELP, MONITORING, RunConfig, missing


@dataclass(kw_only=True)
class PretrainConfig(RunConfig):
    """MLM + sentence-order pretraining on a prepared data folder (`widenet-ds prepare-data`)."""

    TASK: ClassVar[str] = "pretrain"
    DESCRIPTION: ClassVar[str] = "WideNet / ALBERT / BERT MLM + sentence-order pretraining on a prepared data folder."
    POSITIVE: ClassVar[tuple[str, ...]] = ("eval_batches",)
    PATH_SETTINGS: ClassVar[frozenset[str]] = RunConfig.PATH_SETTINGS | {"data"}

    data: Path = field(metadata=flag(DATA_HELP))
    eval_batches: int = field(default=20, metadata=flag("micro-batches per rank in each evaluation",
                                                        group=MONITORING))

    def __post_init__(self) -> None:
        self.data = Path(self.data)
        super().__post_init__()

    def data_problems(self) -> list[str]:
        return missing("--data", self.data, "pass the folder `widenet-ds prepare-data --output` wrote")

    def complete_results(self) -> PretrainResults | None:
        """Pretraining finished at --max-steps or later (a larger --max-steps continues it)."""
        return self._finished_at(PretrainResults)

    def results_line(self, results: PretrainResults) -> str:
        held_out = ", ".join(f"{key} {value:.4f}" for key, value in results.held_out.items()
                             if key.startswith("valid/"))
        return f"step {results.step}" + (f", held-out {held_out}" if held_out else "")
