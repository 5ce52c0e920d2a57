"""Image classification as a task of the one trainer: the image data and its augmentation, the ViT-WideNet
classifier, accuracy, the test-split evaluation and (for a ParaFormer layout) the test accuracy of each
prefix of branches, ParaFormer's compression curve."""

from __future__ import annotations

from typing import Any

import torch

from widenet_ds.checkpoint.marker import CheckpointMeta
from widenet_ds.checkpoint.source import CheckpointSource
from widenet_ds.distributed.console import say
from widenet_ds.errors import CheckpointError, DataError
from widenet_ds.portable.weights import load_into, match_weights
from widenet_ds.tasks.classify.config import ClassifyConfig
from widenet_ds.tasks.classify.results import ClassifyResults
from widenet_ds.training.log import TrainingLog
from widenet_ds.training.metrics import ClassifyMetrics
from widenet_ds.training.model_source import resolve_model_config
from widenet_ds.training.plan import RunPlan
from widenet_ds.training.task import Task
from widenet_ds.vision.augment import BatchAugmenter, normalize
from widenet_ds.vision.config import VisionConfig
from widenet_ds.vision.datasets import ImageSource, load_dataset
from widenet_ds.vision.loader import ImageLoader, default_workers
from widenet_ds.vision.model import (
    ViTWideNetForImageClassification,
    build_model,
    count_trainable_parameters,
)


def check_data_fits_model(splits: dict[str, ImageSource], model: VisionConfig, dataset: str) -> None:
    for source in splits.values():
        if source.num_classes > model.num_classes:
            raise DataError(f"{source.name} has {source.num_classes} classes, the model's head has "
                            f"{model.num_classes}; set --set num_classes={source.num_classes}.")
        if source.channels is not None and source.channels != model.num_channels:
            raise DataError(f"{source.name} has {source.channels}-channel images, the model expects "
                            f"{model.num_channels}; set --set num_channels={source.channels} (a {dataset} preset: "
                            f"widenet-vit-tiny / vit-tiny take 1 channel).")


def _limit(source: ImageSource, count: int | None) -> ImageSource:
    if count is None or count >= len(source):
        return source
    return ImageSource(f"{source.name} (first {count})", source.labels[:count], source.num_classes, source.channels,
                       source.load, source.class_names)


def _input_dtype(engine) -> torch.dtype:
    return next(engine.module.parameters()).dtype


class ClassifyTask(Task):
    METRICS = ClassifyMetrics
    RESULTS = ClassifyResults
    cfg: ClassifyConfig

    # -- before anything is built --------------------------------------------------------------------
    def model_config(self) -> VisionConfig:
        cfg = self.cfg
        model = resolve_model_config(VisionConfig, cfg.model_config, self.init_source, cfg.overrides)
        self.splits = load_dataset(cfg.dataset, cfg.data)
        if "test" not in self.splits:
            raise DataError(f"{cfg.dataset} at {cfg.data} has no test/val split to evaluate on; add it "
                            f"(ImageFolder: val/<class>/...).")
        check_data_fits_model(self.splits, model, cfg.dataset)
        self.init = None
        if cfg.init_from is not None:  # the body must fit; a head of another shape starts fresh
            self.init = self.init_source.read_weights()
            match_weights(self.init, ViTWideNetForImageClassification.__name__, model, f"--init-from {cfg.init_from}")
        return model

    def batches_per_epoch(self, train_batch_size: int) -> int:
        return max(1, len(self.splits["train"]) // train_batch_size)

    def requested_steps(self, ds) -> int | None:
        if self.cfg.epochs is None:
            return self.cfg.max_steps
        return max(1, int(self.cfg.epochs * self.batches_per_epoch(ds.batch.train_batch_size)))

    def check_resume(self, meta: CheckpointMeta, source: CheckpointSource) -> None:
        saved = meta.run.get("dataset")
        if saved != self.cfg.dataset:
            raise CheckpointError(f"checkpoint {source.tag_dir} was trained on {saved}; resume with --dataset {saved}.")

    def prepare(self, plan: RunPlan) -> None:
        super().prepare(plan)
        cfg = self.cfg
        model, parallel = plan.model_config, plan.parallel
        micro = plan.ds.batch.micro_batch_size
        rank, world = parallel.data_parallel_rank, parallel.data_parallel_size
        self.workers = cfg.workers if cfg.workers is not None else default_workers(parallel.world_size)
        self.loader = ImageLoader(self.splits["train"], model.image_size, model.num_channels, micro, rank, world,
                                  cfg.seed, train=True, workers=self.workers,
                                  accumulation=plan.ds.batch.gradient_accumulation_steps, order=plan.data_order)
        self.test_loader = ImageLoader(_limit(self.splits["test"], cfg.max_eval_examples), model.image_size,
                                       model.num_channels, micro, rank, world, cfg.seed, train=False,
                                       workers=self.workers)
        self.augmenter = BatchAugmenter(cfg.augment, model.image_size, model.num_classes)

    # -- building ------------------------------------------------------------------------------------
    def build_model(self) -> tuple[ViTWideNetForImageClassification, list[str]]:
        model = ViTWideNetForImageClassification(self.plan.model_config, self.plan.parallel.ep_size)
        if self.init is None:
            return model, []
        report = load_into(model, self.init, f"--init-from {self.cfg.init_from}")
        self.init = None  # the weights are in the model now
        return model, [f"weights from {self.cfg.init_from} (new optimizer and schedule)", *report.summary().splitlines()]

    def train_loader(self) -> ImageLoader:
        return self.loader

    def start(self, engine, log: TrainingLog, state) -> None:
        cfg = self.cfg
        log.event(state.step, f"model {cfg.model_config or cfg.init_from}: {count_trainable_parameters(engine.module):,} "
                              f"trainable parameters (ep_size {self.plan.parallel.ep_size}: this rank's share); train "
                              f"{len(self.splits['train'])} / test {len(self.test_loader.dataset)} images of "
                              f"{cfg.dataset}; {self.workers} loader workers per rank")

    def meta(self) -> dict[str, Any]:
        return {"dataset": self.cfg.dataset}

    # -- the step --------------------------------------------------------------------------------------
    def micro_batch(self, batches, engine) -> dict[str, torch.Tensor]:
        batch = next(batches)
        labels = batch["labels"].to(engine.device)
        pixels, targets = self.augmenter(batch["pixels"].to(engine.device), labels)
        return {"pixels": pixels.to(_input_dtype(engine)), "targets": targets, "labels": labels}

    def forward(self, engine, batch: dict[str, torch.Tensor], branches: int | None,
                weight: torch.Tensor | None = None):
        return engine(batch["pixels"], batch["targets"], label_smoothing=self.cfg.label_smoothing, branches=branches)

    def train_scalars(self) -> dict[str, float]:
        return {"data/epoch": self.loader.epoch + self.loader.batch / self.loader.batches_per_epoch()}

    def train_line(self, s: dict[str, float]) -> str:
        return (f"loss {s['train/loss']:.4f} | task {s['train/task_loss']:.4f} acc {s['train/accuracy']:.3f} | lr "
                f"{s['optim/lr']:.3g} | {s['perf/samples_per_second']:.1f} samples/s")

    # -- evaluation ------------------------------------------------------------------------------------
    @torch.no_grad()
    def test(self, engine, branches: list[int | None]) -> list[dict[str, float]]:
        """Loss and accuracy on the test split (padding rows weigh 0), for each entry of `branches` (None: all
        of them; k: the first k), in one pass over the data."""
        engine.eval()
        dtype = _input_dtype(engine)
        metrics = [ClassifyMetrics([], 0, self.plan.parallel.branch_parallel) for _ in branches]
        for batch in self.test_loader:
            pixels = normalize(batch["pixels"].to(engine.device)).to(dtype)
            batch = {"labels": batch["labels"].to(engine.device), "weight": batch["weight"].to(engine.device)}
            for k, sums in zip(branches, metrics):
                sums.add(engine(pixels, batch["labels"], sample_weight=batch["weight"], branches=k), batch)
        engine.train()
        return [sums.reduce("test")[0] for sums in metrics]

    def evaluate(self, engine, step: int, log: TrainingLog) -> dict[str, float]:
        scalars = self.test(engine, [None])[0]
        log.record(step, scalars)
        log.console(step, f"test: loss {scalars['test/task_loss']:.4f} | accuracy {scalars['test/accuracy']:.4f}")
        return scalars

    def finish(self, engine, state, log: TrainingLog) -> ClassifyResults:
        cfg, model = self.cfg, self.plan.model_config
        say(f"evaluating on {len(self.test_loader.dataset)} test images")
        test = self.evaluate(engine, state.step, log)
        accuracy_by_branches: dict[int, float] = {}
        if model.num_branches > 1:
            # ParaFormer's compression curve: the test accuracy of the first k branches, no retraining.
            say(f"evaluating the first k of {model.num_branches} branches, k = 1..{model.num_branches}")
            by_branches = self.test(engine, list(range(1, model.num_branches + 1)))
            accuracy_by_branches = {k: s["test/accuracy"] for k, s in enumerate(by_branches, start=1)}
            for k, accuracy in accuracy_by_branches.items():
                log.console(state.step, f"test accuracy with the first {k} of {model.num_branches} branches: "
                                        f"{accuracy:.4f}")
        results = ClassifyResults(
            state.step, cfg.dataset, cfg.model_config or str(cfg.init_from), self.plan.parallel.ep_size,
            self.plan.parallel.world_size,
            # the whole model's, counted on the meta device: with ep_size > 1 a rank holds only its share of the experts
            count_trainable_parameters(build_model(model, device="meta")), test,
            self.plan.schedule.kind if accuracy_by_branches else None, accuracy_by_branches)
        log.event(state.step, f"test accuracy {test['test/accuracy']:.4f} (loss {test['test/task_loss']:.4f})")
        return results
