"""The settings of MLM + sentence-order pretraining: the prepared data folder and the held-out evaluation's size."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

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
