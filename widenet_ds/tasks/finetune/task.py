"""Finetuning (GLUE, SQuAD) on the one trainer: `FinetuneTask` is one seed of a run, an ordinary `Task`; what every
seed shares -- what it finetunes on (its `Finetuning`), its recipe, the tokenizer, the weights to start from, the
model, the data -- is `FinetuneInputs`, checked and read once per run (widenet_ds/run/sweep.py runs the seeds).

Batch size, learning rate and schedule live only in the DeepSpeed JSON (ds_configs/finetune_*.json carry the
paper's Table 7 recipes); the dataset's recipe (widenet_ds/tasks/finetune/recipe.py) gives the capacity factor,
balance weight, dropout and max length, each changed with `--set`; a JSON whose batch size, learning rate or
schedule differ from the recipe is refused unless `--allow-recipe-mismatch`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as torch_dist

from widenet_ds.checkpoint.source import CheckpointSource
from widenet_ds.checkpoint.tokenizer_check import check_checkpoint_tokenizer
from widenet_ds.data.tokenizer import TokenizerFiles, load_tokenizer
from widenet_ds.distributed.console import say
from widenet_ds.engine.ds_config import DeepSpeedSettings
from widenet_ds.errors import CheckpointError, ConfigError, raise_config_problems
from widenet_ds.portable.weights import load_into
from widenet_ds.results import Scores
from widenet_ds.run_folder import RunFolder, read_metrics
from widenet_ds.seeds import SEED_SPACING
from widenet_ds.tasks.finetune.config import FinetuneConfig
from widenet_ds.tasks.finetune.epoch_batches import EpochBatches
from widenet_ds.tasks.finetune.features import check_max_length, check_tokenizer_matches
from widenet_ds.tasks.finetune.finetuning import Finetuning
from widenet_ds.tasks.finetune.predict import Batching, Prepared
from widenet_ds.tasks.finetune.recipe import FinetuneRecipe
from widenet_ds.tasks.finetune.results import SeedResults
from widenet_ds.tasks.finetune.weights import finetune_model_config, save_finetuned
from widenet_ds.training.log import TrainingLog
from widenet_ds.training.metrics import FinetuneMetrics
from widenet_ds.training.plan import (
    RunPlan,
    check_resume_changes,
    resolve_max_steps,
    resume_changes,
)
from widenet_ds.training.task import Task


def peak_lr(settings: DeepSpeedSettings) -> float | None:
    scheduler = settings.config.get("scheduler") or {}
    params = scheduler.get("params", {})
    return params.get("warmup_max_lr", settings.config.get("optimizer", {}).get("params", {}).get("lr"))


def recipe_mismatch(recipe: FinetuneRecipe, settings: DeepSpeedSettings) -> list[str]:
    """How the DeepSpeed JSON's batch size, learning rate and schedule differ from the task recipe."""
    warmup = ((settings.config.get("scheduler") or {}).get("params") or {}).get("warmup_num_steps")
    return recipe.differences(batch_size=settings.batch.train_batch_size, learning_rate=peak_lr(settings),
                              warmup_steps=warmup, steps=settings.total_num_steps)


def requested_steps(cfg: FinetuneConfig, settings: DeepSpeedSettings, recipe: FinetuneRecipe) -> int:
    """--max-steps, else the schedule's length, else the recipe's (none for --eval-only)."""
    if cfg.eval_only:
        return 0
    return cfg.max_steps or (None if settings.total_num_steps else recipe.steps)


class FinetuneInputs:
    """What every seed of a finetuning run shares, checked once: what it finetunes on and its recipe, the tokenizer, the
    weights of `--init-from` (opened once by the run), the model, the maximum length; the DeepSpeed settings
    against the recipe (`check_settings`) and the data (`read_data`), once, when the run is planned."""

    def __init__(self, cfg: FinetuneConfig, finetuning: Finetuning, init_source: CheckpointSource | None) -> None:
        self.cfg, self.finetuning, self.init_source = cfg, finetuning, init_source
        self.recipe = finetuning.recipe()
        saved = self._saved_tokenizer()
        self.tokenizer = load_tokenizer(cfg.tokenizer) if cfg.tokenizer is not None else saved.load()
        self.checkpoint = init_source.read_weights() if init_source is not None else None
        model_class = finetuning.model_class.__name__
        if cfg.eval_only and self.checkpoint.architecture != model_class:
            raise CheckpointError(f"--eval-only scores trained weights, but {cfg.init_from} holds a "
                                  f"{self.checkpoint.architecture}, not a {model_class}: its {finetuning.name} head "
                                  f"would be random. Finetune it first (drop --eval-only), or pass a finetuned model "
                                  f"(--save-model writes one).")
        self.model_config = finetune_model_config(cfg, self.recipe, self.tokenizer.get_vocab_size(), self.checkpoint)
        check_tokenizer_matches(self.tokenizer, self.model_config.vocab_size)
        if init_source is not None:  # the same vocabulary, not just the same size
            check_checkpoint_tokenizer(self.tokenizer, f"--tokenizer {cfg.tokenizer}" if cfg.tokenizer else
                                       "the tokenizer saved with --init-from", init_source,
                                       self.model_config.vocab_size,
                                       tokenizer_file=None if cfg.tokenizer else saved.paths[0])
        # An explicit --max-seq-length above the model's positions is an error; the recipe's is capped.
        self.max_len = cfg.max_seq_length or min(self.recipe.max_seq_length, self.model_config.max_position_embeddings)
        check_max_length(self.max_len, self.model_config.max_position_embeddings)
        self.mismatch: list[str] = []  # how the DeepSpeed JSON differs from the recipe (--allow-recipe-mismatch)
        self.changes: list[str] = []   # settings changed since the run started (--accept-changed-settings)
        self.data: Prepared | None = None
        self.load_report = ""  # where the first seed trained in this process got its weights

    def _saved_tokenizer(self) -> TokenizerFiles | None:
        """The tokenizer saved with --init-from (in an exported folder, or next to a run's checkpoints), when no
        --tokenizer names one."""
        if self.cfg.tokenizer is not None:
            return None
        found = self.init_source.tokenizer_files() if self.init_source is not None else TokenizerFiles()
        if not found:
            raise ConfigError("no tokenizer given and none saved with --init-from: pass --tokenizer (the tokenizer.json "
                              "/ vocab.txt or the prepared data folder the model was pretrained with).")
        return found

    def check_settings(self, ds: DeepSpeedSettings) -> None:
        """The DeepSpeed settings against the recipe and the step count, in one error; a resumed run's settings
        against its run_config.json (once for all seeds)."""
        cfg = self.cfg
        problems = []
        try:
            resolve_max_steps(requested_steps(cfg, ds, self.recipe), ds,
                              cfg.schedule_change_flags(resuming=cfg.resume is not None))
        except ConfigError as err:
            problems.append(str(err))
        self.mismatch = [] if cfg.eval_only else recipe_mismatch(self.recipe, ds)
        if self.mismatch and not cfg.allow_recipe_mismatch:
            problems.append(f"{cfg.deepspeed_config} disagrees with the {self.finetuning.name} recipe ("
                            f"{self.recipe.source}): {'; '.join(self.mismatch)}. Use a DeepSpeed JSON with the recipe's "
                            f"values (the paper's: ds_configs/finetune_{{sst2,mnli,squad11,squad20}}.json), or pass "
                            f"--allow-recipe-mismatch to train with the JSON's.")
        raise_config_problems(problems, "the finetuning run")
        self.changes = resume_changes(cfg, cfg.folder, ds, None) if cfg.resume else []
        check_resume_changes(cfg, cfg.output_dir, self.changes)

    def read_data(self) -> None:
        """Training and evaluation features, read once per run."""
        if self.data is None:
            say(f"reading the {self.finetuning.name} data")
            self.data = self.finetuning.prepare(self.tokenizer, self.max_len)

    def settings_line(self, ds: DeepSpeedSettings) -> str:
        model = self.model_config
        moe = f"C {model.moe.capacity_factor:g}, lambda {model.moe.balance_loss_weight:g}, " if model.is_moe else ""
        return (f"recipe {self.recipe.source}: {moe}dropout {model.hidden_dropout:g}; DeepSpeed: batch "
                f"{ds.batch.train_batch_size}, lr {peak_lr(ds)}, schedule {ds.scheduler_type} over "
                f"{ds.total_num_steps} steps")


class FinetuneTask(Task):
    """One seed of a finetuning run, trained in its own folder (seed<N>/) from the run's shared inputs."""

    METRICS = FinetuneMetrics
    RESULTS = SeedResults
    cfg: FinetuneConfig

    def __init__(self, cfg: FinetuneConfig, folder: RunFolder, inputs: FinetuneInputs, seed: int) -> None:
        super().__init__(cfg, folder, inputs.init_source)
        self.inputs, self.seed = inputs, seed

    @property
    def init_seed(self) -> int:
        return self.seed

    @property
    def stream_seed(self) -> int:
        # Several seeds train in one process: seed s's rank streams never meet seed s + 1's initialisation.
        return SEED_SPACING * self.seed

    # -- before anything is built --------------------------------------------------------------------
    def model_config(self):
        return self.inputs.model_config

    def check_settings(self, ds: DeepSpeedSettings) -> None:
        self.inputs.check_settings(ds)

    def load_data(self) -> None:
        self.inputs.read_data()

    def batches_per_epoch(self, train_batch_size: int) -> int:
        return max(1, len(self.inputs.data.train) // train_batch_size)

    def requested_steps(self, ds: DeepSpeedSettings) -> int | None:
        return requested_steps(self.cfg, ds, self.inputs.recipe)

    def prepare(self, plan: RunPlan) -> None:
        super().prepare(plan)
        micro, parallel = plan.ds.batch.micro_batch_size, plan.parallel
        # Expert parallelism exchanges capacity buffers sized by each rank's tokens: one shape on every rank.
        pad_to = self.inputs.max_len if plan.model_config.is_moe and parallel.ep_size > 1 else None
        self.batching = Batching(micro, pad_to)
        self.loader = EpochBatches(self.inputs.data.train, micro, self.seed, parallel.data_parallel_rank,
                                   parallel.data_parallel_size, plan.ds.batch.gradient_accumulation_steps,
                                   plan.data_order)

    # -- building ------------------------------------------------------------------------------------
    def build_model(self):
        finetuning, checkpoint = self.inputs.finetuning, self.inputs.checkpoint
        model = finetuning.model_class(self.plan.model_config, ep_size=self.plan.parallel.ep_size,
                                       **finetuning.model_kwargs())
        if checkpoint is None:
            report = f"random initialisation from preset {self.cfg.model_config} (no weights loaded)"
        else:
            report = load_into(model, checkpoint, str(self.cfg.init_from)).summary()
        self.inputs.load_report = self.inputs.load_report or report
        return model, report.splitlines()

    def train_loader(self) -> EpochBatches:
        return self.loader

    def meta(self) -> dict[str, Any]:
        return {"finetune": {"task": self.inputs.finetuning.name, "seed": self.seed, "max_steps": self.plan.max_steps}}

    # -- the step --------------------------------------------------------------------------------------
    def micro_batch(self, batches, engine) -> dict[str, torch.Tensor]:
        batch = self.batching.shape(next(batches), self.inputs.data.train.pad_id)
        return {k: v.to(engine.device) for k, v in batch.items() if k != "feature_index"}

    def train_line(self, s: dict[str, float]) -> str:
        return (f"loss {s['train/loss']:.4f} | task {s['train/task_loss']:.4f} | balance {s['train/balance_loss']:.4f}"
                f" | lr {s['optim/lr']:.3g} | {s['perf/samples_per_second']:.1f} samples/s")

    # -- evaluation and the end ------------------------------------------------------------------------
    def evaluate(self, engine, step: int, log: TrainingLog) -> Scores:
        finetuning = self.inputs.finetuning
        metrics = {split: finetuning.evaluate(engine, split, features, self.batching, self.folder.path)
                   for split, features in self.inputs.data.evals.items()}
        log.record(step, {f"eval/{split}/{name}": value for split, values in metrics.items()
                          for name, value in values.items() if isinstance(value, (int, float))})
        log.event(step, f"eval {self.cfg.scores_line(metrics)}")
        return metrics

    def finish(self, engine, state, log: TrainingLog) -> SeedResults:
        cfg, inputs = self.cfg, self.inputs
        metrics = self.evaluate(engine, state.step, log)
        for line in inputs.finetuning.predict_test(engine, inputs.tokenizer, inputs.max_len, self.batching,
                                                   self.folder.path):
            log.event(state.step, line)
        if cfg.save_model:
            labels = inputs.finetuning.label_names()  # the saved model's (and its HF export's) names of its labels
            path = save_finetuned(engine.module, self.folder.path / "model", inputs.tokenizer,
                                  {"task": inputs.finetuning.name, "seed": self.seed, "steps": state.step,
                                   "init": cfg.weights_source, **({"label_names": list(labels)} if labels else {})},
                                  self.plan.parallel.ep_size)
            log.event(state.step, f"finetuned model saved: {path}")
        final_loss = None
        if torch_dist.get_rank() == 0:  # (rank 0 writes the results; only its log has the records)
            losses = read_metrics(self.folder.metrics).series("train/loss")
            final_loss = losses[max(losses)] if losses else None
        return SeedResults(self.seed, metrics, final_loss)
