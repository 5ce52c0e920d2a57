"""The run folder: every file a training run writes, named once here, with its reader and writer.

    <output>/
        run_config.json     the run: its task and settings (a --resume must find them unchanged); read only
                            here (`read_run_config`), upgraded by widenet_ds/formats.py (kind "run_config")
        model_config.json   the model's config (text `ModelConfig` or image `VisionConfig`; image runs of
                            older versions: vision_config.json)
        metrics.jsonl       one JSON record per logged step ({"step", "time", scalars}) or event ({"event"})
        tensorboard/        the same scalars for TensorBoard
        checkpoints/        DeepSpeed tags with their markers (widenet_ds/checkpoint/tags.py)
        results.json        what the run scored, written once, when it has finished (widenet_ds/results.py)
        tokenizer.json, vocab.txt   text runs: the tokenizer of the run's data
        seed<N>/            finetuning: one run folder per seed (metrics, checkpoints, predictions,
                            results.json of that seed)

Folders written before run_config.json named the task (before one trainer ran every task only finetuning
wrote one) are told apart by their files (`widenet_ds.tasks.task_of`).

Imports neither torch nor DeepSpeed: `widenet-ds report` reads run folders on machines that only have
the folders. Writers are atomic (a crash never leaves half a file); readers of a folder another process
is still writing (`read_metrics(..., live=True)`) leave a partial last line for the next read.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from widenet_ds.errors import RunFolderError
from widenet_ds.formats import load_json, unversioned, versioned
from widenet_ds.formats import read_json as read_versioned
from widenet_ds.fs.atomic import atomic_write_json, atomic_write_text
from widenet_ds.results import Results

RUN_CONFIG_FILE = "run_config.json"  # (data/manifest.py spells it too: data/ sits below this module)
RUN_CONFIG = "run_config"  # its kind in widenet_ds/formats.py
MODEL_CONFIG_FILE = "model_config.json"
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
CHECKPOINTS_DIR = "checkpoints"
RESULTS_FILE = "results.json"
OLD_VISION_CONFIG_FILE = "vision_config.json"  # image runs' model config in folders before model_config.json
SEED_DIR = re.compile(r"^seed(\d+)$")
R = TypeVar("R", bound=Results)


@dataclass
class Metrics:
    """The records of a metrics.jsonl: scalars per step, events, and what could not be read."""

    records: list[dict[str, Any]] = field(default_factory=list)  # {"step", "time", scalars...}
    events: list[dict[str, Any]] = field(default_factory=list)   # {"event", "time", maybe "step"}
    live_tail: bool = False  # the last line is still being written (no newline yet)
    bad_lines: list[int] = field(default_factory=list)  # 1-based numbers of lines that are not records

    def series(self, key: str) -> dict[int, float]:
        """step -> value of every record holding `key` (a later record of a step wins)."""
        return {r["step"]: r[key] for r in self.records if isinstance(r.get(key), (int, float))}


def read_metrics(path: str | Path, *, live: bool = False) -> Metrics:
    """A metrics.jsonl. `live`: the file may be growing (another process writes it), so a partial last line
    is left for the next read and unreadable lines are listed instead of raising; otherwise every line must
    be a record."""
    path = Path(path)
    text = path.read_bytes().decode("utf-8", errors="replace")
    lines = text.split("\n")
    out = Metrics()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict) and "event" in record:
            out.events.append(record)
        elif isinstance(record, dict) and isinstance(record.get("step"), int):
            out.records.append(record)
        elif live and number == len(lines) and not text.endswith("\n"):
            out.live_tail = True
        elif live:
            out.bad_lines.append(number)
        else:
            raise RunFolderError(f"{path}, line {number}: not a metrics record ({line[:80]!r}); the file was edited "
                                 f"or damaged: restore it, or remove the line.")
    return out


def keep_records_up_to(path: Path, step: int) -> None:
    """Drop the records and events of steps after `step` (a resumed run writes them again); run events
    without a step stay."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines()
            if line.strip() and json.loads(line).get("step", 0) <= step]
    atomic_write_text(path, "".join(line + "\n" for line in kept))


def read_run_config(path: str | Path) -> dict[str, Any]:
    """A run_config.json (here or copied elsewhere: `widenet-ds launch --config FILE`): the run's settings, as
    `RunConfig.record()` gives them."""
    return unversioned(read_versioned(RUN_CONFIG, path))


def read_json(path: str | Path, what: str) -> Any:
    """A JSON file of a run folder (`what` it is); a missing or unreadable one is one error naming the file."""
    return load_json(path, RunFolderError, "the file is damaged: restore it or start a new run in another folder", what)


@dataclass(frozen=True)
class RunFolder:
    """Paths of one run folder (or of one finetuning seed's folder)."""

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def run_config(self) -> Path:
        return self.path / RUN_CONFIG_FILE

    @property
    def model_config(self) -> Path:
        return self.path / MODEL_CONFIG_FILE

    def model_config_file(self) -> Path | None:
        """The model config the run wrote (model_config.json, or an older image run's vision_config.json);
        None before it has written one."""
        return next((p for p in (self.model_config, self.path / OLD_VISION_CONFIG_FILE) if p.is_file()), None)

    @property
    def metrics(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def tensorboard(self) -> Path:
        return self.path / TENSORBOARD_DIR

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS_DIR

    @property
    def results(self) -> Path:
        return self.path / RESULTS_FILE

    def seed(self, seed: int) -> RunFolder:
        return RunFolder(self.path / f"seed{seed}")

    def seeds(self) -> list[tuple[int, RunFolder]]:
        """The finetuning seeds' folders, by seed."""
        if not self.path.is_dir():
            return []
        found = [(int(m.group(1)), RunFolder(p)) for p in self.path.iterdir() if p.is_dir()
                 and (m := SEED_DIR.match(p.name))]
        return sorted(found, key=lambda item: item[0])

    def holds(self) -> list[str]:
        """The files of a run found here (empty: no run has written this folder)."""
        found = [name for name in (RUN_CONFIG_FILE, RESULTS_FILE) if (self.path / name).is_file()]
        if self.checkpoints.is_dir() and any(self.checkpoints.iterdir()):
            found.append(f"{CHECKPOINTS_DIR}/")
        found += [f"{p.path.name}/" for _, p in self.seeds()]
        return found

    def resumable(self) -> str | None:
        """What a bare --resume continues here, in words; None: nothing, a --resume starts the run anew."""
        latest = self.checkpoints / "latest"  # written by checkpoint/manager.py once a tag is complete
        if latest.is_file():
            return f"checkpoint {latest.read_text().strip() or '?'}"
        begun = [f"seed {seed}" for seed, folder in self.seeds() if folder.resumable()]
        if begun:
            return f"finetuning seeds begun or done ({', '.join(begun)})"
        return "results.json (a finished run)" if self.results.is_file() else None

    # -- readers and writers -------------------------------------------------------------------------
    def read_metrics(self, *, live: bool = False) -> Metrics:
        return read_metrics(self.metrics, live=live)

    def read_run_config(self) -> dict[str, Any]:
        """The run's settings (run_config.json of any version, upgraded), as `RunConfig.record()` gives them."""
        return read_run_config(self.run_config)

    def write_run_config(self, record: dict[str, Any]) -> None:
        atomic_write_json(self.run_config, versioned(RUN_CONFIG, record), sort_keys=True)

    def read_results(self, cls: type[R]) -> R:
        """results.json as `cls`: the task's results class (`SeedResults` in a finetuning seed's folder)."""
        return cls.from_json(read_json(self.results, "the run's results"), str(self.results))

    def write_results(self, results: Results) -> None:
        atomic_write_json(self.results, versioned(results.FORMAT, results.to_json()))

    def recorded_task(self) -> str | None:
        """The task run_config.json names (None: no such file, an unreadable one, or one without a task's name);
        widenet_ds/tasks/ tells the tasks apart."""
        if not self.run_config.is_file():
            return None
        try:
            task = self.read_run_config().get("task")
        except RunFolderError:
            return None
        return task if isinstance(task, str) else None
