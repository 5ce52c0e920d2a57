"""Run configurations: the base of what every training task shares (each task extends it in its own package,
widenet_ds/tasks/<task>/config.py); their flags are generated from the fields (widenet_ds/training/command_line.py).

Batch sizes, learning rate, schedule, precision and ZeRO live ONLY in the DeepSpeed JSON; the model in
its model config (a preset, a JSON or a checkpoint folder), changed field by field with `--set KEY=VALUE`;
pretraining's sequence length and vocabulary come from the prepared data. A flag has one meaning in every
task (docs/flags.md lists them). A configuration holds types and values only: building one checks its values and
touches no file, so it can be built where the run will not start (a launcher, a study); what it names on the
machine that runs it (files, the output folder's lock, the compile backend) is checked where the run starts
(training/environment.py), every problem of both reported at once, before any data is read or model built.

What a tool outside a task needs to know of it, it asks the configuration (its data's problems, its scores' scale,
the advice for a run on CPU cores), never the task's name. Imports no torch: the launcher and the report build and
read configurations where no training runs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import typing
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from widenet_ds.distributed.timeouts import INIT_TIMEOUT_S, MIN_TIMEOUT_S, TRAIN_TIMEOUT_S
from widenet_ds.engine.compile import CompileMode
from widenet_ds.errors import ConfigError, problems_text
from widenet_ds.model.config import PRESETS, EncoderConfig, ModelConfig
from widenet_ds.run_folder import RunFolder
from widenet_ds.training.branch_schedule import ScheduleKind
from widenet_ds.training.flags import flag, int_list, to_argv
from widenet_ds.vision.config import VISION_PRESETS

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
MONITORING = "logging"  # the --help section of what is logged and evaluated
_CLUSTER = "faults on several ranks (docs/cluster.md)"
# The help of flags several tasks take: one meaning per flag (docs/flags.md).
DATA_HELP = ("the training data: pretraining, a prepared folder (`widenet-ds prepare-data`; its valid split is the "
         "evaluation's); finetuning, the task's files in their original format (a folder or file) or `hf` for HF "
         "datasets; images, the --dataset's folder (fashion-mnist default: /usr/share/datasets/fashion-mnist)")
EVAL_SUBSET_HELP = "evaluate on the first N examples of the evaluation split only"
DATASET_HELP = ("the dataset to train on: images, fashion-mnist (Debian's dataset-fashion-mnist), digits (sklearn, "
                "8x8), cifar10/cifar100 (torchvision layout), imagenet-folder (ImageFolder) or hf (a HF datasets "
                "folder in --data); labelled texts, a HF dataset NAME[@CONFIG] (a hub name or a local folder) with its "
                "train and validation splits")


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
        group=MONITORING))
    eval_interval: int = field(default=1000, metadata=flag(
        "steps between evaluations during training (0: none); a finished run is always evaluated at its end",
        group=MONITORING))
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
    tensorboard: bool = field(default=True, metadata=flag("write metrics.jsonl only", group=MONITORING))
    progress_bar: bool = field(default=True, metadata=flag("no progress bar on a terminal", group=MONITORING))
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
    MODEL: ClassVar[type[EncoderConfig]] = ModelConfig  # the kind of model config --model-config names
    EXAMPLE_DS_CONFIG: ClassVar[str] = "cpu_small.json"
    # Settings whose value may name a file or folder (a task adds its own; `names_a_path` says whether a value does).
    PATH_SETTINGS: ClassVar[frozenset[str]] = frozenset({"deepspeed_config", "output_dir", "init_from",
                                                         "model_config", "resume"})

    def data_problems(self) -> list[str]:
        """What this task's data settings name that this machine lacks, each with its fix: the one place a task
        looks at its own files, called where a run starts with the other checks of its environment
        (training/environment.py). A value that is wrong in itself is `problems()`'s."""
        return []

    # -- what tools outside the task ask of it ------------------------------------------------------
    @classmethod
    def score_scale(cls, metric: str) -> str:
        """The scale of this task's `metric` as the console and the report show it beside each value: "0-1" for a
        fraction, "0-100" for a percentage, "" for what is no score (a count, a threshold)."""
        return "0-1"

    def cpu_recipe_flags(self) -> str | None:
        """On a machine without a GPU (`widenet-ds launch` advises): the options that go with the small CPU
        DeepSpeed JSON (EXAMPLE_DS_CONFIG) in place of a GPU recipe; None: no advice for this run."""
        return None

    def dev_set_cost(self) -> str | None:
        """What evaluating the whole dev set costs on a few CPU cores, in words, when it takes minutes (None: seconds,
        or no dev set): `widenet-ds launch` then advises --max-eval-examples on a machine without a GPU."""
        return None

    def complete_results(self) -> Any | None:
        """The results of this run when its folder holds them for these settings, finished: a --resume would only
        read them again (`widenet-ds launch` and the demo then start no rank, the ranks return them). None: not a
        --resume, nothing finished there, or a length only the ranks know (the DeepSpeed schedule's, epochs of the
        data). A task whose runs finish says how (its results.json's step or steps); the base finishes none here."""
        return None

    def results_line(self, results: Any) -> str:
        """What the finished run scored (its `complete_results`), in one line as the console shows it."""
        raise NotImplementedError(f"{type(self).__name__} has no complete_results")

    def _finished_at(self, results_type) -> Any | None:
        """A finished run's results (`results_type`, its `step` at least --max-steps) for a bare --resume."""
        if self.resume != LATEST or self.max_steps is None or not self.folder.results.is_file():
            return None
        results = self.folder.read_results(results_type)
        return results if results.step >= self.max_steps else None

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
            record[f.name] = os.path.abspath(value) if self.names_a_path(f.name, value) else \
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

    @classmethod
    def names_a_path(cls, name: str, value: Any) -> bool:
        """Whether setting `name`'s `value` is a file or folder (not `hf`, `latest`, a preset, a dataset name,
        None)."""
        return (name in cls.PATH_SETTINGS and isinstance(value, (str, Path)) and str(value) != ""
                and str(value) not in _NOT_PATHS.get(name, ()))

    @classmethod
    def saved_record(cls, record: dict[str, Any], folder: Path) -> tuple[dict[str, Any], list[str]]:
        """A saved run's settings (the run_config.json found in `folder`), as they mean there, and a line for each
        path that could not be placed: the run's folder is `folder` itself (a moved or copied run continues
        itself, not the original); a path saved relative (versions before absolute records stored paths as
        typed) is read against the directory the run was started from, which the saved output_dir tells: `folder`
        less output_dir's own parts (runs/x found at /a/runs/x: /a). A copy beside the original (runs/x2) is read
        the same way. That base is a guess (a copy at another depth: runs/x found at /b/copies/x2 gives /b/copies),
        so a path placed there that does not exist is unplaced too, not a path the run used."""
        folder = Path(os.path.abspath(folder))
        out = record.get("output_dir")
        base = None
        if isinstance(out, str) and not os.path.isabs(out):
            parts = Path(os.path.normpath(out)).parts
            if ".." not in parts and len(parts) <= len(folder.parents):
                base = folder.parents[len(parts) - 1] if parts else folder
        resolved, unplaced = dict(record), []
        for name, value in record.items():
            if name == "output_dir" or not cls.names_a_path(name, value) or os.path.isabs(value):
                continue
            placed = os.path.normpath(base / value) if base is not None else None
            if placed is None or not os.path.exists(placed):
                unplaced.append(f"{name} {value!r}")
            else:
                resolved[name] = placed
        if "output_dir" in record:
            resolved["output_dir"] = str(folder)
        return resolved, unplaced


# Values of path settings that name no file: HF datasets, the latest checkpoint, a preset.
_NOT_PATHS = {"data": {HF_DATA}, "resume": {LATEST}, "model_config": {*PRESETS, *VISION_PRESETS}}


def missing(option: str, path: Path, fix: str) -> list[str]:
    """`option`'s problem when `path` does not exist on this machine (none when it does)."""
    return [] if Path(path).exists() else [f"{option} {path} does not exist; {fix}."]


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


def setting_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """`name: saved vs current` for every setting a resumed run may not change."""
    names = sorted((set(saved) | set(current)) - RESUMABLE_SETTINGS - {"deepspeed_settings"})
    return [f"{name}: {saved.get(name, '<absent>')!r} (the run in the folder) vs {current.get(name, '<absent>')!r} "
            f"(now)" for name in names if saved.get(name, "<absent>") != current.get(name, "<absent>")]

