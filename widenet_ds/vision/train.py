"""Image classification on the pretraining's DeepSpeed engine: checks, then the loop.

Mirrors widenet_ds/pretrain.py: `run(cfg)` resolves and checks the data, the model config, the
DeepSpeed JSON, the optimizer choice, the output folder and the checkpoint to resume before building
anything; then the same engine (`build_engine`: LAMB/AdamW/SGD from the JSON, ZeRO 0-2, bf16/fp16),
the same atomic checkpoints with exact resume (`CheckpointManager`), the same SIGTERM/SIGUSR1 stop
(`StopRequest`) and the same TensorBoard + metrics.jsonl log (`TrainingLog`). Expert parallelism is
`--ep-size`.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import torch
import torch.distributed as torch_dist

from widenet_ds.checkpoint.format import global_key_map
from widenet_ds.checkpoint.load import match_weights, read_checkpoint
from widenet_ds.checkpoint.training import CheckpointManager, TrainingState, read_meta
from widenet_ds.runtime.distributed import check_ep_size, init_distributed, seed_everything
from widenet_ds.runtime.ds_config import DeepSpeedSettings, load_ds_config, validate_ds_config
from widenet_ds.runtime.engine import build_engine, expert_grad_norm_stage0, plan_optimizer
from widenet_ds.errors import CheckpointError, ConfigError, DataError, raise_config_problems
from widenet_ds.model.config import parse_overrides
from widenet_ds.training.pretrain import find_resume_point, resolve_max_steps
from widenet_ds.training.pretrain_config import LATEST, OptimizerChoice
from widenet_ds.training.log import TrainingLog, WindowSums, memory_mib
from widenet_ds.training.branch_schedule import BranchSchedule, add_branch_arguments, plan_branch_schedule
from widenet_ds.training.preemption import SavePoints, StopRequest
from widenet_ds.vision.augment import AugmentConfig, BatchAugmenter, normalize
from widenet_ds.vision.config import VisionConfig
from widenet_ds.vision.datasets import DATASETS, ImageSource, load_dataset
from widenet_ds.vision.loader import ImageLoader, default_workers
from widenet_ds.vision.model import ViTWideNetForImageClassification, count_trainable_parameters

MODEL_CONFIG_FILE = "vision_config.json"
RESULTS_FILE = "results.json"


# --- settings ---------------------------------------------------------------------------------------
@dataclass
class ClassifyConfig:
    """Everything an image-classification run needs besides the DeepSpeed JSON and the model config.

    `max_steps` counts optimizer steps (default: `epochs` x steps per epoch, else the schedule's
    total_num_steps). `resume` as in pretraining: None, "latest" or a checkpoint folder.
    """

    model_config: str
    deepspeed_config: Path
    output_dir: Path
    dataset: str = "fashion-mnist"
    data_dir: Path | None = None
    overrides: list[str] = field(default_factory=list)
    max_steps: int | None = None
    epochs: float | None = None
    ep_size: int = 1
    activation_checkpointing: bool = False
    log_interval: int = 10
    save_interval: int = 1000
    keep_last: int = 3
    eval_interval: int = 1000  # 0: evaluate only at the end
    max_eval_examples: int | None = None
    seed: int = 1234
    workers: int | None = None  # None: default_workers(world)
    optimizer: OptimizerChoice = "auto"
    resume: str | None = None
    init_from: Path | None = None  # a portable vision folder: body weights (a new head when classes differ)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    branch_schedule: str = "joint"             # ParaFormer layouts: joint | prefix | staged
    prefix_cycle_batches: int | None = None    # prefix: batches per phase (default: one epoch)
    stage_steps: list[int] = field(default_factory=list)  # staged: where branches 2..N join
    tensorboard: bool = True
    progress_bar: bool = True

    def __post_init__(self) -> None:
        self.deepspeed_config = Path(self.deepspeed_config)
        self.output_dir = Path(self.output_dir)
        self.data_dir = Path(self.data_dir) if self.data_dir is not None else None
        self.init_from = Path(self.init_from) if self.init_from is not None else None
        problems = []  # every problem at once, not one per attempt
        if self.dataset not in DATASETS:
            problems.append(f"--dataset {self.dataset!r} is not one of {list(DATASETS)}.")
        if self.max_steps is not None and self.max_steps <= 0:
            problems.append(f"--max-steps must be positive, got {self.max_steps}.")
        if self.epochs is not None and (self.epochs <= 0 or self.max_steps is not None):
            problems.append("--epochs must be positive and cannot be combined with --max-steps; pass one of them.")
        for name in ("log_interval", "save_interval", "keep_last", "ep_size"):
            if getattr(self, name) <= 0:
                problems.append(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}.")
        if self.eval_interval < 0:
            problems.append(f"--eval-interval must be >= 0 (0: only at the end), got {self.eval_interval}.")
        if self.optimizer not in get_args(OptimizerChoice):
            problems.append(f"--optimizer {self.optimizer!r} is not one of {list(get_args(OptimizerChoice))}.")
        if not self.deepspeed_config.is_file():
            problems.append(f"DeepSpeed config {self.deepspeed_config} does not exist; pass --deepspeed_config "
                            f"with a JSON file, e.g. ds_configs/vision_cpu_small.json (see ds_configs/README.md).")
        if self.output_dir.exists() and not self.output_dir.is_dir():
            problems.append(f"--output-dir {self.output_dir} exists and is not a directory.")
        if self.init_from is not None and self.resume is not None:
            problems.append("--resume continues a run and --init-from starts a new one (finetuning) from a "
                            "folder's weights; pass only one of them.")
        raise_config_problems(problems, "the image classification settings")

    @property
    def checkpoint_dir(self) -> Path:
        return self.output_dir / "checkpoints"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="run_classify.py",
        description="ViT-WideNet / ViT / ViT-MoE image classification on DeepSpeed. Start it with the `deepspeed` "
                    "launcher (or launcher.sh, srun, mpiexec). Batch sizes, learning rate, schedule, precision and "
                    "ZeRO stage come from the DeepSpeed JSON only. See docs/vision.md.")
    parser.add_argument("--model-config", required=True,
                        help="a vision preset (widenet-vit-b16, vit-b16, vit-moe-b16, widenet-vit-tiny, ...) or a JSON")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a model field (e.g. num_classes=10, moe.top_k=1); repeatable")
    parser.add_argument("--deepspeed_config", "--deepspeed-config", dest="deepspeed_config", required=True, type=Path)
    parser.add_argument("--dataset", choices=DATASETS, default="fashion-mnist",
                        help="fashion-mnist (default; Debian's dataset-fashion-mnist), digits (sklearn, 8x8), "
                             "cifar10/cifar100 (torchvision layout), imagenet-folder (ImageFolder), hf (datasets)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="the dataset's folder (fashion-mnist default: /usr/share/datasets/fashion-mnist)")
    parser.add_argument("--output-dir", required=True, type=Path)
    parser.add_argument("--max-steps", type=int, default=None, help="optimizer steps (default: --epochs, else the "
                                                                    "schedule's total_num_steps)")
    parser.add_argument("--epochs", type=float, default=None, help="passes over the train split instead of --max-steps")
    parser.add_argument("--ep-size", type=int, default=1, help="expert parallelism: ranks holding one copy of the experts")
    parser.add_argument("--activation-checkpointing", action="store_true", help="recompute each block in backward")
    parser.add_argument("--log-interval", type=int, default=ClassifyConfig.log_interval)
    parser.add_argument("--save-interval", type=int, default=ClassifyConfig.save_interval)
    parser.add_argument("--keep-last", type=int, default=ClassifyConfig.keep_last)
    parser.add_argument("--eval-interval", type=int, default=ClassifyConfig.eval_interval,
                        help="steps between test-split evaluations (0: only at the end)")
    parser.add_argument("--max-eval-examples", type=int, default=None, help="evaluate on the first N test images only")
    parser.add_argument("--seed", type=int, default=ClassifyConfig.seed)
    parser.add_argument("--workers", type=int, default=None, help="DataLoader workers per rank (default: the rank's "
                                                                  "share of the cores, at most 8)")
    parser.add_argument("--optimizer", choices=get_args(OptimizerChoice), default="auto")
    parser.add_argument("--resume", nargs="?", const=LATEST, default=None, metavar="CHECKPOINT")
    parser.add_argument("--init-from", type=Path, default=None, metavar="FOLDER",
                        help="finetune from an image checkpoint folder (widenet-ds convert to-folder) or training "
                             "checkpoint: every weight but a head of another shape (classifier, pre-logits) is loaded")
    aug = parser.add_argument_group("augmentation (the authors' ImageNet recipe: --randaugment 2,15 --inception-crop "
                                    "--flip --mixup-alpha 0.5 --label-smoothing 0.1)")
    aug.add_argument("--randaugment", default="0,15", metavar="OPS,MAGNITUDE", help="kornia RandAugment (0 ops: off)")
    aug.add_argument("--inception-crop", action="store_true", help="random resized crop, area 5%%..100%%")
    aug.add_argument("--crop-min-area", type=float, default=0.05)
    aug.add_argument("--flip", action="store_true", help="random horizontal flip")
    aug.add_argument("--mixup-alpha", type=float, default=0.0)
    aug.add_argument("--cutmix-alpha", type=float, default=0.0)
    aug.add_argument("--label-smoothing", type=float, default=0.0)
    add_branch_arguments(parser)
    parser.add_argument("--no-tensorboard", dest="tensorboard", action="store_false")
    parser.add_argument("--no-progress-bar", dest="progress_bar", action="store_false")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return parser



def parse_args(argv: list[str] | None = None) -> ClassifyConfig:
    args = vars(build_parser().parse_args(argv))
    args.pop("local_rank")
    ops, _, magnitude = args.pop("randaugment").partition(",")
    try:
        randaugment = (int(ops), int(magnitude or 15))
    except ValueError:
        raise ConfigError(f"--randaugment {ops},{magnitude}: expected two integers OPS,MAGNITUDE, e.g. 2,15.") from None
    args["augment"] = AugmentConfig(
        randaugment_ops=randaugment[0], randaugment_magnitude=randaugment[1],
        inception_crop=args.pop("inception_crop"), crop_min_area=args.pop("crop_min_area"), flip=args.pop("flip"),
        mixup_alpha=args.pop("mixup_alpha"), cutmix_alpha=args.pop("cutmix_alpha"),
        label_smoothing=args.pop("label_smoothing"))
    return ClassifyConfig(**args)


# --- checks -----------------------------------------------------------------------------------------
@dataclass
class RunPlan:
    model_config: VisionConfig
    ds: DeepSpeedSettings
    splits: dict[str, ImageSource]
    max_steps: int
    resume_from: Path | None
    schedule: BranchSchedule
    init_state: dict[str, torch.Tensor] | None = None  # global keys; the head left out when it does not fit


def init_weights_for(model: VisionConfig, folder: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's weights that fit `model` (global keys): a head of another shape (new classes, no
    pre-logits) is left to its fresh initialisation, as the authors' finetuning drops it; any other mismatch
    is an error (the shared loader's rule, widenet_ds/checkpoint/load.py)."""
    return match_weights(read_checkpoint(folder), "ViTWideNetForImageClassification", model,
                         f"--init-from {folder}").load


def check_data_fits_model(splits: dict[str, ImageSource], model: VisionConfig, dataset: str) -> None:
    for source in splits.values():
        if source.num_classes > model.num_classes:
            raise DataError(f"{source.name} has {source.num_classes} classes, the model's head has "
                            f"{model.num_classes}; set --set num_classes={source.num_classes}.")
        if source.channels is not None and source.channels != model.num_channels:
            raise DataError(f"{source.name} has {source.channels}-channel images, the model expects "
                            f"{model.num_channels}; set --set num_channels={source.channels} (a {dataset} preset: "
                            f"widenet-vit-tiny / vit-tiny take 1 channel).")


def plan_run(cfg: ClassifyConfig, world_size: int) -> RunPlan:
    model = VisionConfig.load(cfg.model_config, **parse_overrides(cfg.overrides))
    check_ep_size(cfg.ep_size, world_size, model.moe.num_experts if model.is_moe else None)
    if model.is_moe and model.moe.dispatch == "dropless" and cfg.ep_size != 1:
        raise ConfigError(f"moe.dispatch = 'dropless' runs with --ep-size 1 only, but --ep-size is {cfg.ep_size}; use "
                          f"--ep-size 1 or --set moe.dispatch=deepspeed.")
    cuda = torch.cuda.is_available()
    ds = validate_ds_config(load_ds_config(cfg.deepspeed_config), world_size=world_size, has_moe=model.is_moe,
                            cuda_available=cuda)
    plan_optimizer(ds, cfg.optimizer, cuda)
    splits = load_dataset(cfg.dataset, cfg.data_dir)
    if "test" not in splits:
        raise DataError(f"{cfg.dataset} at {cfg.data_dir} has no test/val split to evaluate on; add it "
                        f"(ImageFolder: val/<class>/...).")
    check_data_fits_model(splits, model, cfg.dataset)
    batches_per_epoch = max(1, len(splits["train"]) // ds.batch.train_batch_size)
    schedule = plan_branch_schedule(cfg.branch_schedule, model.num_branches, batches_per_epoch, ds,
                                    cfg.prefix_cycle_batches, cfg.stage_steps)
    requested = cfg.max_steps
    if cfg.epochs is not None:
        requested = max(1, int(cfg.epochs * batches_per_epoch))
    max_steps = schedule.end_step(resolve_max_steps(requested, ds.total_num_steps))
    resume_from = find_resume_point(cfg, model.to_dict())
    if resume_from is not None:
        saved = read_meta(resume_from)
        if saved.get("dataset") != cfg.dataset:
            raise CheckpointError(f"checkpoint {resume_from} was trained on {saved.get('dataset')}; resume with "
                                  f"--dataset {saved.get('dataset')}.")
        if saved.get("branch_schedule", "joint") != schedule.kind:
            raise CheckpointError(f"checkpoint {resume_from} was trained with --branch-schedule "
                                  f"{saved.get('branch_schedule', 'joint')}; resume with the same schedule.")
    init_state = init_weights_for(model, cfg.init_from) if cfg.init_from is not None else None
    return RunPlan(model, ds, splits, max_steps, resume_from, schedule, init_state)



# --- metrics ----------------------------------------------------------------------------------------
class ClassifyMetrics(WindowSums):
    """Image classification's window sums (accuracy weighted: mixed-up targets count by their weight)."""

    SUMS = ("loss", "task_loss", "balance_loss", "correct", "count", "micro_batches")

    @torch.no_grad()
    def add(self, output, labels: torch.Tensor, weight: torch.Tensor) -> None:
        correct = ((output.logits.argmax(-1) == labels).float() * weight).sum()
        self._add({"loss": output.loss, "task_loss": output.task_loss, "balance_loss": output.balance_loss,
                   "correct": correct, "count": weight.sum(), "micro_batches": 1}, output.routing)

    def reduce(self, prefix: str) -> tuple[dict[str, float], float]:
        """Collective. The scalars (named `prefix/...`) and the examples counted over all ranks."""
        sums, routing = self._reduce(prefix)
        n = max(sums["micro_batches"], 1.0)
        scalars = {f"{prefix}/{name}": sums[name] / n for name in ("loss", "task_loss", "balance_loss")}
        scalars[f"{prefix}/accuracy"] = sums["correct"] / max(sums["count"], 1.0)
        return {**scalars, **routing}, sums["count"]


# --- the loop ---------------------------------------------------------------------------------------
def _input_dtype(engine) -> torch.dtype:
    return next(engine.module.parameters()).dtype


@torch.no_grad()
def evaluate(engine, loader: ImageLoader, metrics: ClassifyMetrics) -> dict[str, float]:
    """Accuracy and loss on the whole test split (padding rows weigh 0)."""
    engine.eval()
    dtype = _input_dtype(engine)
    for batch in loader:
        pixels = normalize(batch["pixels"].to(engine.device)).to(dtype)
        labels, weight = batch["labels"].to(engine.device), batch["weight"].to(engine.device)
        metrics.add(engine(pixels, labels, sample_weight=weight), labels, weight)
    engine.train()
    scalars, _ = metrics.reduce("test")
    return scalars


@torch.no_grad()
def evaluate_branch_prefixes(engine, loader: ImageLoader) -> dict[str, float]:
    """ParaFormer's compression curve: test accuracy of the first k branches, k = 1..N, no retraining."""
    engine.eval()
    dtype = _input_dtype(engine)
    branches = engine.module.cfg.num_branches
    metrics = [ClassifyMetrics([], 0) for _ in range(branches)]
    for batch in loader:
        pixels = normalize(batch["pixels"].to(engine.device)).to(dtype)
        labels, weight = batch["labels"].to(engine.device), batch["weight"].to(engine.device)
        for k in range(1, branches + 1):
            metrics[k - 1].add(engine(pixels, labels, sample_weight=weight, branches=k), labels, weight)
    engine.train()
    return {str(k + 1): m.reduce("test")[0]["test/accuracy"] for k, m in enumerate(metrics)}


def _limit(source: ImageSource, count: int | None) -> ImageSource:
    if count is None or count >= len(source):
        return source
    return ImageSource(f"{source.name} (first {count})", source.labels[:count], source.num_classes, source.channels,
                       source.load, source.class_names)


def run(cfg: ClassifyConfig) -> int:
    init_distributed()
    rank, world = torch_dist.get_rank(), torch_dist.get_world_size()
    plan = plan_run(cfg, world)
    model_cfg = plan.model_config
    micro = plan.ds.batch.micro_batch_size
    workers = cfg.workers if cfg.workers is not None else default_workers(world)
    train_loader = ImageLoader(plan.splits["train"], model_cfg.image_size, model_cfg.num_channels, micro, rank, world,
                               cfg.seed, train=True, workers=workers)
    test_loader = ImageLoader(_limit(plan.splits["test"], cfg.max_eval_examples), model_cfg.image_size,
                              model_cfg.num_channels, micro, rank, world, cfg.seed, train=False, workers=workers)
    augmenter = BatchAugmenter(cfg.augment, model_cfg.image_size, model_cfg.num_classes)

    seed_everything(cfg.seed)  # the same initial weights on every rank
    model = ViTWideNetForImageClassification(model_cfg, cfg.ep_size, cfg.activation_checkpointing)
    if plan.init_state is not None:
        local = {k: plan.init_state[g] for k, g in global_key_map(model).items() if g in plan.init_state}
        model.load_state_dict(local, strict=False)
    engine, optimizer_plan = build_engine(model, plan.ds, cfg.optimizer)
    seed_everything(cfg.seed + 1 + rank)  # per-rank streams: augmentation, gate noise, dropout

    checkpoints = CheckpointManager(cfg.checkpoint_dir, cfg.keep_last, rank, world)
    state = TrainingState()
    if plan.resume_from is not None:
        state = checkpoints.load(engine, plan.resume_from, train_loader)
    if rank == 0:
        cfg.output_dir.mkdir(parents=True, exist_ok=True)
        model_cfg.to_json(cfg.output_dir / MODEL_CONFIG_FILE)
    meta = {"model_config": model_cfg.to_dict(), "deepspeed_config": plan.ds.config, "ep_size": cfg.ep_size,
            "dataset": cfg.dataset, "architecture": "ViTWideNetForImageClassification",
            "branch_schedule": plan.schedule.kind}
    log = TrainingLog(cfg.output_dir, enabled=rank == 0, tensorboard=cfg.tensorboard, progress_bar=cfg.progress_bar,
                      start_step=state.step, max_steps=plan.max_steps)
    log.event(state.step, f"model {cfg.model_config}: {count_trainable_parameters(model):,} trainable parameters "
                          f"(ep_size {cfg.ep_size}: this rank's share); train {len(plan.splits['train'])} / test "
                          f"{len(test_loader.dataset)} images of {cfg.dataset}; {workers} loader workers per rank")
    log.event(state.step, f"optimizer: {optimizer_plan.reason}")
    if model_cfg.num_branches > 1:
        log.event(state.step, f"{model_cfg.num_branches} branches x {model_cfg.layers_per_branch} layers; "
                              f"{plan.schedule.describe()}; the run ends at step {plan.max_steps}")
    if plan.resume_from is not None:
        log.event(state.step, f"resumed from {plan.resume_from}")
    elif plan.init_state is not None:
        fresh = sorted({k.split(".")[0] for k in model.state_dict() if k not in global_key_map(model)
                        or global_key_map(model)[k] not in plan.init_state})
        log.event(state.step, f"weights from {cfg.init_from}" + (f"; new {', '.join(fresh)}" if fresh else ""))
    stop = StopRequest()
    stop.install()
    try:
        finished = _train(cfg, plan, engine, train_loader, test_loader, augmenter, checkpoints, state, log, stop, meta)
        if model_cfg.num_branches > 1:
            model.encoder.set_trainable_branches(model_cfg.num_branches)
        if finished:
            test = evaluate(engine, test_loader, ClassifyMetrics([], 0))
            log.record(state.step, test)
            by_branches = evaluate_branch_prefixes(engine, test_loader) if model_cfg.num_branches > 1 else None
            if rank == 0:
                results = {"step": state.step, "dataset": cfg.dataset, "model_config": cfg.model_config,
                           "ep_size": cfg.ep_size, "world_size": world,
                           "parameters": count_trainable_parameters(model) if cfg.ep_size == 1 else None, **test}
                if by_branches is not None:
                    results["branch_schedule"] = plan.schedule.kind
                    results["accuracy_by_branches"] = by_branches
                (cfg.output_dir / RESULTS_FILE).write_text(json.dumps(results, indent=2) + "\n")
                log.event(state.step, f"test accuracy {test['test/accuracy']:.4f} (loss {test['test/task_loss']:.4f})")
    finally:
        stop.uninstall()
        log.close()
    return 0


def _train(cfg: ClassifyConfig, plan: RunPlan, engine, train_loader: ImageLoader, test_loader: ImageLoader,
           augmenter: BatchAugmenter, checkpoints: CheckpointManager, state: TrainingState, log: TrainingLog,
           stop: StopRequest, meta: dict[str, Any]) -> bool:
    """The loop over batches, each one optimizer step (or, with the prefix schedule, one per nested prefix
    of branches); True when max_steps was reached, False when stopped by a signal."""
    model_cfg = plan.model_config
    experts = model_cfg.moe.num_experts if model_cfg.is_moe else 0
    train_metrics = ClassifyMetrics(model_cfg.routing_blocks, experts)
    own_grad_norm = plan.ds.zero_stage == 0 and plan.ds.precision == "fp32"
    accumulation = plan.ds.batch.gradient_accumulation_steps
    dtype = _input_dtype(engine)
    branched = model_cfg.num_branches > 1
    encoder = engine.module.encoder
    batches = iter(train_loader)
    batch_index = plan.schedule.batch_at_step(state.step)
    trainable = model_cfg.num_branches
    window_seconds = 0.0
    save_points = SavePoints(checkpoints, stop, log, cfg.save_interval, plan.max_steps,
                             saved_step=state.step if plan.resume_from is not None else None)
    engine.train()
    while state.step < plan.max_steps:
        first_step = state.step
        micro_batches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # drawn once, reused per prefix
        for active in plan.schedule.branch_counts(batch_index, state.step):
            if branched and active != trainable:
                encoder.set_trainable_branches(active)
                trainable = active
            lr = engine.get_lr()[0]
            log_now = (state.step + 1) % cfg.log_interval == 0 or state.step + 1 == plan.max_steps
            grad_norm = None
            step_start = time.perf_counter()
            for micro_step in range(accumulation):
                if micro_step == len(micro_batches):
                    batch = next(batches)
                    labels = batch["labels"].to(engine.device)
                    pixels, targets = augmenter(batch["pixels"].to(engine.device), labels)
                    micro_batches.append((pixels.to(dtype), targets, labels))
                pixels, targets, labels = micro_batches[micro_step]
                output = engine(pixels, targets, label_smoothing=cfg.augment.label_smoothing,
                                branches=active if branched else None)
                engine.backward(output.loss)
                if log_now and own_grad_norm and micro_step == accumulation - 1:
                    grad_norm = expert_grad_norm_stage0(engine.module, cfg.ep_size)
                engine.step()
                train_metrics.add(output, labels, torch.ones_like(labels, dtype=torch.float32))
            state.step += 1
            state.samples += plan.ds.batch.train_batch_size
            log.advance()
            window_seconds += time.perf_counter() - step_start
            if log_now:
                scalars, samples = train_metrics.reduce("train")
                if grad_norm is None:
                    grad_norm = float(engine.get_global_grad_norm() or 0.0)
                scalars.update({"optim/lr": lr, "optim/grad_norm": grad_norm,
                                "optim/loss_scale": float(getattr(engine.optimizer, "loss_scale", 1.0)),
                                "perf/samples_per_second": samples / window_seconds, "perf/memory_mib": memory_mib(),
                                "data/epoch": train_loader.epoch + train_loader.batch / train_loader.batches_per_epoch()})
                if branched:
                    scalars["branches/active"] = active
                log.record(state.step, scalars)
                window_seconds = 0.0
            if cfg.eval_interval and state.step % cfg.eval_interval == 0 and state.step != plan.max_steps:
                log.record(state.step, evaluate(engine, test_loader, ClassifyMetrics([], 0)))
        batch_index += 1
        if save_points.after_batch(first_step, engine, state, train_loader, meta):
            return False
    return True
