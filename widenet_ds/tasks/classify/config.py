"""The settings of image classification: the dataset, the run's length in epochs, the loader workers and the
augmentation (the authors' ImageNet recipe)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from widenet_ds.errors import ConfigError
from widenet_ds.tasks.classify.results import ClassifyResults
from widenet_ds.training.flags import flag
from widenet_ds.training.run_config import DATA_HELP, DATASET_HELP, EVAL_SUBSET_HELP, MONITORING, RunConfig, missing
from widenet_ds.vision.augment_config import AugmentConfig
from widenet_ds.vision.config import VisionConfig
from widenet_ds.vision.datasets import DATASETS, data_fix

_AUGMENT = ("augmentation (the authors' ImageNet recipe: --randaugment 2,15 --inception-crop --flip --mixup-alpha 0.5 "
            "--label-smoothing 0.1)")


def _ops_magnitude(text: str) -> tuple[int, int]:
    ops, _, magnitude = text.partition(",")
    try:
        return int(ops), int(magnitude)  # both: a lone "2" silently meant magnitude 15
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected two integers OPS,MAGNITUDE, e.g. 2,15 (the magnitude "
                                         f"on kornia's 0..30 scale)") from None


@dataclass(kw_only=True)
class ClassifyConfig(RunConfig):
    """Image classification (ViT-WideNet, ViT, ViT-MoE, ParaFormer); `max_steps` defaults to `epochs` passes
    over the train split, else the schedule's total_num_steps."""

    TASK: ClassVar[str] = "classify"
    DESCRIPTION: ClassVar[str] = \
        "ViT-WideNet / ViT / ViT-MoE / ParaFormer image classification (docs/vision.md)."
    POSITIVE: ClassVar[tuple[str, ...]] = ("max_eval_examples",)
    EXAMPLE_DS_CONFIG: ClassVar[str] = "vision_cpu_small.json"
    MODEL: ClassVar[type[VisionConfig]] = VisionConfig
    PATH_SETTINGS: ClassVar[frozenset[str]] = RunConfig.PATH_SETTINGS | {"data"}

    dataset: Literal[DATASETS] = field(  # type: ignore[valid-type]
        default="fashion-mnist", metadata=flag(DATASET_HELP))
    data: Path | None = field(default=None, metadata=flag(DATA_HELP))
    epochs: float | None = field(default=None, metadata=flag("passes over the train split instead of --max-steps"))
    max_eval_examples: int | None = field(default=None, metadata=flag(EVAL_SUBSET_HELP, metavar="N",
                                                                      group=MONITORING))
    workers: int | None = field(default=None, metadata=flag(
        "data-loader workers per rank (default: the rank's share of the cores, at most 8; 0: in the rank's "
        "process)"))
    randaugment: tuple[int, int] = field(default=(0, 15), metadata=flag(
        "kornia RandAugment (0 ops: off)", parse=_ops_magnitude, metavar="OPS,MAGNITUDE", group=_AUGMENT))
    inception_crop: bool = field(default=False, metadata=flag("random resized crop, area 5%%..100%%", group=_AUGMENT))
    crop_min_area: float = field(default=0.05, metadata=flag("smallest crop area", group=_AUGMENT))
    flip: bool = field(default=False, metadata=flag("random horizontal flip", group=_AUGMENT))
    mixup_alpha: float = field(default=0.0, metadata=flag("mixup's Beta(alpha, alpha) (0: off)", group=_AUGMENT))
    cutmix_alpha: float = field(default=0.0, metadata=flag("CutMix's Beta(alpha, alpha) (0: off)", group=_AUGMENT))
    label_smoothing: float = field(default=0.0, metadata=flag("label smoothing of the loss", group=_AUGMENT))

    def __post_init__(self) -> None:
        self.data = Path(self.data) if self.data is not None else None
        self.randaugment = tuple(self.randaugment)
        super().__post_init__()

    def problems(self) -> list[str]:
        problems = super().problems()
        if self.dataset not in DATASETS:
            problems.append(f"--dataset {self.dataset!r} is not one of {list(DATASETS)}.")
        if self.epochs is not None and self.epochs <= 0:
            problems.append(f"--epochs must be positive (passes over the train split), got {self.epochs:g}.")
        elif self.epochs is not None and self.max_steps is not None:
            problems.append("--epochs and --max-steps both set the run's length; pass one of them.")
        if self.workers is not None and self.workers < 0:
            problems.append(f"--workers must be >= 0 (0: load in the rank's own process), got {self.workers}.")
        try:
            self.augment
        except ConfigError as err:
            problems.append(str(err))
        return problems

    def data_problems(self) -> list[str]:
        return missing("--data", self.data, data_fix(self.dataset)) if self.data else []

    def complete_results(self) -> ClassifyResults | None:
        """Finished at --max-steps or later (a run of --epochs: its length is the data's, which the ranks read)."""
        return self._finished_at(ClassifyResults)

    def results_line(self, results: ClassifyResults) -> str:
        return f"step {results.step}, " + ", ".join(f"{key} {value:.4f}" for key, value in results.test.items())

    @property
    def augment(self) -> AugmentConfig:
        return AugmentConfig(randaugment_ops=self.randaugment[0], randaugment_magnitude=self.randaugment[1],
                             inception_crop=self.inception_crop, crop_min_area=self.crop_min_area, flip=self.flip,
                             mixup_alpha=self.mixup_alpha, cutmix_alpha=self.cutmix_alpha,
                             label_smoothing=self.label_smoothing)
