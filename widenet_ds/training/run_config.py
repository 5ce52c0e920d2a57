"""Run configurations: one base for what every training task shares, one extension per task; their flags are
generated from the fields (widenet_ds/training/command_line.py).

Batch sizes, learning rate, schedule, precision and ZeRO live ONLY in the DeepSpeed JSON; the model in
its model config (a preset, a JSON or a checkpoint folder), changed field by field with `--set KEY=VALUE`;
pretraining's sequence length and vocabulary come from the prepared data. A flag has one meaning in every
task (docs/flags.md lists them). A configuration holds types and values only: building one checks its values and
touches no file, so it can be built where the run will not start (a launcher, a study); what it names on the
machine that runs it (files, the output folder's lock, the compile backend) is checked where the run starts
(training/environment.py), every problem of both reported at once, before any data is read or model built.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import typing
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from widenet_ds.benchmarks.glue import get_glue_dataset, glue_split_path
from widenet_ds.distributed.collective_timeouts import (
    INIT_TIMEOUT_S,
    MIN_TIMEOUT_S,
    TRAIN_TIMEOUT_S,
)
from widenet_ds.engine.compile import CompileMode
from widenet_ds.errors import ConfigError, DataError, problems_text
from widenet_ds.model.config import PRESETS
from widenet_ds.run_folder import RunFolder
from widenet_ds.training.branch_schedule import ScheduleKind
from widenet_ds.training.flags import flag, int_list, to_argv
from widenet_ds.vision.augment import AugmentConfig
from widenet_ds.vision.config import VISION_PRESETS
from widenet_ds.vision.datasets import DATASETS, data_fix

OptimizerChoice = Literal["auto", "deepspeed-fused", "torch-lamb"]
LATEST = "latest"
HF_DATA = "hf"
DEFAULT_COMPILE_BACKEND = "inductor"
# Settings a resumed run may change: they decide what is logged, saved or evaluated, not what is trained
# (the DeepSpeed JSON's path may change; its contents are compared by what they do to the trajectory).
RESUMABLE_SETTINGS = frozenset({
    "output_dir", "resume", "accept_changed_settings", "deepspeed_config", "max_steps", "seeds", "log_interval",
    "eval_interval", "save_interval", "keep_last", "eval_batches", "max_eval_examples", "tensorboard",
    "progress_bar", "compile", "compile_backend", "workers", "predict_test", "save_model",
    "init_timeout", "train_timeout", "ep_size", "branch_parallel"})  # layout settings: a resume on another layout
#                                                                   re-lays the checkpoint out (training/new_shape.py)
_BRANCHES = "ParaFormer branch layouts (num_branches > 1; docs/paraformer.md)"
_MONITORING = "logging"
_CLUSTER = "faults on several ranks (docs/cluster.md)"
_DATA = ("the training data: pretraining, a prepared folder (`widenet-ds prepare-data`; its valid split is the "
         "evaluation's); finetuning, the task's files in their original format (a folder or file) or `hf` for HF "
         "datasets; images, the --dataset's folder (fashion-mnist default: /usr/share/datasets/fashion-mnist)")
_EVAL_SUBSET = "evaluate on the first N examples of the evaluation split only"


class InvalidConfig(ConfigError):
    """Settings whose values cannot work: every problem, and the configuration built anyway (`config`), so
    that where a run starts its environment's problems are reported with them (training/environment.py)."""

    def __init__(self, config: RunConfig, problems: list[str]) -> None:
        super().__init__(problems_text(problems, f"the {config.TASK} settings"))
        self.config = config


@dataclass(kw_only=True)
class RunConfig:
    """What every training task shares. `max_steps` counts optimizer steps (default: the task's own rule,
    else the schedule's `total_num_steps`); `resume` is None, "latest" or a checkpoint; `init_from` starts
    from another run's weights with a fresh optimizer and schedule."""

    TASK: ClassVar[str]

    deepspeed_config: Path = field(metadata=flag(
        "DeepSpeed JSON: batch sizes, optimizer, learning-rate schedule, precision, ZeRO (ds_configs/README.md)",
        names=("--deepspeed-config", "--deepspeed_config")))
    output_dir: Path = field(metadata=flag(
        "the run folder: run_config.json, metrics.jsonl, tensorboard/, checkpoints/, results.json; it must not "
        "hold another run unless --resume"))
    model_config: str | None = field(default=None, metadata=flag(
        "the model: a preset name, a model-config JSON or a checkpoint folder (its config); default with "
        "--init-from: the checkpoint's model"))
    overrides: list[str] = field(default_factory=list, metadata=flag(
        "change a model field, e.g. --set moe.num_experts=8 --set hidden_dropout=0.1 (VALUE as JSON, else a "
        "string); repeatable", names=("--set",), append=True, metavar="KEY=VALUE"))
    init_from: Path | None = field(default=None, metadata=flag(
        "start from the weights of a checkpoint (a portable folder, or a DeepSpeed tag folder, checkpoints folder "
        "or run folder), with a new optimizer and schedule; with a bare --resume, only when nothing is saved yet",
        metavar="CHECKPOINT"))
    resume: str | None = field(default=None, metadata=flag(
        "continue a stopped run exactly: bare, from the latest checkpoint in --output-dir (a fresh start when there "
        "is none yet, so a requeued job simply continues); or from the given checkpoint", const=LATEST,
        metavar="CHECKPOINT"))
    accept_changed_settings: bool = field(default=False, metadata=flag(
        "--resume although settings that change the training differ from the run's (the DeepSpeed JSON's batch, "
        "optimizer, schedule, precision; the seed, data, model overrides, ...); the changes are logged"))
    max_steps: int | None = field(default=None, metadata=flag(
        "optimizer steps to run (default: the task's, else the schedule's total_num_steps)"))
    seed: int = field(default=1234, metadata=flag(
        "initial weights and data order; each rank's dropout and routing-noise stream derives from it"))
    log_interval: int = field(default=10, metadata=flag(
        "steps between metric records (TensorBoard + metrics.jsonl); checkpoints close a record too",
        group=_MONITORING))
    eval_interval: int = field(default=1000, metadata=flag(
        "steps between evaluations during training (0: none); a finished run is always evaluated at its end",
        group=_MONITORING))
    save_interval: int = field(default=1000, metadata=flag(
        "steps between checkpoints (one is always written at the end and when stopped by a signal)"))
    keep_last: int = field(default=3, metadata=flag("complete checkpoints to keep; older ones are deleted"))
    ep_size: int = field(default=1, metadata=flag(
        "expert parallelism: each group of EP_SIZE ranks holds all experts, num_experts / EP_SIZE per rank"))
    branch_parallel: int = field(default=1, metadata=flag(
        "branch parallelism of a ParaFormer layout: each group of N ranks runs one copy of the batch, each rank its "
        "share of the branches (1: off)", metavar="N", group=_BRANCHES))
    activation_checkpointing: bool = field(default=False, metadata=flag(
        "recompute each block in backward: less memory, more compute"))
    compile: CompileMode = field(default="none", metadata=flag(
        "torch.compile the model in place: 'model' (the default of a bare --compile), 'blocks' (the encoder's "
        "distinct attention and MoE/FFN modules only: a faster build) or 'none' (the default: on CPU neither mode "
        "paid in pretraining or finetuning, docs/benchmarks.md)", const="model"))
    compile_backend: str = field(default=DEFAULT_COMPILE_BACKEND, metadata=flag(
        "torch.compile backend (inductor; aot_eager traces without generating kernels)"))
    optimizer: OptimizerChoice = field(default="auto", metadata=flag(
        "for a JSON asking for Lamb: DeepSpeed's fused CUDA kernel or our PyTorch LAMB (per-tensor trust ratio, "
        "also under ZeRO); auto picks (docs/optimizer.md)"))
    branch_schedule: ScheduleKind = field(default="joint", metadata=flag(
        "joint: all branches every step; prefix: the authors' code (per batch one step on each nested prefix of "
        "branches, alternating with joint phases); staged: branch i+1 joins at step S_i", group=_BRANCHES))
    prefix_cycle_batches: int | None = field(default=None, metadata=flag(
        "prefix: batches in each phase (default: one epoch, as the authors' code)", metavar="B", group=_BRANCHES))
    stage_steps: list[int] = field(default_factory=list, metadata=flag(
        "staged: one step count S (branch i+1 joins at i*S) or one step per joining branch", parse=int_list,
        metavar="S[,S2,...]", group=_BRANCHES))
    tensorboard: bool = field(default=True, metadata=flag("write metrics.jsonl only", group=_MONITORING))
    progress_bar: bool = field(default=True, metadata=flag("no progress bar on a terminal", group=_MONITORING))
    init_timeout: float = field(default=INIT_TIMEOUT_S, metadata=flag(
        "seconds a rank waits in one collective before the first step (the rendezvous, building, loading, the first "
        "step) before it ends, naming the rank it waited for", metavar="SECONDS", group=_CLUSTER))
    train_timeout: float = field(default=TRAIN_TIMEOUT_S, metadata=flag(
        "the same once training runs (steps, evaluations, checkpoint saves)", metavar="SECONDS", group=_CLUSTER))

    def __post_init__(self) -> None:
        self.deepspeed_config, self.output_dir = Path(self.deepspeed_config), Path(self.output_dir)
        if self.init_from is not None:
            self.init_from = Path(self.init_from)
        problems = self.problems()
        if problems:
            raise InvalidConfig(self, problems)

    # -- checks ---------------------------------------------------------------------------------------
    def problems(self) -> list[str]:
        """Every value that cannot work, each with its fix (a task adds its own); no file is read."""
        problems = []
        for name in ("max_steps", "log_interval", "save_interval", "keep_last", "ep_size", "branch_parallel",
                     "init_timeout", "train_timeout", *self.POSITIVE):
            value = getattr(self, name)
            if isinstance(value, float) and not math.isfinite(value):  # (a saved record's NaN: --config)
                problems.append(f"--{name.replace('_', '-')} must be a finite number, got {value}.")
            elif value is not None and value <= 0:
                problems.append(f"--{name.replace('_', '-')} must be positive, got {value}.")
        for name, default in (("init_timeout", INIT_TIMEOUT_S), ("train_timeout", TRAIN_TIMEOUT_S)):
            value = getattr(self, name)
            if 0 < value < MIN_TIMEOUT_S:
                problems.append(f"--{name.replace('_', '-')} {value:g} s is shorter than a healthy run waits in one "
                                f"collective (6.6 s measured, docs/cluster.md); give at least {MIN_TIMEOUT_S:g} s "
                                f"(the default: {default:g} s).")
        if self.eval_interval < 0:
            problems.append(f"--eval-interval must be >= 0 (0: only at the end), got {self.eval_interval}.")
        if self.resume not in (None, LATEST) and self.init_from is not None:
            problems.append(f"--resume {self.resume} continues that checkpoint's run and --init-from starts from other "
                            f"weights; pass only one of them (a bare --resume with --init-from continues the run in "
                            f"--output-dir, or starts it from --init-from when nothing is saved yet).")
        if self.model_config is None and self.init_from is None:
            problems.append("no model: pass --model-config (a preset, a model-config JSON or a checkpoint folder) or "
                            "--init-from (a checkpoint, whose model is then trained).")
        if self.compile == "none" and self.compile_backend != DEFAULT_COMPILE_BACKEND:
            problems.append(f"--compile-backend {self.compile_backend} applies only to a compiled model; add --compile, "
                            f"or drop --compile-backend.")
        return problems

    POSITIVE: ClassVar[tuple[str, ...]] = ()  # the task's own settings that must be positive when given
    EXAMPLE_DS_CONFIG: ClassVar[str] = "cpu_small.json"

    def data_problems(self) -> list[str]:
        """What this task's data settings name that this machine lacks, each with its fix: the one place a task
        looks at its own files, called where a run starts with the other checks of its environment
        (training/environment.py). A value that is wrong in itself is `problems()`'s."""
        return []

    # -- derived -------------------------------------------------------------------------------------
    @property
    def folder(self) -> RunFolder:
        return RunFolder(self.output_dir)

    def record(self) -> dict[str, Any]:
        """The settings as JSON values (run_config.json), with the task's name. Every value that names a file or
        folder is absolute (the keys and types are unchanged): the record means the same from any directory
        (`widenet-ds launch TASK --config RUN` replays it; a run's own folder is where the file is found, see
        `saved_record`)."""
        record = {"task": self.TASK}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            record[f.name] = os.path.abspath(value) if names_a_path(f.name, value) else \
                str(value) if isinstance(value, Path) else value
        return json.loads(json.dumps(record))  # as read back from the file (tuples as lists)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> RunConfig:
        """The configuration `record()` wrote (a run's run_config.json), checked as any other: a key this version
        lacks, a required one missing or a value of the wrong type is one error naming the key."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(record) - names - {"task", "deepspeed_settings"})  # (the trainer adds the JSON's)
        if unknown:
            raise ConfigError(f"the saved {cls.TASK} settings hold {', '.join(unknown)}, which this version does not "
                              f"have; pass the run's options on the command line instead.")
        problems = record_problems(cls, record)
        if problems:
            raise ConfigError(problems_text(problems, f"the saved {cls.TASK} settings"))
        return cls(**{name: value for name, value in record.items() if name in names})

    def to_argv(self) -> list[str]:
        """The options of `python -m widenet_ds.train TASK` that give these settings (for callers that start
        ranks: build the configuration, check it here, pass this)."""
        return to_argv(self)

    def schedule_change_flags(self, resuming: bool) -> str:
        """What else this run needs to take a DeepSpeed JSON with another schedule (a hint's tail, "" when
        nothing): a resumed run keeps its checkpoint's schedule unless --accept-changed-settings."""
        return " and pass --accept-changed-settings (a resumed run keeps its schedule otherwise)" \
            if resuming and not self.accept_changed_settings else ""


# Settings whose value may name a file or folder; `names_a_path` says whether a given value does.
PATH_SETTINGS = frozenset({"deepspeed_config", "output_dir", "init_from", "data", "tokenizer", "train_file", "dev_file",
                           "model_config", "resume"})
_NOT_PATHS = {"data": {HF_DATA}, "resume": {LATEST}, "model_config": {*PRESETS, *VISION_PRESETS}}


def missing(option: str, path: Path, fix: str) -> list[str]:
    """`option`'s problem when `path` does not exist on this machine (none when it does)."""
    return [] if Path(path).exists() else [f"{option} {path} does not exist; {fix}."]


def names_a_path(name: str, value: Any) -> bool:
    """Whether setting `name`'s `value` is a file or folder (not `hf`, `latest`, a preset, a dataset name, None)."""
    return (name in PATH_SETTINGS and isinstance(value, (str, Path)) and str(value) != ""
            and str(value) not in _NOT_PATHS.get(name, ()))


def _expected(hint: Any) -> tuple[str, Any]:
    """(how a JSON value of this type is described, a check of a value) for a field's type hint."""
    args = typing.get_args(hint)
    if type(None) in args:  # X | None
        what, check = _expected(next(a for a in args if a is not type(None)))
        return f"{what} or null", lambda v: v is None or check(v)
    if typing.get_origin(hint) is Literal:
        return f"one of {', '.join(map(json.dumps, args))}", lambda v: v in args
    if typing.get_origin(hint) in (list, tuple):
        inner, item = _expected(args[0])
        return f"a list of {inner.removeprefix('a ').removeprefix('an ')}s", \
            lambda v: isinstance(v, list) and all(item(x) for x in v)
    if hint is bool:
        return "true or false", lambda v: isinstance(v, bool)
    if hint is int:
        return "an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)
    if hint is float:
        return "a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
    return "a string", lambda v: isinstance(v, str)  # str, Path, the compile mode's text


def record_problems(cls: type[RunConfig], record: dict[str, Any]) -> list[str]:
    """Each key of a saved record (run_config.json) that is missing or holds a value of another type, naming the
    key, what it holds and what it must hold; the values themselves are checked by the configuration."""
    hints = typing.get_type_hints(cls)
    problems = []
    for f in dataclasses.fields(cls):
        if f.name not in record:
            if f.default is MISSING and f.default_factory is MISSING:
                option = f"--{f.name.replace('_', '-')}" if f.name != "glue_task" else "--task"
                problems.append(f'"{f.name}" is missing (the {option} setting); pass {option} after `--`, or '
                                f'restore the file from a copy.')
            continue
        what, check = _expected(hints[f.name])
        if not check(record[f.name]):
            problems.append(f'"{f.name}" is {json.dumps(record[f.name])}, which is not {what}.')
    return problems


def saved_record(record: dict[str, Any], folder: Path) -> tuple[dict[str, Any], list[str]]:
    """A saved run's settings (the run_config.json found in `folder`), as they mean there, and a line for each
    path that could not be placed: the run's folder is `folder` itself (a moved or copied run continues
    itself, not the original); a path saved relative (versions before absolute records stored paths as
    typed) is read against the directory the run was started from, which the saved output_dir tells: `folder`
    less output_dir's own parts (runs/x found at /a/runs/x: /a). A copy beside the original (runs/x2) is read
    the same way. That base is a guess (a copy at another depth: runs/x found at /b/copies/x2 gives /b/copies), so
    a path placed there that does not exist is unplaced too, not a path the run used."""
    folder = Path(os.path.abspath(folder))
    out = record.get("output_dir")
    base = None
    if isinstance(out, str) and not os.path.isabs(out):
        parts = Path(os.path.normpath(out)).parts
        if ".." not in parts and len(parts) <= len(folder.parents):
            base = folder.parents[len(parts) - 1] if parts else folder
    resolved, unplaced = dict(record), []
    for name, value in record.items():
        if name == "output_dir" or not names_a_path(name, value) or os.path.isabs(value):
            continue
        placed = os.path.normpath(base / value) if base is not None else None
        if placed is None or not os.path.exists(placed):
            unplaced.append(f"{name} {value!r}")
        else:
            resolved[name] = placed
    if "output_dir" in record:
        resolved["output_dir"] = str(folder)
    return resolved, unplaced


def setting_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """`name: saved vs current` for every setting a resumed run may not change."""
    names = sorted((set(saved) | set(current)) - RESUMABLE_SETTINGS - {"deepspeed_settings"})
    return [f"{name}: {saved.get(name, '<absent>')!r} (the run in the folder) vs {current.get(name, '<absent>')!r} "
            f"(now)" for name in names if saved.get(name, "<absent>") != current.get(name, "<absent>")]


# --- pretraining --------------------------------------------------------------------------------------
@dataclass(kw_only=True)
class PretrainConfig(RunConfig):
    """MLM + sentence-order pretraining on a prepared data folder (`widenet-ds prepare-data`)."""

    TASK: ClassVar[str] = "pretrain"
    DESCRIPTION: ClassVar[str] = "WideNet / ALBERT / BERT MLM + sentence-order pretraining on a prepared data folder."
    POSITIVE: ClassVar[tuple[str, ...]] = ("eval_batches",)

    data: Path = field(metadata=flag(_DATA))
    eval_batches: int = field(default=20, metadata=flag("micro-batches per rank in each evaluation",
                                                        group=_MONITORING))

    def __post_init__(self) -> None:
        self.data = Path(self.data)
        super().__post_init__()

    def data_problems(self) -> list[str]:
        return missing("--data", self.data, "pass the folder `widenet-ds prepare-data --output` wrote")


# --- finetuning ---------------------------------------------------------------------------------------
@dataclass(kw_only=True)
class FinetuneConfig(RunConfig):
    """Finetuning runs seeds SEED..SEED+SEEDS-1, each trained from the same weights for max_steps, evaluated,
    and summarised (median) in results.json; each seed is a run folder `seed<N>/` of the output folder.
    The task recipe (tasks/recipes.py) gives dropout, capacity factor, balance weight and the max length;
    `--set` changes any of them."""

    POSITIVE: ClassVar[tuple[str, ...]] = ("seeds", "max_train_examples", "max_eval_examples", "max_seq_length")
    EXAMPLE_DS_CONFIG: ClassVar[str] = "finetune_cpu_small.json"

    data: str = field(metadata=flag(_DATA))
    tokenizer: str | None = field(default=None, metadata=flag(
        "tokenizer.json / vocab.txt / prepared data folder (default: the one saved with --init-from)"))
    seeds: int = field(default=1, metadata=flag("runs with seeds SEED..SEED+N-1; the median is reported", metavar="N"))
    max_seq_length: int | None = field(default=None, metadata=flag(
        "default: the recipe's, capped by the model's positions"))
    max_train_examples: int | None = field(default=None, metadata=flag("train on the first N examples only",
                                                                       metavar="N"))
    max_eval_examples: int | None = field(default=None, metadata=flag(_EVAL_SUBSET, metavar="N",
                                                                      group=_MONITORING))
    allow_recipe_mismatch: bool = field(default=False, metadata=flag(
        "train with a DeepSpeed JSON whose batch size, learning rate or schedule differ from the task recipe "
        "(recorded in results.json)"))
    eval_only: bool = field(default=False, metadata=flag(
        "score --init-from (e.g. a model written by --save-model) without training"))
    save_model: bool = field(default=False, metadata=flag(
        "write each seed's finetuned model as a checkpoint folder seed<N>/model (with the tokenizer)"))

    def problems(self) -> list[str]:
        problems = super().problems()
        if self.model_config is not None and self.init_from is not None:
            problems.append("--model-config is the model of a random initialisation; with --init-from the model is "
                            "the checkpoint's (change its fields with --set): pass only one of them.")
        if self.eval_only and self.init_from is None:
            problems.append("--eval-only scores trained weights: pass --init-from with a finetuned checkpoint.")
        if self.eval_only and (self.seeds != 1 or self.resume):
            problems.append("--eval-only scores one set of weights once; drop --seeds and --resume.")
        if self.resume not in (None, LATEST):
            problems.append(f"--resume {self.resume}: a finetuning run continues from its own output folder (each seed "
                            f"from its latest checkpoint); pass --resume without a value.")
        return problems

    def data_problems(self) -> list[str]:
        if self.data == HF_DATA:
            return []
        return missing("--data", Path(self.data), "pass the folder (or file) in the original format, or `--data hf` to "
                                                  "download through HF datasets")

    def schedule_change_flags(self, resuming: bool) -> str:
        """A finetuning run also takes a schedule other than its task recipe's with --allow-recipe-mismatch only,
        and compares its settings with its run_config.json whenever --resume finds one (whichever seed is next)."""
        compared = self.resume is not None and self.folder.run_config.is_file()
        flags = [flag for flag, needed in (("--accept-changed-settings", compared and not self.accept_changed_settings),
                                           ("--allow-recipe-mismatch", not self.allow_recipe_mismatch)) if needed]
        return f" and pass {' '.join(flags)} (a schedule other than the run's or the recipe's needs it)" if flags else ""

    @property
    def data_path(self) -> Path | None:
        return None if self.data == HF_DATA else Path(self.data)

    @property
    def seed_values(self) -> list[int]:
        return list(range(self.seed, self.seed + self.seeds))

    @property
    def weights_source(self) -> str:
        return str(self.init_from) if self.init_from is not None else f"preset:{self.model_config}"


@dataclass(kw_only=True)
class GlueConfig(FinetuneConfig):
    TASK: ClassVar[str] = "glue"
    DESCRIPTION: ClassVar[str] = "Finetuning on a GLUE task (seeds, median of each metric)."

    glue_task: str = field(metadata=flag("GLUE task name in any spelling (cola sst2 mrpc stsb qqp mnli qnli rte wnli); "
                                         "--task is the same flag", names=("--glue-task", "--task")))
    predict_test: bool = field(default=False, metadata=flag(
        "also write test-set predictions in the GLUE submission format (e.g. SST-2.tsv, MNLI-m.tsv)"))

    def problems(self) -> list[str]:
        problems = super().problems()
        try:
            task = get_glue_dataset(self.glue_task)
        except ConfigError as err:
            return problems + [f"--glue-task: {err}"]
        if not task.eval_splits:
            problems.append(f"--glue-task {task.name} has no labelled split to finetune on; its test set is predicted by "
                            f"the MNLI model (--glue-task mnli --predict-test).")
        return problems

    def data_problems(self) -> list[str]:
        """--data, then the dataset's files in it (and the test files --predict-test asks for)."""
        problems = super().data_problems()
        try:
            dataset = get_glue_dataset(self.glue_task)
        except ConfigError:  # a value problem: problems() names it
            return problems
        if problems or not dataset.eval_splits or self.data_path is None:
            return problems
        for split in ("train", *dataset.eval_splits):
            try:
                glue_split_path(dataset, split, self.data_path)
            except DataError as err:
                problems.append(f"--data: {err}")
        if self.predict_test:
            for split in dataset.test_splits:
                try:
                    glue_split_path(dataset, split, self.data_path)
                except DataError:
                    problems.append(f"--predict-test: no {dataset.files[split]} in {self.data_path} (nor in "
                                    f"{self.data_path / dataset.name}); add the test file there, or drop --predict-test.")
        return problems


@dataclass(kw_only=True)
class SquadConfig(FinetuneConfig):
    TASK: ClassVar[str] = "squad"
    DESCRIPTION: ClassVar[str] = "Finetuning on SQuAD v1.1 / v2.0 (predictions.json, null_odds.json for v2.0)."

    version: Literal["1.1", "2.0"] = field(metadata=flag("SQuAD version"))
    train_file: str | None = field(default=None, metadata=flag(
        "SQuAD JSON to train on (default: --data/train-v<version>.json, or --data itself when it is a file)"))
    dev_file: str | None = field(default=None, metadata=flag(
        "SQuAD JSON to evaluate on (default: --data/dev-v<version>.json, or --data itself when it is a file)"))
    doc_stride: int | None = field(default=None, metadata=flag(
        "tokens shared by consecutive windows (default: 128, at most a quarter of the max length)"))

    def problems(self) -> list[str]:
        problems = super().problems()
        if self.doc_stride is not None and self.doc_stride < 0:
            problems.append(f"--doc-stride must be >= 0, got {self.doc_stride}.")
        return problems

    def data_problems(self) -> list[str]:
        problems = super().data_problems()
        for option, split in (("--train-file", "train"), ("--dev-file", "dev")):
            path = self.file(split)
            if path is not None and not path.is_file():
                problems.append(f"{option}: {path} does not exist; pass the SQuAD JSON with {option}, or a --data "
                                f"folder holding train-v{self.version}.json and dev-v{self.version}.json.")
        return problems

    def file(self, split: str) -> Path | None:
        """The JSON of `split`: its flag, else in (or being) --data; None: HF datasets."""
        given = self.train_file if split == "train" else self.dev_file
        if given is not None:
            return Path(given)
        if self.data_path is None:
            return None
        return self.data_path if self.data_path.is_file() else self.data_path / f"{split}-v{self.version}.json"


# --- image classification -----------------------------------------------------------------------------
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

    dataset: Literal[DATASETS] = field(default="fashion-mnist", metadata=flag(  # type: ignore[valid-type]
        "fashion-mnist (Debian's dataset-fashion-mnist), digits (sklearn, 8x8), cifar10/cifar100 (torchvision "
        "layout), imagenet-folder (ImageFolder), hf (datasets)"))
    data: Path | None = field(default=None, metadata=flag(_DATA))
    epochs: float | None = field(default=None, metadata=flag("passes over the train split instead of --max-steps"))
    max_eval_examples: int | None = field(default=None, metadata=flag(_EVAL_SUBSET, metavar="N",
                                                                      group=_MONITORING))
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

    @property
    def augment(self) -> AugmentConfig:
        return AugmentConfig(randaugment_ops=self.randaugment[0], randaugment_magnitude=self.randaugment[1],
                             inception_crop=self.inception_crop, crop_min_area=self.crop_min_area, flip=self.flip,
                             mixup_alpha=self.mixup_alpha, cutmix_alpha=self.cutmix_alpha,
                             label_smoothing=self.label_smoothing)


# Every task's settings by its name (the command line, `widenet-ds launch --config`): without the training code,
# which training/registry.py's TASKS adds to each (tested equal).
CONFIGS: dict[str, type[RunConfig]] = {cls.TASK: cls for cls in (PretrainConfig, GlueConfig, SquadConfig, ClassifyConfig)}
