"""What a finished run scored, typed: one frozen dataclass per shape of results.json.

    PretrainResults   pretraining: {"step", the held-out scalars ("valid/...", "valid_branches_<k>/...")}
    ClassifyResults   image classification: {"step", "dataset", "model_config", "ep_size", "world_size",
                      "parameters", "test/...", and for ParaFormer models "branch_schedule",
                      "accuracy_by_branches": {"<k>": accuracy}}
    SeedResults       one finetuning seed (seed<N>/results.json): {"seed", "metrics", "final_train_loss"}
    FinetuneResults   a finetuning run: the task, its settings, every seed's SeedResults and their median

`to_json` gives the entries results.json has always had (`RunFolder.write_results` adds the format version of
the class's kind, `FORMAT`); `from_json` reads them back after widenet_ds/formats.py has upgraded a file of an
earlier version (finetuning summaries gained entries over version 1). Image results hold `branch_schedule` and
`accuracy_by_branches` only for ParaFormer models. A file of another shape is one RunFolderError naming the file
and the key. Keys this version does not know are left out, not refused.

Imports neither torch nor DeepSpeed: the report reads results on machines that only have run folders.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from widenet_ds.errors import RunFolderError
from widenet_ds.formats import VERSION_KEY, upgrade

# split -> metric -> value; numbers, and now and then a text (a GLUE baseline's "note")
Scores = dict[str, dict[str, Any]]


def is_number(value: Any) -> bool:
    """An int or float, NaN included (a diverged loss is still a result); JSON true/false are bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# SQuAD's official scores are percentages (0-100, as its evaluation script prints them); every other score is a
# fraction (0-1). The console and the report show the scale with each value; results.json keeps its layout (its
# "task" says which scale its numbers are on).
_SQUAD_NOT_SCORES = ("total", "threshold", "thresh")


def metric_scale(task: str | None, metric: str) -> str:
    """"0-100" for a SQuAD score, "0-1" for any other task's, "" for what is not a score (a count, a threshold)
    or of a task not known (None)."""
    if task is None:
        return ""
    if task.lower().startswith("squad"):
        return "" if any(metric.endswith(word) for word in _SQUAD_NOT_SCORES) else "0-100"
    return "0-1"


def with_scale(task: str | None, metric: str, value: float) -> str:
    """`value` as the console shows it: a percentage with its sign, a fraction as it is."""
    return f"{value:.4f}%" if metric_scale(task, metric) == "0-100" else f"{value:.4f}"


def numbers(scores: Scores) -> dict[str, dict[str, float]]:
    """The numeric values of each split (texts left out)."""
    return {split: {name: float(v) for name, v in values.items() if is_number(v)} for split, values in scores.items()}


class _Fields:
    """The keys of one results.json object of the kind `kind` (upgraded to its current version), each checked for
    its type; errors name the file and the key."""

    def __init__(self, data: Any, where: str, what: str, kind: str | None = None) -> None:
        if not isinstance(data, dict):
            raise RunFolderError(f"{where}: {what} must be a JSON object, not {type(data).__name__}; the file was "
                                 f"edited or damaged: restore it, or run again into another folder.")
        self.data, self.where, self.what = upgrade(kind, data, where) if kind else data, where, what

    def keys(self) -> list[str]:
        """The file's entries (its format version left out)."""
        return [key for key in self.data if key != VERSION_KEY]

    def _bad(self, key: str, why: str) -> RunFolderError:
        return RunFolderError(f"{self.where}: {self.what}: {key!r} {why}; the file was edited or damaged: restore it, "
                              f"or run again into another folder.")

    def get(self, key: str, check, kind: str, default: Any = ..., *, nullable: bool = False) -> Any:
        """The value of `key`, which `check` accepts (`kind` says what it should be); `default` when it is
        absent (no default: the key is required)."""
        if key not in self.data:
            if default is ...:
                raise self._bad(key, "is missing")
            return default
        value = self.data[key]
        if (value is None and nullable) or check(value):
            return value
        raise self._bad(key, f"is {value!r}, not {kind}")

    def integer(self, key: str, default: Any = ..., **kw) -> Any:
        return self.get(key, lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer", default, **kw)

    def number(self, key: str, default: Any = ..., **kw) -> Any:
        return self.get(key, is_number, "a number", default, **kw)

    def text(self, key: str, default: Any = ..., **kw) -> Any:
        return self.get(key, lambda v: isinstance(v, str), "a text", default, **kw)

    def scores(self, key: str, default: Any = ...) -> Any:
        return self.get(key, lambda v: isinstance(v, dict) and all(isinstance(s, dict) for s in v.values()),
                        "an object of splits, each an object of metrics", default)

    def scalars(self, keys: list[str]) -> dict[str, float]:
        """Flat metrics ("valid/loss": 2.3, ...): each a number."""
        return {key: self.number(key) for key in keys}


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
        fields = _Fields(data, where, cls.WHAT, cls.FORMAT)
        return cls(fields.integer("step"), fields.scalars([k for k in fields.keys() if k != "step"]))


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
        fields = _Fields(data, where, cls.WHAT, cls.FORMAT)
        fields.number("test/accuracy")  # required: what an image run is for
        by_branches = fields.get("accuracy_by_branches", lambda v: isinstance(v, dict) and all(
            k.isdigit() and is_number(a) for k, a in v.items()), 'an object {"<k>": accuracy}', {})
        return cls(fields.integer("step"), fields.text("dataset"), fields.text("model_config", nullable=True),
                   fields.integer("ep_size"), fields.integer("world_size"),
                   fields.integer("parameters", nullable=True),
                   fields.scalars([k for k in fields.keys() if k.startswith("test/")]),
                   fields.text("branch_schedule", None, nullable=True),
                   {int(k): float(a) for k, a in by_branches.items()})


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
        fields = _Fields(data, where, cls.WHAT, cls.FORMAT)
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
        fields = _Fields(data, where, "the finetuning results' 'deepspeed'")
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
        fields = _Fields(data, where, cls.WHAT, cls.FORMAT)
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


Results = PretrainResults | ClassifyResults | SeedResults | FinetuneResults

