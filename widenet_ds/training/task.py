"""What the planner and the loop ask of a training task: pretraining, image classification, one finetuning seed.
Every hook either of them calls is declared here (tests/training/test_task.py checks it against their code), and
nothing of a task is set from outside: the plan comes in through `prepare(plan)`.

The order of the calls (torchtitan's `Trainer` hooks are the model):

    planner (training/plan.py)   model_config -> check_settings(ds) -> load_data -> batches_per_epoch,
                                 requested_steps(ds) -> check_resume(meta, source) -> prepare(plan)
    loop (training/trainer.py)   train_loader, build_model -> start -> [micro_batch (-> loss_weights) -> forward
                                 -> metrics, train_scalars, train_line]* with evaluate between -> finish -> its Results

A dry run without the data (launch/dry_run.py) asks model_config_from_settings in place of model_config, and
neither load_data, batches_per_epoch, check_resume nor prepare.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch
from torch import nn

from widenet_ds.checkpoint.manager import TrainingState
from widenet_ds.checkpoint.marker import CheckpointMeta
from widenet_ds.checkpoint.source import CheckpointSource
from widenet_ds.engine.ds_config import DeepSpeedSettings
from widenet_ds.errors import ConfigError
from widenet_ds.results import Results
from widenet_ds.run_folder import RunFolder
from widenet_ds.training.log import TrainingLog
from widenet_ds.training.metrics import WindowSums
from widenet_ds.training.plan import RunPlan
from widenet_ds.training.run_config import RunConfig


class Task(ABC):
    """One training run of `cfg` into `folder` (a finetuning seed: its seed folder), from `init_source`
    (`--init-from`, opened once by the run) when given."""

    METRICS: ClassVar[type[WindowSums]]  # what a training window sums (training/metrics.py)
    RESULTS: ClassVar[type[Results]]     # the results.json dataclass `finish` returns (widenet_ds/results.py)
    plan: RunPlan                        # this run's plan, from `prepare`

    def __init__(self, cfg: RunConfig, folder: RunFolder, init_source: CheckpointSource | None = None) -> None:
        self.cfg, self.folder, self.init_source = cfg, folder, init_source

    # -- before anything is built: the planner ------------------------------------------------------------
    @abstractmethod
    def model_config(self):
        """The model this run trains (its data read as far as the model depends on it, and checked)."""

    def model_config_from_settings(self):
        """The model as the settings alone give it, for a dry run on a machine without the task's data
        (launch/dry_run.py). A task whose model cannot be known without its data refuses."""
        raise ConfigError(f"a dry run of {self.cfg.TASK} needs its data on this machine (the model depends on it): "
                          f"pass a --data folder that is here, or plan the job on the cluster.")

    def check_settings(self, ds: DeepSpeedSettings) -> None:
        """The task's own checks of the DeepSpeed settings (finetuning: the task's recipe)."""

    def load_data(self) -> None:
        """Read the training data, after every cheap check of the settings (a task whose model config needed the
        data has read it already)."""

    @abstractmethod
    def batches_per_epoch(self, train_batch_size: int) -> int:
        """Optimizer steps in one pass over the training data."""

    @abstractmethod
    def requested_steps(self, ds: DeepSpeedSettings) -> int | None:
        """The run's length as its settings ask for it (None: the DeepSpeed schedule's)."""

    def check_resume(self, meta: CheckpointMeta, source: CheckpointSource) -> None:
        """Refuse a checkpoint of another run of this task (other data, another dataset)."""

    def prepare(self, plan: RunPlan) -> None:
        """Take the plan; build this rank's loaders (subclasses extend it)."""
        self.plan = plan

    # -- seeds -----------------------------------------------------------------------------------------
    @property
    def init_seed(self) -> int:
        """The seed of the initial weights (the same on every rank)."""
        return self.cfg.seed

    @property
    def stream_seed(self) -> int:
        """The base of each rank's random stream (dropout, routing noise, augmentation)."""
        return self.cfg.seed

    # -- building: the loop ------------------------------------------------------------------------------
    @abstractmethod
    def train_loader(self):
        """This rank's resumable training batches (`state_dict`/`load_state_dict`, iterable)."""

    @abstractmethod
    def build_model(self) -> tuple[nn.Module, list[str]]:
        """The model with its initial weights (from --init-from where they come from a folder), and the lines
        that say where they came from."""

    def start(self, engine, log: TrainingLog, state: TrainingState) -> None:
        """After the engine is built and the run resumed: the task's files of the run folder, first events."""

    def meta(self) -> dict[str, Any]:
        """The task's entries of a checkpoint's marker (what a resume must find the same)."""
        return {}

    # -- the step --------------------------------------------------------------------------------------
    @abstractmethod
    def micro_batch(self, batches, engine) -> dict[str, torch.Tensor]:
        """The next micro-batch, on the engine's device, ready for `forward`."""

    # Whether the loop draws a step's micro-batches before its first forward, for `loss_weights`.
    WEIGHS_STEP: ClassVar[bool] = False

    def loss_weights(self, micro_batches: list[dict[str, torch.Tensor]]) -> list[torch.Tensor] | None:
        """Collective (every rank, each step, when WEIGHS_STEP): the weight of each of this rank's micro-batches of
        a step on its per-token losses, such that the step's loss is their mean over the step's tokens of every
        micro-batch and rank whatever the micro batch (`plan.loss_normalisation`, data/batch_order.py). None: the
        task's losses are means over examples, which every micro-batch holds as many of."""
        return None

    def forward(self, engine, batch: dict[str, torch.Tensor], branches: int | None,
                weight: torch.Tensor | None = None):
        """The model's output for a micro-batch (with `branches`: the first k branches only; `weight`: this
        micro-batch's of `loss_weights`, applied to its per-token losses)."""
        return engine(**batch, branches=branches) if branches else engine(**batch)

    def metrics(self) -> WindowSums:
        """Fresh window sums: the task's figures, per routing call of its model."""
        model = self.plan.model_config
        return self.METRICS(model.routing_blocks, model.moe.num_experts if model.is_moe else 0,
                            self.plan.parallel.branch_parallel)

    def train_scalars(self) -> dict[str, float]:
        """Scalars of the task's own beside each training record (e.g. the data epoch)."""
        return {}

    @abstractmethod
    def train_line(self, scalars: dict[str, float]) -> str:
        """The console line of a training record."""

    # -- evaluation and the end ------------------------------------------------------------------------
    def evaluate(self, engine, step: int, log: TrainingLog) -> Any:
        """Collective: evaluate, record the scalars and say them on the console (nothing to evaluate: no-op)."""

    @abstractmethod
    def finish(self, engine, state: TrainingState, log: TrainingLog) -> Results:
        """Collective, after the last step of a finished run: the final evaluation and its RESULTS (the loop
        writes them to the run folder)."""
