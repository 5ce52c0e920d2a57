"""A finetuning run (GLUE, SQuAD) as a sweep over seeds: the inputs every seed shares are checked and read once and
the run is planned once; then each seed is an ordinary `FinetuneTask` trained by its own `Trainer` in `seed<N>/`
(from the same weights, evaluated, its checkpoints removed once it is done); the sweep writes the run's
run_config.json and its results.json: every seed's metrics and their median. A stopped run continues with
`--resume`: finished seeds are kept, the stopped seed continues from its latest checkpoint.

    <output>/run_config.json, metrics.jsonl (the run's events), results.json (when every seed is done)
    <output>/seed<N>/        metrics.jsonl, tensorboard/, prediction files, results.json of the seed,
                             checkpoints/ while it trains, model/ (--save-model)
"""

from __future__ import annotations

import shutil
import statistics
from dataclasses import asdict

import torch.distributed as torch_dist

from widenet_ds.checkpoint.source import CheckpointSource
from widenet_ds.distributed.console import say
from widenet_ds.errors import WideNetError, mark_same_on_every_rank
from widenet_ds.results import numbers
from widenet_ds.tasks.finetune.config import FinetuneConfig
from widenet_ds.tasks.finetune.finetuning import Finetuning
from widenet_ds.tasks.finetune.results import DeepSpeedUsed, FinetuneResults, SeedResults
from widenet_ds.tasks.finetune.task import (
    FinetuneInputs,
    FinetuneTask,
    peak_lr,
)
from widenet_ds.tasks.finetune.weights import model_overrides
from widenet_ds.training.log import TrainingLog
from widenet_ds.training.plan import RunPlan, find_resume, plan_resume, plan_run
from widenet_ds.training.preemption import StopRequest
from widenet_ds.training.trainer import Trainer, run_record


def median_over_seeds(per_seed: list[SeedResults]) -> dict[str, dict[str, float]]:
    """Median over seeds of each metric of each split (the GLUE papers' report: median of 5 seeds)."""
    return {split: {name: statistics.median(run.metrics[split][name] for run in per_seed) for name in values}
            for split, values in numbers(per_seed[0].metrics).items()}


class SeedSweep:
    """Every seed of `cfg` finetuning on `finetuning`, from `init_source` (--init-from, opened once by
    run/run_task.py)."""

    def __init__(self, cfg: FinetuneConfig, finetuning: Finetuning, init_source: CheckpointSource | None) -> None:
        self.cfg, self.finetuning, self.init_source = cfg, finetuning, init_source

    def run(self, stop: StopRequest) -> FinetuneResults | None:
        """Train and evaluate every seed; write results.json; return the summary (None: stopped by a signal, to
        be continued with --resume)."""
        cfg, name = self.cfg, self.finetuning.name
        rank, world = torch_dist.get_rank(), torch_dist.get_world_size()
        seeds = cfg.seed_values
        try:  # every rank reads the same inputs: these errors are the same on all of them (printed once)
            inputs = FinetuneInputs(cfg, self.finetuning, self.init_source)
            first = FinetuneTask(cfg, cfg.folder.seed(seeds[0]), inputs, seeds[0])
            plan = plan_run(cfg, first, world, rank)  # once, for every seed
        except WideNetError as err:
            raise mark_same_on_every_rank(err)
        if rank == 0:
            cfg.output_dir.mkdir(parents=True, exist_ok=True)
        torch_dist.barrier()
        runlog = TrainingLog(cfg.folder, enabled=rank == 0, tensorboard=False, progress_bar=False, start_step=0,
                             max_steps=0, console_label="finetune")
        try:
            try:  # (the settings' own check, which `widenet-ds launch` and the demo make before any rank starts)
                complete = cfg.complete_results()
            except WideNetError as err:
                raise mark_same_on_every_rank(err)
            if complete is not None:
                runlog.event(None, f"{name}: the run in {cfg.output_dir} is complete; results in {cfg.folder.results}")
                return complete
            if inputs.mismatch:
                runlog.event(None, f"--allow-recipe-mismatch: training with {cfg.deepspeed_config}, not the {name} "
                                   f"recipe: {'; '.join(inputs.mismatch)}")
            for change in inputs.changes:
                runlog.event(None, f"changed since the run started (--accept-changed-settings): {change}")
            for line in (f"{name}: weights {cfg.weights_source}", *inputs.data.notes, inputs.settings_line(plan.ds)):
                runlog.event(None, line)
            per_seed = []
            for seed in seeds:
                if stop.agreed():
                    runlog.event(None, f"stopped by {stop.signal_name or 'a signal on another rank'} before seed "
                                       f"{seed}; resume with --resume")
                    return None
                result = self._train_seed(first if seed == seeds[0] else None, seed, inputs, plan, stop)
                if result is None:
                    return None
                runlog.event(None, f"seed {seed} done: {cfg.scores_line(result.metrics)}")
                per_seed.append(result)
            summary = self.summary(inputs, plan, per_seed)
            if rank == 0:
                cfg.folder.write_results(summary)
            runlog.event(None, f"{name} median over {cfg.seeds} seed(s): {cfg.scores_line(summary.median)} (trivial "
                               f"baseline: {cfg.scores_line(summary.baseline)}); written to {cfg.folder.results}")
            return summary
        finally:
            runlog.close()

    def _train_seed(self, task: FinetuneTask | None, seed: int, inputs: FinetuneInputs, plan: RunPlan,
                    stop: StopRequest) -> SeedResults | None:
        """One seed's results: kept from an earlier start of the run, or trained now (None: stopped, saved)."""
        cfg = self.cfg
        folder = cfg.folder.seed(seed)
        if cfg.resume and folder.results.is_file():
            return folder.read_results(SeedResults)
        task = task or FinetuneTask(cfg, folder, inputs, seed)
        try:
            seed_plan = plan_resume(cfg, task, plan, find_resume(cfg, folder))  # this seed's checkpoint, if any
            task.prepare(seed_plan)
        except WideNetError as err:
            raise mark_same_on_every_rank(err)
        if torch_dist.get_rank() == 0:  # the run's settings (a --resume of the sweep must find them the same)
            cfg.folder.write_run_config(run_record(cfg, plan))
        say(f"seed {seed}: building the model")
        finished, result = Trainer(cfg, task, seed_plan, stop, records_settings=False,
                                   console_label=f"seed {seed}").run()
        if not finished:
            return None
        if torch_dist.get_rank() == 0:  # the checkpoints served resuming this seed; its results are kept instead
            shutil.rmtree(folder.checkpoints, ignore_errors=True)
        torch_dist.barrier()
        return result

    @property
    def weights_used(self) -> str:
        """The checkpoint every seed started from, resolved (a run folder named as typed, relative or absolute, is
        its tag folder's absolute path: one model is one row of the report), or the preset of a random start."""
        return str(self.init_source.path.resolve()) if self.init_source is not None else self.cfg.weights_source

    def summary(self, inputs: FinetuneInputs, plan: RunPlan, per_seed: list[SeedResults]) -> FinetuneResults:
        cfg, finetuning, ds = self.cfg, self.finetuning, plan.ds
        return FinetuneResults(
            task=finetuning.name, init=self.weights_used, steps=plan.max_steps, seed=cfg.seed, seeds=cfg.seeds,
            primary_metric=finetuning.primary_metric, median=median_over_seeds(per_seed), per_seed=per_seed,
            baseline=finetuning.baseline(inputs.data), load_report=inputs.load_report,
            recipe={**asdict(inputs.recipe), "model_overrides": model_overrides(cfg, inputs.recipe)},
            recipe_mismatch=inputs.mismatch, ep_size=plan.parallel.ep_size,
            deepspeed=DeepSpeedUsed(str(cfg.deepspeed_config), ds.batch.train_batch_size, peak_lr(ds)),
            max_seq_length=inputs.max_len)
