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
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
import torch.distributed as torch_dist

from widenet_ds.errors import ConfigError, DataError, WideNetError
from widenet_ds.finetune_model import load_tokenizer_for, model_overrides, save_finetuned

HF_DATA = "hf"


# --- settings -------------------------------------------------------------------------------------
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
    moe_ep_size: int = 1
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
        for name in ("max_steps", "seeds", "moe_ep_size", "max_train_examples", "max_eval_examples", "log_every",
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
    parser.add_argument("--moe-ep-size", type=int, default=1, help="expert-parallel size of the finetuning run")
    parser.add_argument("--max-train-examples", type=int, help="use only the first N training examples")
    parser.add_argument("--max-eval-examples", type=int, help="score only the first N evaluation examples")
    parser.add_argument("--eval-every", type=int, default=0, help="also evaluate every N steps (0: at the end only)")
    parser.add_argument("--log-every", type=int, default=10, help="steps between loss records")
    parser.add_argument("--eval-only", action="store_true",
                        help="score --init (e.g. a folder written by --save-model) without training")
    parser.add_argument("--save-model", action="store_true",
                        help="write each seed's finetuned model as a checkpoint folder seed<N>/model (with the "
                             "tokenizer), loadable by --init / from_pretrained")
    parser.add_argument("--no-tensorboard", dest="tensorboard", action="store_false", help="metrics.jsonl only")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)


@dataclass
class Prepared:
    """A task's data for one run: what to train on, and what each evaluation split needs."""

    train: Any
    evals: dict[str, Any]


# --- distributed evaluation -----------------------------------------------------------------------
def _gather_in_order(local: dict[int, np.ndarray], total: int) -> list[np.ndarray]:
    """Per-example outputs computed on every rank -> one list in dataset order, on every rank."""
    parts: list[dict[int, np.ndarray]] = [None] * torch_dist.get_world_size()  # type: ignore[list-item]
    torch_dist.all_gather_object(parts, local)
    merged: dict[int, np.ndarray] = {}
    for part in parts:
        merged.update(part)
    assert len(merged) == total, (len(merged), total)
    return [merged[i] for i in range(total)]


@dataclass(frozen=True)
class Batching:
    """How micro-batches are shaped. Expert parallelism (ep_size > 1) exchanges capacity buffers sized by
    each rank's token count in one all-to-all, so every rank must then feed the same [micro_batch, pad_to]
    shape; otherwise batches are padded only to their longest member."""

    micro_batch: int
    pad_to: int | None = None

    def shape(self, batch: dict[str, torch.Tensor], pad_id: int) -> dict[str, torch.Tensor]:
        if self.pad_to is None:
            return batch
        extra = self.pad_to - batch["input_ids"].shape[1]
        assert extra >= 0, (self.pad_to, batch["input_ids"].shape)
        fill = {"input_ids": pad_id, "token_type_ids": 0, "attention_mask": 0}
        return {k: torch.nn.functional.pad(v, (0, extra), value=fill[k]) if k in fill else v for k, v in batch.items()}


def predict(engine, dataset, batching: Batching, outputs: tuple[str, ...]) -> dict[str, list[np.ndarray]]:
    """Run the model over `dataset`, each example exactly once (ranks take strided shards)."""
    rank, world = torch_dist.get_rank(), torch_dist.get_world_size()
    micro_batch = batching.micro_batch
    mine = list(range(rank, len(dataset), world))
    # Every rank runs the same number of forwards (the MoE all-to-all is collective): a short chunk is
    # filled up with example 0, whose outputs there are dropped, so nothing is scored twice.
    steps = -(-(-(-len(dataset) // world)) // micro_batch)
    results: dict[str, dict[int, np.ndarray]] = {name: {} for name in outputs}
    engine.eval()
    with torch.no_grad():
        for step in range(steps):
            chunk = mine[step * micro_batch:(step + 1) * micro_batch]
            rows = chunk + [0] * ((micro_batch if batching.pad_to else 1) - len(chunk))
            batch = batching.shape(dataset.collate([dataset[i] for i in rows]), dataset.pad_id)
            out = engine(**{k: batch[k].to(engine.device) for k in ("input_ids", "token_type_ids", "attention_mask")})
            for name in outputs:
                values = getattr(out, name).float().cpu().numpy()
                results[name].update((index, values[row]) for row, index in enumerate(chunk))
    engine.train()
    return {name: _gather_in_order(values, len(dataset)) for name, values in results.items()}


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
def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_max_steps(cfg: FinetuneConfig, schedule_steps: int | None, recipe) -> int:
    """--max-steps, else the schedule's length, else the recipe's; never past the schedule's end."""
    steps = cfg.max_steps or schedule_steps or recipe.steps
    if schedule_steps is not None and steps > schedule_steps:
        raise ConfigError(f"--max-steps {steps} runs past the schedule's total_num_steps {schedule_steps} in "
                          f"{cfg.deepspeed_config}; raise total_num_steps there or lower --max-steps.")
    return steps


def run(cfg: FinetuneConfig, task_run) -> dict[str, Any]:
    """Train and evaluate `cfg.seeds` times; write results.json; return the summary."""
    from widenet_ds.distributed import init_distributed
    from widenet_ds.ds_config import load_ds_config, validate_ds_config
    from widenet_ds.engine import build_engine
    from widenet_ds.tasks.features import check_max_length, check_tokenizer_matches
    from widenet_ds.training_log import TrainingLog

    init_distributed()
    rank, world = torch_dist.get_rank(), torch_dist.get_world_size()
    if world % cfg.moe_ep_size:
        raise ConfigError(f"--moe-ep-size {cfg.moe_ep_size} does not divide the {world} ranks; pick a divisor.")
    tokenizer = load_tokenizer_for(cfg)
    recipe = task_run.recipe()
    ds_dict = load_ds_config(cfg.deepspeed_config)
    cuda = torch.cuda.is_available()
    settings = validate_ds_config(ds_dict, world_size=world, has_moe=False, cuda_available=cuda)
    max_steps = 0 if cfg.eval_only else resolve_max_steps(cfg, settings.total_num_steps, recipe)
    per_seed: list[dict[str, Any]] = []
    for seed in range(1, cfg.seeds + 1):
        _seed_everything(seed)
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
        expert_parallel = model.cfg.is_moe and model.cfg.moe.ep_size > 1
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
        from widenet_ds.tasks._files import atomic_write_json
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
