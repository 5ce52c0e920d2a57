"""What a finetuning run scored: one seed's results (seed<N>/results.json) and the run's summary of every seed
with their median (results.json)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from widenet_ds.results import ResultFields, Scores


@dataclass(frozen=True)
class SeedResults:
    """One finetuning seed: its final evaluation per split."""

    WHAT: ClassVar[str] = "a finetuning seed's results"
    FORMAT: ClassVar[str] = "results.seed"
    seed: int
    metrics: Scores
    final_train_loss: float | None = None  # the last logged train/loss (None: none logged)

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "metrics": self.metrics, "final_train_loss": self.final_train_loss}

    @classmethod
    def from_json(cls, data: Any, where: str) -> Self:
        fields = ResultFields(data, where, cls.WHAT, cls.FORMAT)
        return cls(fields.integer("seed"), fields.scores("metrics"), fields.number("final_train_loss", nullable=True))


@dataclass(frozen=True)
class DeepSpeedUsed:
    """The DeepSpeed JSON a finetuning run trained with, and its batch size and peak learning rate."""

    config: str
    train_batch_size: int | None
    lr: float | None

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config, "train_batch_size": self.train_batch_size, "lr": self.lr}

    @classmethod
    def from_json(cls, data: Any, where: str) -> Self:
        fields = ResultFields(data, where, "the finetuning results' 'deepspeed'")
        return cls(fields.text("config"), fields.integer("train_batch_size", nullable=True),
                   fields.number("lr", nullable=True))


@dataclass(frozen=True)
class FinetuneResults:
    """A finetuning run (GLUE, SQuAD): every seed's scores, their median and the settings they trained with.
    Fields after `per_seed` were added over version 1 (formats.py gives files of it None / empty for them)."""

    WHAT: ClassVar[str] = "finetuning results"
    KIND: ClassVar[str] = "finetune"
    FORMAT: ClassVar[str] = "results.finetune"
    task: str
    init: str | None  # the weights every seed started from ("preset:<name>" for a random init)
    steps: int
    seeds: int
    median: dict[str, dict[str, float]]  # split -> metric -> median over the seeds
    per_seed: list[SeedResults]
    seed: int | None = None  # the first seed
    primary_metric: str | None = None
    baseline: Scores = field(default_factory=dict)  # a trivial predictor's scores
    load_report: str = ""
    recipe: dict[str, Any] | str | None = None  # the task recipe and the model overrides (older: its source)
    recipe_mismatch: list[str] = field(default_factory=list)
    ep_size: int | None = None
    deepspeed: DeepSpeedUsed | None = None
    max_seq_length: int | None = None

    def primary_median(self) -> tuple[str, float | None]:
        """("<split>/<metric>", its median) of the first evaluation split's primary metric."""
        split = next(iter(self.median), None)
        return f"{split}/{self.primary_metric}", (self.median.get(split) or {}).get(self.primary_metric)

    def to_json(self) -> dict[str, Any]:
        return {"task": self.task, "init": self.init, "steps": self.steps, "seed": self.seed, "seeds": self.seeds,
                "primary_metric": self.primary_metric, "median": self.median,
                "per_seed": [s.to_json() for s in self.per_seed], "baseline": self.baseline,
                "load_report": self.load_report, "recipe": self.recipe, "recipe_mismatch": self.recipe_mismatch,
                "ep_size": self.ep_size, "deepspeed": self.deepspeed.to_json() if self.deepspeed else None,
                "max_seq_length": self.max_seq_length}

    @classmethod
    def from_json(cls, data: Any, where: str) -> Self:
        fields = ResultFields(data, where, cls.WHAT, cls.FORMAT)
        per_seed = fields.get("per_seed", lambda v: isinstance(v, list), "a list of the seeds' results")
        deepspeed = fields.get("deepspeed", lambda v: isinstance(v, dict), "an object", nullable=True)
        return cls(
            task=fields.text("task"), init=fields.text("init", nullable=True), steps=fields.integer("steps"),
            seeds=fields.get("seeds", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                             "a count of seeds (1 or more)"), median=fields.scores("median"),
            per_seed=[SeedResults.from_json(s, f"{where}, per_seed[{i}]") for i, s in enumerate(per_seed)],
            seed=fields.integer("seed", nullable=True), primary_metric=fields.text("primary_metric", nullable=True),
            baseline=fields.scores("baseline"), load_report=fields.text("load_report"),
            recipe=fields.get("recipe", lambda v: isinstance(v, (dict, str)), "an object", nullable=True),
            recipe_mismatch=fields.get("recipe_mismatch", lambda v: isinstance(v, list) and all(
                isinstance(x, str) for x in v), "a list of texts"),
            ep_size=fields.integer("ep_size", nullable=True),
            deepspeed=DeepSpeedUsed.from_json(deepspeed, f"{where}, deepspeed") if deepspeed is not None else None,
            max_seq_length=fields.integer("max_seq_length", nullable=True))
