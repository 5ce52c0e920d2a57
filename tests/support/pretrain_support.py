"""Shared pieces of the pretraining tests: tiny prepared data, tiny configs, metrics readers."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path

from tests.support.launching import REPO

CPU_CONFIG = REPO / "ds_configs" / "cpu_small.json"
BOOKS = ("corpus/books/pg11.txt", "corpus/books/pg84.txt")


# Set by tests/conftest.py for one pytest session (its workers share it): a prepared folder is built once per set of
# inputs and copied to each test that asks for it (a copy: a test may damage its own).
DATA_CACHE_VAR = "WIDENET_TEST_PREPARED_CACHE"


def prepare_data(output: Path, sources: list[Path], seq_length: int = 64, tokenizer: str = "train") -> Path:
    """A real prepared data folder built by `widenet-ds prepare-data` (no sources: the embedded corpus)."""
    from widenet_ds.data.prepare import cli as prepare_cli

    args = [arg for source in sources for arg in ("--source", str(source))] or ["--default-corpus"]
    args += ["--tokenizer", tokenizer, "--seq-length", str(seq_length), "--valid-fraction", "0.05"]
    if tokenizer == "train":
        args += ["--vocab-size", "1000"]

    def prepare(folder: Path) -> None:
        assert prepare_cli([*args, "--output", str(folder), "--workers", "1", "--no-progress"]) == 0, \
            "prepare-data failed"

    cache = os.environ.get(DATA_CACHE_VAR)
    if not cache:
        prepare(output)
        return output
    built = Path(cache) / hashlib.sha256(json.dumps(args).encode()).hexdigest()[:16]
    with open(f"{built}.lock", "w") as lock:  # another worker building the same folder: wait for it
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not built.is_dir():
            building = built.with_suffix(".tmp")
            shutil.rmtree(building, ignore_errors=True)  # left by a build that failed earlier in the session
            prepare(building)
            os.replace(building, built)
    shutil.copytree(built, output)
    return output


def write_ds_config(path: Path, **changes) -> Path:
    """cpu_small.json with top-level keys replaced (`zero_optimization={"stage": 2}`, ...)."""
    config = json.loads(CPU_CONFIG.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))
    return path


def write_model_config(path: Path, preset: str = "widenet-tiny-e4", vocab_size: int = 1000, **overrides) -> Path:
    from widenet_ds.model.config import ModelConfig

    ModelConfig.from_preset(preset, vocab_size=vocab_size, **overrides).to_json(path)
    return path


def train_losses(output_dir: Path, key: str = "train/loss") -> dict[int, float]:
    """step -> value of the records holding `key` in metrics.jsonl."""
    from widenet_ds.run_folder import read_metrics

    return read_metrics(Path(output_dir) / "metrics.jsonl").series(key)


def events(output_dir: Path) -> list[str]:
    from widenet_ds.run_folder import read_metrics

    return [r["event"] for r in read_metrics(Path(output_dir) / "metrics.jsonl").events]


def train_in_process(task: str, argv: list[str]):
    """A trainer in this process (1 rank, the `dist` fixture's group): its results, None when stopped."""
    from widenet_ds.run.run_task import run_task
    from widenet_ds.tasks import TASKS
    from widenet_ds.training.command_line import parse

    return run_task(parse(TASKS[task].config, argv))
