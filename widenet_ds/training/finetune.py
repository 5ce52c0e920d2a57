"""One finetuning loop on DeepSpeed for every task; a task is data + head + metric (`GlueTaskRun`,
`SquadTaskRun` in `finetune_tasks.py`). The entrypoints `finetune/run_glue.py` and `finetune/run_squad.py`
only parse flags.

Batch size, learning rate and schedule live only in the DeepSpeed JSON (ds_configs/finetune_*.json carry
the paper's Table 7 recipes); the task recipe (`tasks/recipes.py`) gives the steps, capacity factor,
balance weight, dropout and max length, each overridable by a flag.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as torch_dist

from widenet_ds.atomic import atomic_write_json
from widenet_ds.errors import ConfigError, DataError, WideNetError
from widenet_ds.runtime.distributed import init_distributed, seed_everything
from widenet_ds.runtime.ds_config import load_ds_config, validate_ds_config
from widenet_ds.runtime.engine import build_engine
from widenet_ds.tasks.features import check_max_length, check_tokenizer_matches
from widenet_ds.training.finetune_config import FinetuneConfig
from widenet_ds.training.finetune_weights import load_tokenizer_for, model_overrides, save_finetuned
from widenet_ds.training.log import TrainingLog
from widenet_ds.training.predict import Batching


# --- training ---------------------------------------------------------------------------------------
def _batches(dataset, micro_batch: int, seed: int) -> Iterator[dict[str, torch.Tensor]]:
    """Shuffled epochs of this rank's share of `dataset`, forever (a new order each epoch)."""
    sampler = torch.utils.data.DistributedSampler(dataset, shuffle=True, seed=seed, drop_last=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=micro_batch, sampler=sampler,
                                         collate_fn=dataset.collate, drop_last=True)
    if len(loader) == 0:
        raise DataError(f"{len(dataset)} training examples cannot fill one micro-batch of {micro_batch} per rank; "
                        f"use more data or a smaller train_micro_batch_size_per_gpu.")
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def _all_reduce_sum(values: list[float]) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64)
    torch_dist.all_reduce(tensor)
    return tensor.tolist()


def train(engine, dataset, batching: Batching, accumulation: int, max_steps: int, seed: int, log, log_every: int,
          evaluate_now=None, eval_every: int = 0) -> float | None:
    """`max_steps` optimizer steps of `accumulation` micro-batches each; returns the last logged training
    loss (mean over the window and the ranks)."""
    micro = batching.micro_batch
    batches = _batches(dataset, micro, seed)
    sums, window_start, last_loss = [0.0, 0.0, 0.0, 0.0], time.perf_counter(), None
    engine.train()
    for step in range(1, max_steps + 1):
        lr = engine.get_lr()[0]  # the rate this step uses (read before the scheduler advances)
        for _ in range(accumulation):
            batch = batching.shape(next(batches), dataset.pad_id)
            batch = {k: v.to(engine.device) for k, v in batch.items() if k != "feature_index"}
            out = engine(**batch)
            engine.backward(out.loss)
            engine.step()
            figures = (out.loss.item(), out.task_loss.item(), out.balance_loss.item(), 1.0)
            sums = [s + x for s, x in zip(sums, figures)]
        if step % log_every == 0 or step == max_steps:
            loss, task_loss, balance, n = _all_reduce_sum(sums)
            last_loss = loss / n
            seconds = time.perf_counter() - window_start
            log.record(step, {"finetune/loss": last_loss, "finetune/task_loss": task_loss / n,
                              "finetune/balance_loss": balance / n, "optim/lr": lr,
                              "perf/samples_per_second": n * micro / seconds})
            if torch_dist.get_rank() == 0:
                print(f"[finetune step {step}/{max_steps}] loss {last_loss:.4f} (task {task_loss / n:.4f}, "
                      f"balance {balance / n:.4f}) lr {lr:.3g} | {n * micro / seconds:.1f} samples/s", flush=True)
            sums, window_start = [0.0, 0.0, 0.0, 0.0], time.perf_counter()
        if evaluate_now is not None and eval_every and step % eval_every == 0 and step != max_steps:
            evaluate_now(step)
            window_start = time.perf_counter()
    return last_loss


# --- the run ---------------------------------------------------------------------------------------
def resolve_max_steps(cfg: FinetuneConfig, schedule_steps: int | None, recipe) -> int:
    """--max-steps, else the schedule's length, else the recipe's; never past the schedule's end."""
    steps = cfg.max_steps or schedule_steps or recipe.steps
    if schedule_steps is not None and steps > schedule_steps:
        raise ConfigError(f"--max-steps {steps} runs past the schedule's total_num_steps {schedule_steps} in "
                          f"{cfg.deepspeed_config}; raise total_num_steps there or lower --max-steps.")
    return steps


def run(cfg: FinetuneConfig, task_run) -> dict[str, Any]:
    """Train and evaluate `cfg.seeds` times; write results.json; return the summary."""

    init_distributed()
    rank, world = torch_dist.get_rank(), torch_dist.get_world_size()
    tokenizer = load_tokenizer_for(cfg)
    recipe = task_run.recipe()
    ds_dict = load_ds_config(cfg.deepspeed_config)
    cuda = torch.cuda.is_available()
    settings = validate_ds_config(ds_dict, world_size=world, has_moe=False, cuda_available=cuda)
    max_steps = 0 if cfg.eval_only else resolve_max_steps(cfg, settings.total_num_steps, recipe)
    per_seed: list[dict[str, Any]] = []
    for seed in range(1, cfg.seeds + 1):
        seed_everything(seed)
        model, load_report = task_run.model(cfg, recipe, tokenizer.get_vocab_size())
        if model.cfg.is_moe:  # ZeRO 3 cannot shard DeepSpeed's MoE
            settings = validate_ds_config(ds_dict, world_size=world, has_moe=True, cuda_available=cuda)
        check_tokenizer_matches(tokenizer, model.cfg.vocab_size)
        # An explicit --max-seq-length above the model's positions is an error; the recipe's is capped.
        max_len = cfg.max_seq_length or min(recipe.max_seq_length, model.cfg.max_position_embeddings)
        check_max_length(max_len, model.cfg.max_position_embeddings)
        if seed == 1:
            data = task_run.prepare(cfg, tokenizer, max_len)
            if rank == 0:
                print(f"[finetune] {task_run.name}: {load_report}\n[finetune] {_settings_line(recipe, settings)}",
                      flush=True)
        seed_dir = cfg.output_dir / f"seed{seed}"
        engine, plan = build_engine(model, settings)
        expert_parallel = model.cfg.is_moe and model.ep_size > 1
        batching = Batching(settings.batch.micro_batch_size, max_len if expert_parallel else None)
        log = TrainingLog(seed_dir, enabled=rank == 0, tensorboard=cfg.tensorboard, progress_bar=False,
                          start_step=0, max_steps=max_steps)

        def evaluate(step: int) -> dict[str, dict[str, float]]:
            metrics = {split: task_run.evaluate(engine, split, features, batching, seed_dir)
                       for split, features in data.evals.items()}
            log.record(step, {f"eval/{split}/{name}": value for split, values in metrics.items()
                              for name, value in values.items() if isinstance(value, (int, float))})
            if rank == 0:
                print(f"[finetune] seed {seed} step {step}: {json.dumps(metrics)}", flush=True)
            return metrics

        try:
            log.event(0, f"optimizer: {plan.reason}")
            final_loss = None if cfg.eval_only else train(
                engine, data.train, batching, settings.batch.gradient_accumulation_steps, max_steps, seed, log,
                cfg.log_every, evaluate, cfg.eval_every)
            metrics = evaluate(max_steps)
            if cfg.predict_test:
                task_run.predict_test(cfg, engine, tokenizer, max_len, batching, seed_dir)
            if cfg.save_model:
                path = save_finetuned(engine.module, seed_dir / "model", tokenizer,
                                      {"task": task_run.name, "seed": seed, "steps": max_steps,
                                       "init": cfg.init or f"preset:{cfg.preset}"})
                log.event(max_steps, f"finetuned model saved: {path}")
        finally:
            log.close()
        per_seed.append({"seed": seed, "metrics": metrics, "final_train_loss": final_loss})
        del engine, model
    summary = {"task": task_run.name, "init": cfg.init or f"preset:{cfg.preset}", "steps": max_steps,
               "seeds": cfg.seeds, "primary_metric": task_run.primary_metric, "median": _median(per_seed),
               "per_seed": per_seed, "baseline": task_run.baseline(data), "load_report": load_report,
               "recipe": {**asdict(recipe), "model_overrides": model_overrides(cfg, recipe)},
               "deepspeed": {"config": str(cfg.deepspeed_config), "train_batch_size": settings.batch.train_batch_size,
                             "lr": _peak_lr(settings)},
               "max_seq_length": max_len}
    if rank == 0:
        atomic_write_json(cfg.output_dir / "results.json", summary)
        print(f"[finetune] {task_run.name} median over {cfg.seeds} seed(s): {json.dumps(summary['median'])}; "
              f"trivial baseline: {json.dumps(summary['baseline'])}; written to {cfg.output_dir / 'results.json'}",
              flush=True)
    return summary


def _peak_lr(settings) -> float | None:
    scheduler = settings.config.get("scheduler") or {}
    params = scheduler.get("params", {})
    return params.get("warmup_max_lr", settings.config.get("optimizer", {}).get("params", {}).get("lr"))


def _settings_line(recipe, settings) -> str:
    """The recipe next to what the DeepSpeed JSON says, so a mismatch with the paper is visible."""
    return (f"recipe ({recipe.source}): batch {recipe.batch_size}, lr {recipe.learning_rate:g}, {recipe.steps} "
            f"steps, warmup {recipe.warmup_steps}; DeepSpeed config: batch {settings.batch.train_batch_size}, "
            f"lr {_peak_lr(settings)}, schedule {settings.scheduler_type} over {settings.total_num_steps} steps")


def _median(per_seed: list[dict]) -> dict[str, dict[str, float]]:
    """Median over seeds of each metric of each split (the GLUE papers' report: median of 5 seeds)."""
    splits = per_seed[0]["metrics"]
    return {split: {name: statistics.median(run["metrics"][split][name] for run in per_seed)
                    for name in values if isinstance(values[name], (int, float))}
            for split, values in splits.items()}


def main(parser: argparse.ArgumentParser, task_run_factory, argv: list[str] | None = None) -> int:
    """Entrypoint body: parse, run, and turn user errors into one clear line (exit 2)."""
    args = vars(parser.parse_args(argv))
    args.pop("local_rank", None)
    try:
        cfg = FinetuneConfig(**args)
        run(cfg, task_run_factory(cfg))
    except WideNetError as err:
        print(f"{Path(sys.argv[0]).name}: error: {err}", file=sys.stderr, flush=True)
        return 2
    return 0
