"""Pretraining settings: one typed, validated place, built from the command line.

Batch sizes, learning rate, schedule, precision and ZeRO live ONLY in the DeepSpeed JSON (users bring
their own; see ds_configs/README.md); the model lives in its model config; the sequence length and
vocabulary come from the prepared data's manifest. Nothing here repeats any of them.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from widenet_ds.errors import ConfigError, raise_config_problems
from widenet_ds.runtime.compile import CompileMode
from widenet_ds.training.branch_schedule import add_branch_arguments
from widenet_ds.writable import check_output_folder

OptimizerChoice = Literal["auto", "deepspeed-fused", "torch-lamb"]
LATEST = "latest"


@dataclass
class PretrainConfig:
    """Everything a pretraining run needs besides the DeepSpeed JSON and the model config.

    `max_steps` counts optimizer steps; it defaults to the schedule's `total_num_steps` in the
    DeepSpeed JSON. `resume` is None (a fresh run), "latest" (the newest complete checkpoint in
    `output_dir`, or a fresh start when there is none yet, so a requeued job simply continues) or a
    checkpoint folder. `init_from` starts a new phase (e.g. phase 2, seq 512) from the weights of
    another run's DeepSpeed checkpoint or of a portable checkpoint folder (`convert to-folder`, a reshard,
    a ParaFormer expansion), with a fresh optimizer and schedule.
    """

    model_config: str  # a preset name, a model-config JSON file or a checkpoint folder (its config)
    deepspeed_config: Path
    data_dir: Path
    output_dir: Path
    max_steps: int | None = None
    log_interval: int = 10
    save_interval: int = 1000
    keep_last: int = 3
    eval_interval: int = 1000  # 0: no validation
    eval_batches: int = 20
    seed: int = 1234
    ep_size: int = 1  # expert parallelism: ranks an expert group spans (a run setting, not the model's)
    activation_checkpointing: bool = False
    compile: CompileMode = "none"  # torch.compile: "model" (whole), "blocks" (shared encoder modules), "none"
    compile_backend: str = "inductor"
    optimizer: OptimizerChoice = "auto"
    resume: str | None = None
    init_from: Path | None = None
    accept_changed_settings: bool = False  # --resume with another batch size, optimizer or schedule
    branch_schedule: str = "joint"           # ParaFormer layouts (num_branches > 1): joint | prefix | staged
    prefix_cycle_batches: int | None = None
    stage_steps: list[int] = field(default_factory=list)
    tensorboard: bool = True
    progress_bar: bool = True

    def __post_init__(self) -> None:
        self.deepspeed_config = Path(self.deepspeed_config)
        self.data_dir = Path(self.data_dir)
        self.output_dir = Path(self.output_dir)
        if self.init_from is not None:
            self.init_from = Path(self.init_from)
        problems = []  # every problem at once, not one per attempt
        if self.max_steps is not None and self.max_steps <= 0:
            problems.append(f"--max-steps must be positive, got {self.max_steps}.")
        for name in ("log_interval", "save_interval", "keep_last", "eval_batches", "ep_size"):
            if getattr(self, name) <= 0:
                problems.append(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}.")
        if self.eval_interval < 0:
            problems.append(f"--eval-interval must be >= 0 (0 turns validation off), got {self.eval_interval}.")
        if self.compile not in get_args(CompileMode):
            problems.append(f"--compile {self.compile!r} is not one of {list(get_args(CompileMode))}.")
        if self.optimizer not in get_args(OptimizerChoice):
            problems.append(f"--optimizer {self.optimizer!r} is not one of {list(get_args(OptimizerChoice))}.")
        if self.resume is not None and self.init_from is not None:
            problems.append("--resume continues a run and --init-from starts a new phase from another run's "
                            "weights; pass only one of them.")
        if not self.deepspeed_config.is_file():
            problems.append(f"DeepSpeed config {self.deepspeed_config} does not exist; pass --deepspeed_config "
                            f"with a JSON file, e.g. ds_configs/cpu_small.json (see ds_configs/README.md).")
        if self.output_dir.exists() and not self.output_dir.is_dir():
            problems.append(f"--output-dir {self.output_dir} exists and is not a directory.")
        else:
            try:
                check_output_folder(self.output_dir, "--output-dir", subfolders=("checkpoints", "tensorboard"))
            except ConfigError as err:
                problems.append(str(err))
        raise_config_problems(problems, "the pretraining settings")

    @property
    def checkpoint_dir(self) -> Path:
        return self.output_dir / "checkpoints"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="run_pretrain.py",
        description="WideNet / ALBERT MLM+SOP pretraining on DeepSpeed. Start it with the `deepspeed` "
                    "launcher (or launcher.sh, srun, mpiexec). Batch sizes, learning rate, schedule, "
                    "precision and ZeRO stage come from the DeepSpeed JSON only.")
    parser.add_argument("--model-config", required=True,
                        help="a preset name (e.g. widenet-base-e4, albert-base, widenet-tiny-e4), a model-config JSON "
                             "or a checkpoint folder (the model it holds)")
    parser.add_argument("--deepspeed_config", "--deepspeed-config", dest="deepspeed_config", required=True,
                        type=Path, help="DeepSpeed JSON (see ds_configs/README.md)")
    parser.add_argument("--data", dest="data_dir", required=True, type=Path,
                        help="prepared data folder (`widenet-ds prepare-data`)")
    parser.add_argument("--output-dir", required=True, type=Path,
                        help="checkpoints/, tensorboard/, metrics.jsonl and the model config go here")
    parser.add_argument("--max-steps", type=int, default=None,
                        help="optimizer steps to run (default: the scheduler's total_num_steps)")
    parser.add_argument("--log-interval", type=int, default=PretrainConfig.log_interval,
                        help="steps between metric records (TensorBoard + metrics.jsonl)")
    parser.add_argument("--save-interval", type=int, default=PretrainConfig.save_interval,
                        help="steps between checkpoints (one is always written at the end)")
    parser.add_argument("--keep-last", type=int, default=PretrainConfig.keep_last,
                        help="complete checkpoints to keep; older ones are deleted")
    parser.add_argument("--eval-interval", type=int, default=PretrainConfig.eval_interval,
                        help="steps between validations on the held-out split (0: none)")
    parser.add_argument("--eval-batches", type=int, default=PretrainConfig.eval_batches,
                        help="micro-batches per rank in each validation")
    parser.add_argument("--seed", type=int, default=PretrainConfig.seed)
    parser.add_argument("--ep-size", type=int, default=PretrainConfig.ep_size,
                        help="expert parallelism: each group of EP_SIZE ranks holds all experts, num_experts / "
                             "EP_SIZE per rank (must divide the world size and num_experts)")
    parser.add_argument("--activation-checkpointing", action=argparse.BooleanOptionalAction,
                        default=PretrainConfig.activation_checkpointing,
                        help="recompute each block in backward (non-reentrant): less memory, more compute")
    parser.add_argument("--compile", nargs="?", const="model", default=PretrainConfig.compile,
                        choices=get_args(CompileMode),
                        help="torch.compile the model in place: 'model' (the default of a bare --compile: the "
                             "whole model), 'blocks' (the shared attention and MoE/FFN modules only: a faster "
                             "build) or 'none'")
    parser.add_argument("--compile-backend", default=PretrainConfig.compile_backend,
                        help="torch.compile backend (inductor; aot_eager traces without generating kernels)")
    parser.add_argument("--optimizer", choices=get_args(OptimizerChoice), default=PretrainConfig.optimizer,
                        help="for a JSON asking for Lamb: DeepSpeed's fused CUDA kernel or our PyTorch LAMB "
                             "(per-tensor trust ratio, also under ZeRO); auto picks (see docs/pretraining.md)")
    parser.add_argument("--resume", nargs="?", const=LATEST, default=None, metavar="CHECKPOINT",
                        help="continue exactly: from the latest checkpoint in --output-dir (no value; a fresh "
                             "start if there is none yet) or from the given checkpoint folder")
    parser.add_argument("--accept-changed-settings", action="store_true",
                        help="--resume although the batch size, optimizer, schedule, clipping or precision of the "
                             "DeepSpeed JSON differ from the checkpoint's (the run is then no longer exact; the "
                             "changes are logged)")
    parser.add_argument("--init-from", type=Path, default=None, metavar="CHECKPOINT",
                        help="start a new phase (e.g. seq 512) from the weights of another run's checkpoint or of "
                             "a checkpoint folder (convert to-folder, branches expand); the data must use its "
                             "tokenizer")
    add_branch_arguments(parser)
    parser.add_argument("--no-tensorboard", dest="tensorboard", action="store_false",
                        help="write metrics.jsonl only")
    parser.add_argument("--no-progress-bar", dest="progress_bar", action="store_false")
    # Passed by the `deepspeed` launcher; the rank itself comes from the environment.
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return parser


def parse_args(argv: list[str] | None = None) -> PretrainConfig:
    args = vars(build_parser().parse_args(argv))
    args.pop("local_rank")
    return PretrainConfig(**args)
