"""Reading run folders as they are on disk: finished, still being written, partial or broken.

A pretraining folder holds `metrics.jsonl` (one JSON record per logged step, see training_log.py) and
`model_config.json`; a finetuning folder holds `results.json` (written at the end) and one `seed<N>/`
folder per seed with its own `metrics.jsonl`. Nothing here raises on a bad folder: what cannot be read
becomes a `Problem` (or a note on the run) that the page and stderr show.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The file names training_log.py, pretrain.py and finetune.py write (not imported from there: they load
# torch, and the report must start fast and run where only the run folders are).
METRICS_FILE = "metrics.jsonl"
MODEL_CONFIG_FILE = "model_config.json"
RESULTS_FILE = "results.json"
SEED_DIR = re.compile(r"^seed(\d+)$")
EXPERT_LOAD_KEY = re.compile(r"^moe/block_(\d+)/expert_(\d+)_load$")
DROPPED_KEY = re.compile(r"^moe/block_(\d+)/dropped_fraction$")
# A finetuning seed's loss: `train/loss` (the trainer's log since the restructuring), `finetune/loss` before.
FINETUNE_LOSS_KEYS = ("train/loss", "finetune/loss")


@dataclass
class Problem:
    """A folder (or part of one) that could not be used, and why."""

    path: Path
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


@dataclass
class JsonlRead:
    records: list[dict[str, Any]]
    live_tail: bool  # the last line is still being written (no newline yet, not JSON yet)
    bad_lines: list[int]  # 1-based numbers of complete lines that are not a JSON record with a "step"


def read_jsonl(path: Path) -> JsonlRead:
    """The records of a metrics.jsonl that may be growing: a partial last line is left for next time."""
    text = path.read_bytes().decode("utf-8", errors="replace")
    lines = text.split("\n")
    ends_complete = text.endswith("\n") or not text
    records, bad, live_tail = [], [], False
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        is_last = number == len(lines)
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            records.append(record)
        elif is_last and not ends_complete:
            live_tail = True
        else:
            bad.append(number)
    return JsonlRead(records, live_tail, bad)


def _read_json(path: Path) -> tuple[Any, str | None]:
    try:
        return json.loads(path.read_text(encoding="utf-8")), None
    except (OSError, UnicodeDecodeError) as err:
        return None, f"{path.name} cannot be read ({err})"
    except json.JSONDecodeError as err:
        return None, f"{path.name} is not valid JSON ({err.msg} at line {err.lineno})"


def _bad_lines_note(path: Path, read: JsonlRead) -> list[str]:
    if not read.bad_lines:
        return []
    shown = ", ".join(map(str, read.bad_lines[:5])) + (" ..." if len(read.bad_lines) > 5 else "")
    return [f"{path.name}: {len(read.bad_lines)} line(s) are not JSON records with a step (line {shown}); skipped"]


@dataclass
class PretrainRun:
    """A pretraining output folder: scalars per logged step, events, the model config."""

    name: str
    path: Path
    records: list[dict[str, Any]]  # records with scalars (events excluded)
    events: list[dict[str, Any]]
    model_config: dict[str, Any] | None
    live_tail: bool
    notes: list[str] = field(default_factory=list)
    kind: str = "pretrain"

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of the records holding `key`."""
        rows = [(r["step"], float(r[key])) for r in self.records if isinstance(r.get(key), (int, float))]
        return [s for s, _ in rows], [v for _, v in rows]

    def last(self, key: str) -> tuple[int, float] | None:
        steps, values = self.series(key)
        return (steps[-1], values[-1]) if steps else None

    @property
    def last_step(self) -> int | None:
        steps = [r["step"] for r in self.records] + [e["step"] for e in self.events]
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
        cfg = self.model_config
        if not cfg:
            return "unknown (no model_config.json)"
        moe = cfg.get("moe") or {}
        ffn = f"MoE E={moe.get('num_experts')} K={moe.get('top_k')}" if cfg.get("ffn") == "moe" else "dense FFN"
        sharing = [name for name, flag in (("attention", "share_attention"), ("FFN", "share_ffn"),
                                           ("LayerNorm", "share_layernorm")) if cfg.get(flag)]
        return (f"{cfg.get('num_layers')} blocks, H {cfg.get('hidden_size')}, {ffn}, shared: "
                f"{', '.join(sharing) or 'nothing'}")


@dataclass
class SeedRun:
    """One seed's folder of a finetuning run."""

    seed: int
    path: Path
    records: list[dict[str, Any]]
    live_tail: bool

    def series(self, key: str) -> tuple[list[int], list[float]]:
        rows = [(r["step"], float(r[key])) for r in self.records if isinstance(r.get(key), (int, float))]
        return [s for s, _ in rows], [v for _, v in rows]

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
    results: dict[str, Any] | None
    seeds: list[SeedRun]
    notes: list[str] = field(default_factory=list)
    kind: str = "finetune"

    @property
    def finished(self) -> bool:
        return self.results is not None

    @property
    def task(self) -> str:
        return str(self.results.get("task", "?")) if self.results else "? (no results.json yet)"

    def per_seed_metrics(self) -> dict[int, dict[str, dict[str, float]]]:
        """seed -> {split: {metric: value}}: results.json's final scores, else the last logged evaluation."""
        if self.results:
            return {int(run["seed"]): {split: {k: float(v) for k, v in values.items() if _is_number(v)}
                                       for split, values in run.get("metrics", {}).items()}
                    for run in self.results.get("per_seed", [])}
        return {seed.seed: seed.last_eval() for seed in self.seeds if seed.last_eval()}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


Run = PretrainRun | FinetuneRun


def _load_pretrain(path: Path, name: str) -> PretrainRun | Problem:
    metrics = path / METRICS_FILE
    try:
        read = read_jsonl(metrics)
    except OSError as err:
        return Problem(path, f"{METRICS_FILE} cannot be read ({err})")
    notes = _bad_lines_note(metrics, read)
    if read.bad_lines and not read.records:
        return Problem(path, f"{METRICS_FILE} holds no readable record ({len(read.bad_lines)} bad line(s))")
    model_config = None
    if (path / MODEL_CONFIG_FILE).is_file():
        model_config, error = _read_json(path / MODEL_CONFIG_FILE)
        if error:
            notes.append(error)
            model_config = None
    else:
        notes.append(f"no {MODEL_CONFIG_FILE}: the model is not shown")
    if read.live_tail:
        notes.append(f"the last line of {METRICS_FILE} is still being written (a live run): read up to the line before")
    scalars = [r for r in read.records if "event" not in r]
    if not scalars:
        notes.append("no step logged yet")
    return PretrainRun(name, path, scalars, [r for r in read.records if "event" in r], model_config,
                       read.live_tail, notes)


def _seed_dirs(path: Path) -> list[tuple[int, Path]]:
    return sorted((int(m.group(1)), p) for p in path.iterdir() if p.is_dir() and (m := SEED_DIR.match(p.name)))


def _load_finetune(path: Path, name: str) -> FinetuneRun | Problem:
    notes: list[str] = []
    results = None
    if (path / RESULTS_FILE).is_file():
        results, error = _read_json(path / RESULTS_FILE)
        if error or not isinstance(results, dict):
            notes.append(error or f"{RESULTS_FILE} is not a JSON object")
            results = None
    else:
        notes.append(f"no {RESULTS_FILE} yet (running, stopped or failed): showing the evaluations logged so far")
    seeds = []
    for seed, seed_path in _seed_dirs(path):
        metrics = seed_path / METRICS_FILE
        if not metrics.is_file():
            notes.append(f"{seed_path.name}/ has no {METRICS_FILE}")
            continue
        try:
            read = read_jsonl(metrics)
        except OSError as err:
            notes.append(f"{seed_path.name}/{METRICS_FILE} cannot be read ({err})")
            continue
        notes += [f"{seed_path.name}/{note}" for note in _bad_lines_note(metrics, read)]
        if read.live_tail:
            notes.append(f"{seed_path.name}/{METRICS_FILE}: last line still being written (a live run)")
        seeds.append(SeedRun(seed, seed_path, [r for r in read.records if "event" not in r], read.live_tail))
    if results is None and not seeds:
        return Problem(path, "; ".join(notes) or "no readable results")
    return FinetuneRun(name, path, results, seeds, notes)


def _looks_like(path: Path) -> str | None:
    """'pretrain', 'finetune' or None (not a run folder)."""
    if (path / RESULTS_FILE).is_file() or _seed_dirs(path):
        return "finetune"
    if (path / METRICS_FILE).is_file() or (path / MODEL_CONFIG_FILE).is_file():
        return "pretrain"
    return None


def _load(path: Path, name: str) -> Run | Problem:
    kind = _looks_like(path)
    if kind == "finetune":
        return _load_finetune(path, name)
    if not (path / METRICS_FILE).is_file():
        return Problem(path, f"a pretraining folder without {METRICS_FILE} (nothing logged yet, or logging went "
                             f"elsewhere)")
    return _load_pretrain(path, name)


def load_runs(paths: list[Path]) -> tuple[list[Run], list[Problem]]:
    """Every run found in `paths`, in order. A folder that is not a run itself but holds runs one level
    down (a demo or study folder) stands for those runs."""
    candidates: list[Path] = []
    problems: list[Problem] = []
    for path in map(Path, paths):
        if not path.exists():
            problems.append(Problem(path, "does not exist"))
        elif not path.is_dir():
            problems.append(Problem(path, "is not a folder (pass a run's output folder)"))
        elif _looks_like(path):
            candidates.append(path)
        else:
            inside = sorted(p for p in path.iterdir() if p.is_dir() and _looks_like(p))
            if inside:
                candidates += inside
            else:
                problems.append(Problem(path, f"not a run folder: no {METRICS_FILE} (pretraining) nor "
                                              f"{RESULTS_FILE} / seed<N>/ (finetuning), here or one level down"))
    runs: list[Run] = []
    for path, name in zip(candidates, _names(candidates)):
        loaded = _load(path, name)
        (problems if isinstance(loaded, Problem) else runs).append(loaded)
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
