"""Finetuning run settings: `FinetuneConfig` (validated) and the flags every finetune entrypoint shares."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from widenet_ds.errors import ConfigError, DataError

HF_DATA = "hf"


@dataclass
class FinetuneConfig:
    """One finetuning run (all seeds). Task fields: `task` (GLUE) or `version`, `doc_stride`,
    `train_file`, `dev_file` (SQuAD)."""

    data: str  # a folder/file in the original format, or "hf"
    deepspeed_config: Path
    output_dir: Path
    init: str | None = None  # exported folder, DeepSpeed checkpoint (any ep_size) or pretraining output folder
    preset: str | None = None  # random initialisation
    tokenizer: str | None = None
    max_steps: int | None = None
    seeds: int = 1
    capacity_factor: float | None = None
    balance_loss_weight: float | None = None
    dropout: float | None = None
    max_seq_length: int | None = None
    ep_size: int = 1
    max_train_examples: int | None = None
    max_eval_examples: int | None = None
    eval_every: int = 0
    log_every: int = 10
    eval_only: bool = False
    predict_test: bool = False
    save_model: bool = False
    tensorboard: bool = True
    task: str | None = None
    version: str | None = None
    doc_stride: int | None = None  # default: 128, at most max length / 4
    train_file: str | None = None
    dev_file: str | None = None

    def __post_init__(self) -> None:
        self.deepspeed_config, self.output_dir = Path(self.deepspeed_config), Path(self.output_dir)
        if (self.init is None) == (self.preset is None):
            raise ConfigError("pass exactly one of --init (pretrained weights) and --preset (random initialisation).")
        for name in ("max_steps", "seeds", "ep_size", "max_train_examples", "max_eval_examples", "log_every",
                     "max_seq_length"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be positive, got {value}.")
        if self.eval_every < 0:
            raise ConfigError(f"--eval-every must be >= 0 (0: evaluate at the end only), got {self.eval_every}.")
        if self.doc_stride is not None and self.doc_stride < 0:
            raise ConfigError(f"--doc-stride must be >= 0, got {self.doc_stride}.")
        if self.eval_only and self.init is None:
            raise ConfigError("--eval-only scores pretrained weights: pass --init with a finetuned checkpoint.")
        if self.eval_only and self.seeds != 1:
            raise ConfigError("--eval-only scores one set of weights; drop --seeds.")
        if self.init is not None and not Path(self.init).exists():
            raise ConfigError(f"--init {self.init} does not exist; pass an exported folder, a DeepSpeed checkpoint "
                              f"or a pretraining output folder.")
        if self.data != HF_DATA and not Path(self.data).exists():
            raise DataError(f"--data {self.data} does not exist; pass the folder (or file) in the original format, "
                            f"or `--data hf` to download through HF datasets.")

    @property
    def data_path(self) -> Path | None:
        return None if self.data == HF_DATA else Path(self.data)


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, help="folder/file in the original format, or `hf` for HF datasets")
    init = parser.add_mutually_exclusive_group(required=True)
    init.add_argument("--init", help="an exported folder, a DeepSpeed checkpoint (any ep_size) or a pretraining "
                                     "output folder (its latest checkpoint)")
    init.add_argument("--preset", help="random initialisation from a preset (baselines, tests)")
    parser.add_argument("--tokenizer", help="tokenizer.json / vocab.txt / prepared data folder (default: the "
                                            "one saved with --init)")
    parser.add_argument("--deepspeed_config", "--deepspeed-config", required=True,
                        help="DeepSpeed JSON: batch size, learning rate, schedule (ds_configs/finetune_*.json)")
    parser.add_argument("--output-dir", required=True, help="results.json and one seed<N>/ folder per seed")
    parser.add_argument("--max-steps", type=int, help="default: the schedule's total_num_steps, else the recipe")
    parser.add_argument("--seeds", type=int, default=1, help="runs with seeds 1..N; the median is reported")
    parser.add_argument("--capacity-factor", type=float, help="MoE capacity C (default: the task recipe)")
    parser.add_argument("--balance-loss-weight", type=float, help="lambda (default: the task recipe)")
    parser.add_argument("--dropout", type=float, help="hidden and attention dropout (default: the recipe)")
    parser.add_argument("--max-seq-length", type=int, help="default: the recipe, capped by the model's positions")
    parser.add_argument("--ep-size", type=int, default=FinetuneConfig.ep_size,
                        help="expert parallelism of the finetuning run (any ep_size loads any checkpoint)")
    parser.add_argument("--max-train-examples", type=int, help="use only the first N training examples")
    parser.add_argument("--max-eval-examples", type=int, help="score only the first N evaluation examples")
    parser.add_argument("--eval-every", type=int, default=0, help="also evaluate every N steps (0: at the end only)")
    parser.add_argument("--log-every", type=int, default=10, help="steps between loss records")
    parser.add_argument("--eval-only", action="store_true",
                        help="score --init (e.g. a folder written by --save-model) without training")
    parser.add_argument("--save-model", action="store_true",
                        help="write each seed's finetuned model as a checkpoint folder seed<N>/model (with the "
                             "tokenizer), loadable by --init / load_pretrained")
    parser.add_argument("--no-tensorboard", dest="tensorboard", action="store_false", help="metrics.jsonl only")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)


