"""One finetuning loop on DeepSpeed for every task; a task is data + head + metric (`GlueTaskRun`,
`SquadTaskRun`). The entrypoints `finetune/run_glue.py` and `finetune/run_squad.py` only parse flags.

Batch size, learning rate and schedule live in the DeepSpeed JSON (ds_configs/finetune_*.json carry the
paper's Table 7 recipes); the task recipe (`tasks/recipes.py`) gives the steps, capacity factor, balance
weight, dropout and max length, each overridable by a flag.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as torch_dist

from widenet_ds.config import ModelConfig
from widenet_ds.errors import ConfigError, DataError, WideNetError


# --- settings -------------------------------------------------------------------------------------
def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, help="folder/file in the original format, or `hf` for HF datasets")
    init = parser.add_mutually_exclusive_group(required=True)
    init.add_argument("--init", help="an exported folder, a DeepSpeed checkpoint (any ep_size) or a pretraining "
                                     "output folder (its latest checkpoint)")
    init.add_argument("--preset", help="random initialisation from a preset (baselines, tests)")
    parser.add_argument("--tokenizer", help="tokenizer.json / vocab.txt / prepared data folder (default: the "
                                            "one in --init)")
    parser.add_argument("--deepspeed_config", "--deepspeed-config", required=True,
                        help="DeepSpeed JSON: batch size, learning rate, schedule (ds_configs/finetune_*.json)")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--max-steps", type=int, help="default: the schedule's total_num_steps, else the recipe")
    parser.add_argument("--seeds", type=int, default=1, help="runs with seeds 1..N; the median is reported")
    parser.add_argument("--capacity-factor", type=float, help="MoE capacity C (default: the task recipe)")
    parser.add_argument("--balance-loss-weight", type=float, help="lambda (default: the task recipe)")
    parser.add_argument("--dropout", type=float, help="hidden and attention dropout (default: the recipe)")
    parser.add_argument("--max-seq-length", type=int, help="default: the recipe, capped by the model's positions")
    parser.add_argument("--moe-ep-size", type=int, default=1, help="expert-parallel size of the finetuning run")
    parser.add_argument("--max-train-examples", type=int, help="use only the first N training examples")
    parser.add_argument("--max-eval-examples", type=int, help="score only the first N evaluation examples")
    parser.add_argument("--eval-only", action="store_true", help="score --init without training")
    parser.add_argument("--local_rank", type=int, default=-1, help=argparse.SUPPRESS)


@dataclass
class Prepared:
    """A task's data for one run: what to train on, and what each evaluation split needs."""

    train: Any
    evals: dict[str, Any]


# --- distributed helpers --------------------------------------------------------------------------
def _gather_in_order(local: dict[int, np.ndarray], total: int) -> list[np.ndarray]:
    """Per-example outputs computed on every rank -> one list in dataset order, on every rank."""
    parts: list[dict[int, np.ndarray]] = [None] * torch_dist.get_world_size()  # type: ignore[list-item]
    torch_dist.all_gather_object(parts, local)
    merged: dict[int, np.ndarray] = {}
    for part in parts:
        merged.update(part)
    assert len(merged) == total, (len(merged), total)
    return [merged[i] for i in range(total)]


def predict(engine, dataset, micro_batch: int, outputs: tuple[str, ...]) -> dict[str, list[np.ndarray]]:
    """Run the model over `dataset`, each example exactly once (ranks take strided shards, no padding)."""
    rank, world = torch_dist.get_rank(), torch_dist.get_world_size()
    mine = list(range(rank, len(dataset), world))
    # Every rank runs the same number of forwards (the MoE all-to-all is collective): short shards
    # repeat their first example and drop the repeats' outputs.
    steps = -(-(-(-len(dataset) // world)) // micro_batch)
    results: dict[str, dict[int, np.ndarray]] = {name: {} for name in outputs}
    engine.eval()
    with torch.no_grad():
        for step in range(steps):
            chunk = mine[step * micro_batch:(step + 1) * micro_batch]
            batch = dataset.collate([dataset[i] for i in (chunk or [0])])
            out = engine(**{k: batch[k].to(engine.device) for k in ("input_ids", "token_type_ids", "attention_mask")})
            for name in outputs:
                values = getattr(out, name).float().cpu().numpy()
                results[name].update((index, values[row]) for row, index in enumerate(chunk))
    engine.train()
    return {name: _gather_in_order(values, len(dataset)) for name, values in results.items()}


def train(engine, dataset, micro_batch: int, max_steps: int, seed: int, label_keys: tuple[str, ...],
          log_every: int = 50) -> list[float]:
    """`max_steps` optimizer steps over shuffled epochs of `dataset`; returns the per-step losses of rank 0."""
    sampler = torch.utils.data.DistributedSampler(dataset, shuffle=True, seed=seed, drop_last=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=micro_batch, sampler=sampler,
                                         collate_fn=dataset.collate, drop_last=True)
    if len(loader) == 0:
        raise DataError(f"{len(dataset)} training examples cannot fill one micro-batch of {micro_batch} per rank; "
                        f"use more data or a smaller train_micro_batch_size_per_gpu.")
    engine.train()
    losses, epoch, step = [], 0, 0
    while step < max_steps:
        sampler.set_epoch(epoch)
        for batch in loader:
            inputs = {k: v.to(engine.device) for k, v in batch.items() if k != "feature_index"}
            out = engine(**inputs)
            engine.backward(out.loss)
            engine.step()
            if engine.is_gradient_accumulation_boundary():
                step += 1
                losses.append(out.loss.item())
                if torch_dist.get_rank() == 0 and (step % log_every == 0 or step == max_steps):
                    print(f"[finetune step {step}/{max_steps}] loss {out.loss.item():.4f} "
                          f"lr {engine.get_lr()[0]:.3g}", flush=True)
                if step >= max_steps:
                    break
        epoch += 1
    return losses


# --- the run --------------------------------------------------------------------------------------
def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _load_tokenizer(args):
    from widenet_ds.data.tokenizer import load_tokenizer

    source = args.tokenizer
    if source is None and args.init and (Path(args.init) / "tokenizer.json").is_file():
        source = Path(args.init) / "tokenizer.json"
    if source is None:
        raise ConfigError("no tokenizer given: pass --tokenizer (the tokenizer.json/vocab.txt or the prepared data "
                          "folder the model was pretrained with); exported folders carry theirs.")
    return load_tokenizer(source)


def _overrides(args, recipe) -> dict[str, Any]:
    dropout = args.dropout if args.dropout is not None else recipe.dropout
    return {"hidden_dropout": dropout, "attention_dropout": dropout,
            "classifier_dropout": recipe.classifier_dropout,
            "moe": {"capacity_factor": args.capacity_factor or recipe.capacity_factor,
                    "balance_loss_weight": (args.balance_loss_weight if args.balance_loss_weight is not None
                                            else recipe.balance_weight),
                    "ep_size": args.moe_ep_size}}


def build_model(args, cls, recipe, vocab_size: int, **model_kwargs):
    """The task model from --init (weights + report) or --preset (random), with the recipe's overrides."""
    overrides = _overrides(args, recipe)
    if args.init:
        model, report = cls.from_pretrained(args.init, model_overrides=overrides, **model_kwargs)
        return model, report.summary()
    base = ModelConfig.from_preset(args.preset, vocab_size=vocab_size).to_dict()
    cfg = ModelConfig.from_dict({**base, **{k: v for k, v in overrides.items() if k != "moe"},
                                 "moe": {**base["moe"], **overrides["moe"]}})
    return cls(cfg, **model_kwargs), f"random initialisation from preset {args.preset}"


def run(args, task_run) -> dict[str, Any]:
    """Train and evaluate `args.seeds` times; write results.json; return the summary."""
    from widenet_ds.distributed import init_distributed
    from widenet_ds.ds_config import load_ds_config, validate_ds_config
    from widenet_ds.engine import build_engine
    from widenet_ds.tasks.features import check_max_length, check_tokenizer_matches

    init_distributed()
    rank, world = torch_dist.get_rank(), torch_dist.get_world_size()
    out_dir = Path(args.output_dir)
    tokenizer = _load_tokenizer(args)
    recipe = task_run.recipe(args)
    ds_dict = load_ds_config(args.deepspeed_config)
    settings = validate_ds_config(ds_dict, world_size=world, has_moe=True, cuda_available=torch.cuda.is_available())
    max_steps = args.max_steps or settings.total_num_steps or recipe.steps
    per_seed: list[dict[str, Any]] = []
    for seed in range(1, args.seeds + 1):
        _seed_everything(seed)
        model, load_report = task_run.model(args, recipe, tokenizer.get_vocab_size())
        cfg = model.cfg
        check_tokenizer_matches(tokenizer, cfg.vocab_size)
        # An explicit --max-seq-length above the model's positions is an error; the recipe's is capped.
        max_len = args.max_seq_length or min(recipe.max_seq_length, cfg.max_position_embeddings)
        check_max_length(max_len, cfg.max_position_embeddings)
        if seed == 1:
            data = task_run.prepare(args, tokenizer, max_len)
            if rank == 0:
                print(f"[finetune] {load_report}", flush=True)
        engine, plan = build_engine(model, settings)
        micro = settings.batch.micro_batch_size
        losses = [] if args.eval_only else train(engine, data.train, micro, max_steps, seed, task_run.label_keys)
        metrics = {split: task_run.evaluate(engine, split, features, micro, out_dir / f"seed{seed}")
                   for split, features in data.evals.items()}
        per_seed.append({"seed": seed, "metrics": metrics, "final_loss": losses[-1] if losses else None})
        if rank == 0:
            print(f"[finetune] seed {seed}: {json.dumps(metrics)}", flush=True)
        del engine, model
    summary = {"task": task_run.name, "init": args.init or f"preset:{args.preset}", "steps": max_steps,
               "seeds": args.seeds, "per_seed": per_seed, "median": _median(per_seed),
               "baseline": task_run.baseline(data), "load_report": load_report, "recipe": recipe.source}
    if rank == 0:
        from widenet_ds.tasks._files import atomic_write_json
        atomic_write_json(out_dir / "results.json", summary)
        print(f"[finetune] {task_run.name} median over {args.seeds} seed(s): {json.dumps(summary['median'])}; "
              f"trivial baseline: {json.dumps(summary['baseline'])}", flush=True)
    return summary


def _median(per_seed: list[dict]) -> dict[str, dict[str, float]]:
    splits = per_seed[0]["metrics"]
    return {split: {name: statistics.median(run["metrics"][split][name] for run in per_seed)
                    for name in values if isinstance(values[name], (int, float))}
            for split, values in splits.items()}


def main(parser: argparse.ArgumentParser, task_run_factory, argv: list[str] | None = None) -> int:
    """Entrypoint body: parse, run, and turn user errors into one clear line (exit 2)."""
    args = parser.parse_args(argv)
    try:
        run(args, task_run_factory(args))
    except WideNetError as err:
        print(f"{Path(sys.argv[0]).name}: error: {err}", file=sys.stderr, flush=True)
        return 2
    return 0
