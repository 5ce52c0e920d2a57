"""Finetuning run settings: `FinetuneConfig` (validated, every problem reported at once) and the flags every
finetune entrypoint shares. The flag names are pretraining's (`--init-from`, `--output-dir`, `--max-steps`,
`--seed`, `--log-interval`, `--eval-interval`, `--save-interval`, `--keep-last`, `--resume`, `--ep-size`);
every default is the dataclass field's. A task's own settings (GLUE `--task`, SQuAD `--version`, ...) live in
its options (`finetune_tasks.py`), checked together with these."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol

from widenet_ds.errors import ConfigError, raise_config_problems
from widenet_ds.writable import check_output_folder

HF_DATA = "hf"
RESULTS_FILE = "results.json"
RUN_CONFIG_FILE = "run_config.json"
# Settings a resumed run may change: they decide what is logged and saved, not what is computed (the
# DeepSpeed JSON's path may change, its contents are compared as `deepspeed_settings`).
RESUMABLE_CHANGES = ("resume", "seeds", "output_dir", "deepspeed_config", "log_interval", "eval_interval",
                     "save_interval", "keep_last", "tensorboard", "progress_bar")


class TaskOptions(Protocol):
    """The task's own settings (e.g. `GlueOptions`, `SquadOptions` in finetune_tasks.py)."""

    def problems(self, data_path: Path | None) -> list[str]:
        """What cannot work with this data, each with its fix; empty when all is well."""


@dataclass
class FinetuneConfig:
    """One finetuning run: seeds `seed`..`seed + seeds - 1`, each trained from the same weights for
    `max_steps` optimizer steps, evaluated, and summarised (median) in `output_dir/results.json`.

    Batch size, learning rate and schedule come from the DeepSpeed JSON only; `max_steps` defaults to the
    schedule's `total_num_steps`. `resume`: continue the run in `output_dir` (finished seeds are kept, the
    seed that was stopped continues from its latest checkpoint; an empty folder is a fresh start).
    """

    task: TaskOptions
    data: str  # a folder/file in the original format, or "hf"
    deepspeed_config: Path
    output_dir: Path
    init_from: str | None = None  # exported folder, DeepSpeed checkpoint (any ep_size) or pretraining output folder
    preset: str | None = None  # random initialisation
    tokenizer: str | None = None
    max_steps: int | None = None
    seed: int = 1
    seeds: int = 1
    capacity_factor: float | None = None
    balance_loss_weight: float | None = None
    dropout: float | None = None
    max_seq_length: int | None = None
    ep_size: int = 1
    max_train_examples: int | None = None
    max_eval_examples: int | None = None
    log_interval: int = 10
    eval_interval: int = 0  # 0: evaluate at the end only
    save_interval: int = 1000
    keep_last: int = 1
    resume: bool = False
    allow_recipe_mismatch: bool = False
    eval_only: bool = False
    save_model: bool = False
    tensorboard: bool = True
    progress_bar: bool = True

    def __post_init__(self) -> None:
        self.deepspeed_config, self.output_dir = Path(self.deepspeed_config), Path(self.output_dir)
        raise_config_problems(self.problems() + self.task.problems(self.data_path), "the finetuning settings")

    def problems(self) -> list[str]:
        """Every setting that cannot work, each with its fix (reported together with the task's)."""
        problems = []
        if (self.init_from is None) == (self.preset is None):
            problems.append("pass exactly one of --init-from (pretrained weights) and --preset (random "
                            "initialisation).")
        for name in ("max_steps", "seeds", "ep_size", "max_train_examples", "max_eval_examples", "log_interval",
                     "save_interval", "keep_last", "max_seq_length"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                problems.append(f"--{name.replace('_', '-')} must be positive, got {value}.")
        if self.eval_interval < 0:
            problems.append(f"--eval-interval must be >= 0 (0: evaluate at the end only), got {self.eval_interval}.")
        if self.eval_only and self.init_from is None:
            problems.append("--eval-only scores pretrained weights: pass --init-from with a finetuned checkpoint.")
        if self.eval_only and (self.seeds != 1 or self.resume):
            problems.append("--eval-only scores one set of weights once; drop --seeds and --resume.")
        if self.init_from is not None and not Path(self.init_from).exists():
            problems.append(f"--init-from {self.init_from} does not exist; pass an exported folder, a DeepSpeed "
                            f"checkpoint or a pretraining output folder.")
        if self.data != HF_DATA and not Path(self.data).exists():
            problems.append(f"--data {self.data} does not exist; pass the folder (or file) in the original format, "
                            f"or `--data hf` to download through HF datasets.")
        if not self.deepspeed_config.is_file():
            problems.append(f"DeepSpeed config {self.deepspeed_config} does not exist; pass --deepspeed_config with "
                            f"a JSON file, e.g. ds_configs/finetune_cpu_small.json (see ds_configs/README.md).")
        problems += self._output_dir_problems()
        return problems

    def _output_dir_problems(self) -> list[str]:
        """A folder holding an earlier run is never written into unless that run is to be continued."""
        if not self.output_dir.exists():
            try:
                check_output_folder(self.output_dir, "--output-dir")  # can it be created?
            except ConfigError as err:
                return [str(err)]
            return []
        if not self.output_dir.is_dir():
            return [f"--output-dir {self.output_dir} exists and is not a directory; choose another --output-dir."]
        try:
            check_output_folder(self.output_dir, "--output-dir")
        except ConfigError as err:
            return [str(err)]
        used = sorted(path.name for path in self.output_dir.iterdir()
                      if path.name in (RESULTS_FILE, RUN_CONFIG_FILE)
                      or (path.is_dir() and path.name.startswith("seed")))
        if used and not self.resume:
            return [f"--output-dir {self.output_dir} already holds a finetuning run ({', '.join(used)}); pass "
                    f"--resume to continue it, or choose another --output-dir (nothing was changed there)."]
        return []

    @property
    def data_path(self) -> Path | None:
        return None if self.data == HF_DATA else Path(self.data)

    @property
    def seed_values(self) -> list[int]:
        return list(range(self.seed, self.seed + self.seeds))

    @property
    def weights_source(self) -> str:
        return self.init_from or f"preset:{self.preset}"

    def seed_dir(self, seed: int) -> Path:
        return self.output_dir / f"seed{seed}"

    def as_record(self) -> dict[str, Any]:
        """The settings as JSON values (run_config.json): what a `--resume` must find unchanged."""
        record = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "task"}
        record = {k: str(v) if isinstance(v, Path) else v for k, v in record.items()}
        record["task"] = {f.name: getattr(self.task, f.name) for f in fields(self.task)}  # type: ignore[arg-type]
        return record


def changed_settings(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """`name: saved vs current` for every setting a resumed run may not change (nested ones dotted)."""
    saved, current = _flatten(saved), _flatten(current)
    return [f"{name}: {saved.get(name, '<absent>')!r} (the run in the folder) vs {current.get(name, '<absent>')!r} "
            f"(now)" for name in sorted(set(saved) | set(current))
            if name not in RESUMABLE_CHANGES and saved.get(name, "<absent>") != current.get(name, "<absent>")]


def _flatten(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    d = FinetuneConfig  # every default below is the dataclass field's
    parser.add_argument("--data", required=True, help="folder/file in the original format, or `hf` for HF datasets")
    init = parser.add_mutually_exclusive_group(required=True)
    init.add_argument("--init-from", metavar="CHECKPOINT",
                      help="an exported folder, a DeepSpeed checkpoint (any ep_size) or a pretraining output folder "
                           "(its latest checkpoint)")
    init.add_argument("--preset", help="random initialisation from a preset (baselines, tests)")
    parser.add_argument("--tokenizer", default=d.tokenizer,
                        help="tokenizer.json / vocab.txt / prepared data folder (default: the one saved with "
                             "--init-from)")
    parser.add_argument("--deepspeed_config", "--deepspeed-config", required=True,
                        help="DeepSpeed JSON: batch size, learning rate, schedule (ds_configs/finetune_*.json)")
    parser.add_argument("--output-dir", required=True,
                        help="results.json, run_config.json and one seed<N>/ folder per seed; must not hold "
                             "another run unless --resume")
    parser.add_argument("--max-steps", type=int, default=d.max_steps,
                        help="default: the schedule's total_num_steps, else the recipe")
    parser.add_argument("--seed", type=int, default=d.seed, help="the first seed")
    parser.add_argument("--seeds", type=int, default=d.seeds,
                        help="runs with seeds SEED..SEED+N-1; the median is reported")
    parser.add_argument("--capacity-factor", type=float, default=d.capacity_factor,
                        help="MoE capacity C (default: the task recipe)")
    parser.add_argument("--balance-loss-weight", type=float, default=d.balance_loss_weight,
                        help="lambda (default: the task recipe)")
    parser.add_argument("--dropout", type=float, default=d.dropout,
                        help="hidden and attention dropout (default: the recipe)")
    parser.add_argument("--max-seq-length", type=int, default=d.max_seq_length,
                        help="default: the recipe, capped by the model's positions")
    parser.add_argument("--ep-size", type=int, default=d.ep_size,
                        help="expert-parallel size of the finetuning run (divides the number of ranks)")
    parser.add_argument("--max-train-examples", type=int, default=d.max_train_examples,
                        help="use only the first N training examples")
    parser.add_argument("--max-eval-examples", type=int, default=d.max_eval_examples,
                        help="score only the first N evaluation examples")
    parser.add_argument("--log-interval", type=int, default=d.log_interval,
                        help="steps between loss records (TensorBoard + metrics.jsonl)")
    parser.add_argument("--eval-interval", type=int, default=d.eval_interval,
                        help="also evaluate every N steps (0: at the end only)")
    parser.add_argument("--save-interval", type=int, default=d.save_interval,
                        help="steps between checkpoints of the running seed (one is always written at its end)")
    parser.add_argument("--keep-last", type=int, default=d.keep_last,
                        help="complete checkpoints to keep per seed; a finished seed's are removed")
    parser.add_argument("--resume", action="store_true", default=d.resume,
                        help="continue the run in --output-dir: finished seeds are kept, the stopped seed continues "
                             "from its latest checkpoint (an empty or missing folder: a fresh start)")
    parser.add_argument("--allow-recipe-mismatch", action="store_true", default=d.allow_recipe_mismatch,
                        help="train with a DeepSpeed JSON whose batch size, learning rate or schedule differ from "
                             "the task recipe (recorded in results.json)")
    parser.add_argument("--eval-only", action="store_true", default=d.eval_only,
                        help="score --init-from (e.g. a folder written by --save-model) without training")
    parser.add_argument("--save-model", action="store_true", default=d.save_model,
                        help="write each seed's finetuned model as a checkpoint folder seed<N>/model (with the "
                             "tokenizer), loadable by --init-from / load_pretrained")
    parser.add_argument("--no-tensorboard", dest="tensorboard", action="store_false", help="metrics.jsonl only")
    parser.add_argument("--no-progress-bar", dest="progress_bar", action="store_false")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
