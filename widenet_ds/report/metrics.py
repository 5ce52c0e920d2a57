"""Reading run folders as they are on disk: finished, still being written, partial or broken.

Three kinds of run, told apart by the results type of their task (`tasks.TASKS[tasks.task_of(folder)].results.KIND`; GLUE and
SQuAD runs are shown alike; widenet_ds/run_folder.py names every file):
- pretraining: `metrics.jsonl` (one record per logged step) and the model config;
- image classification: the same, plus `results.json` when it has finished (test accuracy and, for
  ParaFormer models, the accuracy of the first k branches);
- finetuning (GLUE, SQuAD): `results.json` at the end and one `seed<N>/` folder per seed with its own
  `metrics.jsonl`.
Nothing here raises on a bad folder: what cannot be read becomes a `Problem` (or a note on the run) that
the page and stderr show.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from widenet_ds.errors import RunFolderError
from widenet_ds.results import is_number, numbers
from widenet_ds.run_folder import (
    METRICS_FILE,
    MODEL_CONFIG_FILE,
    RESULTS_FILE,
    Metrics,
    RunFolder,
    read_json,
    read_metrics,
)
from widenet_ds.tasks import TASKS, task_of
from widenet_ds.tasks.classify.results import ClassifyResults
from widenet_ds.tasks.finetune.results import FinetuneResults
from widenet_ds.tasks.pretrain.results import PretrainResults
from widenet_ds.training.run_config import RunConfig

EXPERT_LOAD_KEY = re.compile(r"^moe/block_(\d+)/expert_(\d+)_load$")
DROPPED_KEY = re.compile(r"^moe/block_(\d+)/dropped_fraction$")
BRANCH_MLM_KEY = re.compile(r"^valid_branches_(\d+)/mlm_loss$")  # pretraining's held-out loss of k branches
# A finetuning seed's loss: `train/loss` (the trainer's log since the restructuring), `finetune/loss` before.
FINETUNE_LOSS_KEYS = ("train/loss", "finetune/loss")


@dataclass
class Problem:
    """A folder (or part of one) that could not be used, and why."""

    path: Path
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def _read_live(path: Path) -> Metrics | str:
    """A metrics.jsonl another process may still be writing, or why it cannot be read."""
    try:
        return read_metrics(path, live=True)
    except OSError as err:
        return f"{path.name} cannot be read ({err})"


def _read_results(folder: RunFolder, kind: type) -> tuple[Any, str | None]:
    """The folder's results.json as `kind`, or (None, why not)."""
    try:
        return folder.read_results(kind), None
    except RunFolderError as err:
        return None, str(err)


def _read_object(path: Path, what: str) -> tuple[dict[str, Any] | None, str | None]:
    """A JSON object of the folder, or (None, why not)."""
    try:
        value = read_json(path, what)
    except RunFolderError as err:
        return None, str(err)
    if not isinstance(value, dict):
        return None, f"{path.name} is not a JSON object"
    return value, None


def _metrics_notes(prefix: str, metrics: Metrics) -> list[str]:
    notes = []
    if metrics.bad_lines:
        shown = ", ".join(map(str, metrics.bad_lines[:5])) + (" ..." if len(metrics.bad_lines) > 5 else "")
        notes.append(f"{prefix}{METRICS_FILE}: {len(metrics.bad_lines)} line(s) are not JSON records with a step "
                     f"(line {shown}); skipped")
    if metrics.live_tail:
        notes.append(f"{prefix}{METRICS_FILE}: the last line is still being written (a live run): read up to the "
                     f"line before")
    return notes


@dataclass
class LoggedRun:
    """A run whose trainer logs scalars per step to its own metrics.jsonl (pretraining, images)."""

    name: str
    path: Path
    metrics: Metrics
    model_config: dict[str, Any] | None
    notes: list[str] = field(default_factory=list)

    @property
    def records(self) -> list[dict[str, Any]]:
        return self.metrics.records

    @property
    def events(self) -> list[dict[str, Any]]:
        return self.metrics.events

    @property
    def live_tail(self) -> bool:
        return self.metrics.live_tail

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of the records holding `key`."""
        values = self.metrics.series(key)
        return list(values), [float(v) for v in values.values()]

    def last(self, key: str) -> tuple[int, float] | None:
        steps, values = self.series(key)
        return (steps[-1], values[-1]) if steps else None

    @property
    def last_step(self) -> int | None:
        steps = [r["step"] for r in self.records] + [e["step"] for e in self.events if isinstance(e.get("step"), int)]
        return max(steps) if steps else None

    def _keys(self, pattern: re.Pattern) -> list[tuple[int, ...]]:
        found = {tuple(int(g) for g in m.groups()) for r in self.records for k in r if (m := pattern.match(k))}
        return sorted(found)

    @property
    def blocks(self) -> list[int]:
        """Blocks whose routing is logged (every block, or the first of each routing group)."""
        return sorted({block for block, _ in self._keys(EXPERT_LOAD_KEY)})

    @property
    def num_experts(self) -> int:
        return len({expert for _, expert in self._keys(EXPERT_LOAD_KEY)})

    def expert_load(self, block: int) -> tuple[list[int], list[list[float]]]:
        """(steps, loads) of one block: loads[i][e] = fraction of the block's routes sent to expert e."""
        keys = [f"moe/block_{block:02d}/expert_{e:02d}_load" for e in range(self.num_experts)]
        rows = [(r["step"], [float(r[k]) for k in keys]) for r in self.records if all(k in r for k in keys)]
        return [s for s, _ in rows], [loads for _, loads in rows]

    def dropped_fraction(self) -> tuple[list[int], list[float]]:
        """(steps, mean over the logged blocks of the fraction of routes dropped by capacity)."""
        keys = [f"moe/block_{b:02d}/dropped_fraction" for (b,) in self._keys(DROPPED_KEY)]
        rows = [(r["step"], sum(float(r[k]) for k in keys) / len(keys)) for r in self.records
                if keys and all(k in r for k in keys)]
        return [s for s, _ in rows], [v for _, v in rows]

    def model_summary(self) -> str:
        """The model in one line, from the config the run wrote (text and image configs share these fields)."""
        cfg = self.model_config
        if not cfg:
            return "unknown (no model config)"
        moe = cfg.get("moe") if isinstance(cfg.get("moe"), dict) else {}
        ffn = f"MoE E={moe.get('num_experts')} K={moe.get('top_k')}" if cfg.get("ffn") == "moe" else "dense FFN"
        sharing = [name for name, flag in (("attention", "share_attention"), ("FFN", "share_ffn"),
                                           ("LayerNorm", "share_layernorm")) if cfg.get(flag)]
        branches, layers = cfg.get("num_branches"), cfg.get("num_layers")
        layout = (f"{branches} branches x {layers // branches} blocks"
                  if isinstance(branches, int) and branches > 1 and isinstance(layers, int) else f"{layers} blocks")
        patches = f", patch {cfg['patch_size']} of {cfg.get('image_size')} px" if "patch_size" in cfg else ""
        return f"{layout}, H {cfg.get('hidden_size')}{patches}, {ffn}, shared: {', '.join(sharing) or 'nothing'}"


@dataclass
class PretrainRun(LoggedRun):
    """A pretraining output folder."""

    kind: str = "pretrain"
    title: ClassVar[str] = "pretraining"

    def mlm_loss_by_branches(self) -> tuple[int, dict[int, float]] | None:
        """(step, {k: held-out MLM loss of the first k branches}) of the last evaluation that logged them
        (a ParaFormer run's compression curve; one record per k), None when it has none."""
        found: dict[int, dict[int, float]] = {}
        for record in self.records:
            for key, value in record.items():
                if (m := BRANCH_MLM_KEY.match(key)) and is_number(value):
                    found.setdefault(record["step"], {})[int(m.group(1))] = float(value)
        if not found:
            return None
        step = max(found)
        return step, found[step]


@dataclass
class ImageRun(LoggedRun):
    """An image-classification output folder: its log and, once finished, results.json."""

    results: ClassifyResults | None = None
    settings: dict[str, Any] | None = None  # run_config.json (folders of the one trainer)
    kind: str = "classify"
    title: ClassVar[str] = "image classification"

    @property
    def finished(self) -> bool:
        return self.results is not None

    def _setting(self, recorded: str | None, key: str) -> str:
        """A setting as results.json records it, or as run_config.json does while the run is going."""
        return str(recorded or (self.settings or {}).get(key) or "?")

    @property
    def dataset(self) -> str:
        return self._setting(self.results and self.results.dataset, "dataset")

    @property
    def model_name(self) -> str:
        """The preset or config file the run was started with."""
        return self._setting(self.results and self.results.model_config, "model_config")

    def accuracy_by_branches(self) -> dict[int, float]:
        """k -> test accuracy of the first k branches (ParaFormer models; results.json), empty without."""
        return self.results.accuracy_by_branches if self.results else {}


@dataclass
class SeedRun:
    """One seed's folder of a finetuning run."""

    seed: int
    path: Path
    metrics: Metrics

    @property
    def records(self) -> list[dict[str, Any]]:
        return self.metrics.records

    def series(self, key: str) -> tuple[list[int], list[float]]:
        values = self.metrics.series(key)
        return list(values), [float(v) for v in values.values()]

    def loss(self) -> tuple[list[int], list[float]]:
        """The seed's training loss curve, under whichever key its trainer logged it."""
        for key in FINETUNE_LOSS_KEYS:
            steps, values = self.series(key)
            if steps:
                return steps, values
        return [], []

    def last_eval(self) -> dict[str, dict[str, float]]:
        """The latest evaluation logged: {split: {metric: value}} from the `eval/<split>/<metric>` keys."""
        for record in reversed(self.records):
            evals = [k for k in record if k.startswith("eval/") and k.count("/") == 2]
            if evals:
                out: dict[str, dict[str, float]] = {}
                for key in evals:
                    _, split, metric = key.split("/")
                    out.setdefault(split, {})[metric] = float(record[key])
                return out
        return {}


@dataclass
class FinetuneRun:
    """A finetuning output folder: results.json (when finished) and the seeds' logs."""

    name: str
    path: Path
    results: FinetuneResults | None
    seeds: list[SeedRun]
    notes: list[str] = field(default_factory=list)
    settings: type[RunConfig] | None = None  # the settings class of its task (None: the folder does not say)
    init: str | None = None  # the checkpoint it started from, one key for every way of naming it (`resolved_init`)
    kind: str = "finetune"
    title: ClassVar[str] = "finetuning"

    def score_scale(self, column: str) -> str:
        """The scale of a "split/metric" column of its scores, as its task gives it ("" before results.json, or
        for a task the folder does not name)."""
        if self.results is None or self.settings is None:
            return ""
        return self.settings.score_scale(column.rsplit("/", 1)[-1])

    @property
    def finished(self) -> bool:
        return self.results is not None

    @property
    def task(self) -> str:
        return self.results.task if self.results else "? (no results.json yet)"

    def per_seed_metrics(self) -> dict[int, dict[str, dict[str, float]]]:
        """seed -> {split: {metric: value}}: results.json's final scores, else the last logged evaluation."""
        if self.results:
            return {run.seed: numbers(run.metrics) for run in self.results.per_seed}
        return {seed.seed: seed.last_eval() for seed in self.seeds if seed.last_eval()}


Run = PretrainRun | ImageRun | FinetuneRun


def _load_logged(folder: RunFolder, name: str, kind: str) -> LoggedRun | Problem:
    """A pretraining or image run: its metrics, model config and (images) results."""
    path, notes = folder.path, []
    results = None
    if kind == "classify":
        if folder.results.is_file():
            results, error = _read_results(folder, ClassifyResults)
            if error:
                notes.append(error)
        else:
            notes.append(f"no {RESULTS_FILE} yet (running, stopped or failed): test accuracy from the evaluations "
                         f"logged so far")
    if folder.metrics.is_file():
        metrics = _read_live(folder.metrics)
        if isinstance(metrics, str):
            return Problem(path, metrics)
        if metrics.bad_lines and not metrics.records:
            return Problem(path, f"{METRICS_FILE} holds no readable record ({len(metrics.bad_lines)} bad line(s))")
    elif results is not None:  # a finished image run whose log was removed: its results still count
        metrics = Metrics()
        notes.append(f"no {METRICS_FILE}: no curves")
    else:
        what = "an image-classification" if kind == "classify" else "a pretraining"
        return Problem(path, f"{what} folder without {METRICS_FILE} (nothing logged yet, or logging went elsewhere)")
    notes += _metrics_notes("", metrics)
    model_config = None
    config_file = folder.model_config_file()
    if config_file is None:
        notes.append(f"no {MODEL_CONFIG_FILE}: the model is not shown")
    else:
        model_config, error = _read_object(config_file, "the model's config")
        if error:
            notes.append(error)
    if not metrics.records:
        notes.append("no step logged yet")
    if kind == "pretrain" and folder.results.is_file():
        notes += _pretrain_results_notes(folder, metrics)
    if kind == "classify":
        settings = None
        if folder.run_config.is_file():
            try:
                settings = folder.read_run_config()
            except RunFolderError as err:
                notes.append(str(err))
        return ImageRun(name, path, metrics, model_config, notes, results, settings)
    return PretrainRun(name, path, metrics, model_config, notes)


def _pretrain_results_notes(folder: RunFolder, metrics: Metrics) -> list[str]:
    """A finished pretraining's results.json against its log: the page shows the logged curves, so a results.json
    that cannot be read, or whose held-out figures are not the ones logged at its step, is said."""
    results, error = _read_results(folder, PretrainResults)
    if error:
        return [error]
    notes = []
    for key, value in results.held_out.items():
        logged = metrics.series(key).get(results.step)
        if logged is None or not math.isclose(logged, value, rel_tol=1e-9, abs_tol=1e-12):
            notes.append(f"{RESULTS_FILE}: {key} {value:.6g} at step {results.step} is not the "
                         f"{'value' if logged is None else f'{logged:.6g}'} {METRICS_FILE} logged there (edited?); the "
                         f"page shows the logged one")
    return notes


def _score_notes(results: FinetuneResults) -> list[str]:
    """A score of results.json that is not a number (the page shows numbers only: it would read as missing)."""
    where = [("median", results.median), ("baseline", results.baseline),
             *((f"seed {seed.seed}", seed.metrics) for seed in results.per_seed)]
    return [f"{RESULTS_FILE}: {label} {split}/{metric} is {value!r}, not a number: not shown"
            for label, scores in where for split, values in scores.items() for metric, value in values.items()
            if not is_number(value) and not (label == "baseline" and metric == "note")]


def _load_finetune(folder: RunFolder, name: str, settings: type[RunConfig] | None) -> FinetuneRun | Problem:
    notes: list[str] = []
    results = None
    if folder.results.is_file():
        results, error = _read_results(folder, FinetuneResults)
        if error:
            notes.append(error)
        else:
            notes += _score_notes(results)
    else:
        notes.append(f"no {RESULTS_FILE} yet (running, stopped or failed): showing the evaluations logged so far")
    seeds = []
    for seed, seed_folder in folder.seeds():
        prefix = f"{seed_folder.path.name}/"
        if not seed_folder.metrics.is_file():
            notes.append(f"{prefix} has no {METRICS_FILE}")
            continue
        metrics = _read_live(seed_folder.metrics)
        if isinstance(metrics, str):
            notes.append(prefix + metrics)
            continue
        notes += _metrics_notes(prefix, metrics)
        seeds.append(SeedRun(seed, seed_folder.path, metrics))
    if results is None and not seeds:
        return Problem(folder.path, "; ".join(notes) or "no readable results")
    return FinetuneRun(name, folder.path, results, seeds, notes, settings, resolved_init(folder, results))


def resolved_init(folder: RunFolder, results: FinetuneResults | None) -> str | None:
    """The checkpoint a finetuning run started from as an absolute path (a preset's "preset:<name>" as it is): the
    results' init, which runs resolve (an absolute tag folder); an init an older run recorded as typed, relative to
    a directory the folder does not tell, is the run_config.json's init_from, which every run saves absolute."""
    init = results.init if results is not None else None
    if init is None or init.startswith("preset:") or os.path.isabs(init):
        return os.path.normpath(init) if init is not None and os.path.isabs(init) else init
    try:
        saved = folder.read_run_config().get("init_from") if folder.run_config.is_file() else None
    except RunFolderError:
        saved = None
    return os.path.normpath(saved) if isinstance(saved, str) and os.path.isabs(saved) else init


def _is_run(folder: RunFolder) -> bool:
    """The folder holds a run's files (perhaps only some, perhaps unreadable ones)."""
    return task_of(folder) is not None or bool(folder.holds()) or folder.model_config_file() is not None


def _load(folder: RunFolder, name: str) -> Run | Problem:
    task = task_of(folder)
    kind = TASKS[task].results.KIND if task is not None else None
    if kind == "finetune":
        return _load_finetune(folder, name, TASKS[task].config)
    if kind is not None:
        return _load_logged(folder, name, kind)
    # Files of a run that do not say which kind: an unreadable results.json, a model config alone, ...
    if folder.results.is_file():
        results, error = _read_object(folder.results, "the run's results")
        return Problem(folder.path, error) if error else _load_finetune(folder, name, None)
    return Problem(folder.path, f"a run folder without {METRICS_FILE} (nothing logged yet, or logging went "
                                f"elsewhere)")


def load_runs(paths: list[Path]) -> tuple[list[Run], list[Problem]]:
    """Every run found in `paths`, in order, each once. A folder that is not a run itself but holds runs one
    level down (a demo or study folder) stands for those runs."""
    candidates: list[Path] = []
    problems: list[Problem] = []
    for path in map(Path, paths):
        if not path.exists():
            problems.append(Problem(path, "does not exist"))
        elif not path.is_dir():
            problems.append(Problem(path, "is not a folder (pass a run's output folder)"))
        elif _is_run(RunFolder(path)):
            candidates.append(path)
        else:
            inside = sorted(p for p in path.iterdir() if p.is_dir() and _is_run(RunFolder(p)))
            if inside:
                candidates += inside
            else:
                problems.append(Problem(path, f"not a run folder: no {METRICS_FILE} (pretraining, images) nor "
                                              f"{RESULTS_FILE} / seed<N>/ (finetuning), here or one level down"))
    # The same folder given twice (or once itself and once through its parent) is one run.
    given: dict[Path, list[Path]] = {}
    for path in candidates:
        given.setdefault(path.resolve(), []).append(path)
    unique = [paths_[0] for paths_ in given.values()]
    runs: list[Run] = []
    for path, name in zip(unique, _names(unique)):
        loaded = _load(RunFolder(path), name)
        if isinstance(loaded, Problem):
            problems.append(loaded)
            continue
        also = given[path.resolve()]
        if len(also) > 1:
            loaded.notes.append(f"given {len(also)} times ({', '.join(map(str, also))}): shown once")
        runs.append(loaded)
    return runs, problems


def _names(paths: list[Path]) -> list[str]:
    """Short unique names: the folder name, with parent folders added to the names that collide."""
    depths = [1] * len(paths)
    while True:
        names = ["/".join(p.resolve().parts[-d:]) for p, d in zip(paths, depths)]
        clashes = {n for n in names if names.count(n) > 1}
        if not clashes or max(depths) > 8:
            return names
        depths = [d + 1 if n in clashes else d for n, d in zip(names, depths)]
