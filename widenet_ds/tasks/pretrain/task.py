"""MLM + sentence-order pretraining as a task of the one trainer: the prepared data's splits, the
pretraining model, its metrics and its held-out evaluation (and, for a ParaFormer layout, the held-out loss
of each prefix of branches: the compression curve)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.distributed as torch_dist

from widenet_ds.checkpoint.marker import CheckpointMeta
from widenet_ds.checkpoint.source import CheckpointSource
from widenet_ds.checkpoint.tokenizer_check import check_checkpoint_tokenizer
from widenet_ds.data.batch_order import LOSS_PER_STEP
from widenet_ds.data.loader import PretrainingDataLoader
from widenet_ds.data.prepared import PreparedData
from widenet_ds.data.tokenizer import TokenizerFiles
from widenet_ds.errors import DataError
from widenet_ds.model.config import ModelConfig
from widenet_ds.model.widenet import PreTrainingOutput, WideNetForPreTraining
from widenet_ds.portable.format import check_same_model
from widenet_ds.portable.weights import load_into
from widenet_ds.tasks.pretrain.config import PretrainConfig
from widenet_ds.tasks.pretrain.results import PretrainResults
from widenet_ds.training.log import TrainingLog
from widenet_ds.training.metrics import PretrainMetrics
from widenet_ds.training.model_source import resolve_model_config
from widenet_ds.training.plan import RunPlan
from widenet_ds.training.task import Task

MANIFEST_KEYS = ("seq_length", "vocab_size", "tokenizer_sha256")  # what a resumed run's data must match


def _to_device(batch: dict[str, torch.Tensor], device) -> dict[str, torch.Tensor]:
    return {name: tensor.to(device) for name, tensor in batch.items()}


class PretrainTask(Task):
    METRICS = PretrainMetrics
    RESULTS = PretrainResults
    WEIGHS_STEP = True  # the MLM loss is a mean over masked tokens, which micro-batches hold unequally many of
    cfg: PretrainConfig

    # -- before anything is built --------------------------------------------------------------------
    def model_config(self) -> ModelConfig:
        """A preset takes the data's vocabulary size; a JSON config or a checkpoint's must already match it."""
        cfg = self.cfg
        self.data = PreparedData.open(cfg.data)  # the manifest and the tokenizer, read and checked once
        self.manifest = self.data.manifest
        model = resolve_model_config(ModelConfig, cfg.model_config, self.init_source, cfg.overrides,
                                     {"vocab_size": self.manifest.vocab_size})
        if model.vocab_size != self.manifest.vocab_size:
            raise DataError(f"model config {cfg.model_config} has vocab_size {model.vocab_size}, the data in {cfg.data} "
                            f"was tokenized with {self.manifest.vocab_size} tokens; use data prepared with this "
                            f"model's tokenizer or --set vocab_size={self.manifest.vocab_size}.")
        if self.manifest.seq_length > model.max_position_embeddings:
            raise DataError(f"the data in {cfg.data} has sequences of {self.manifest.seq_length} tokens, more than the "
                            f"model's max_position_embeddings {model.max_position_embeddings}; prepare the data with "
                            f"--seq-length {model.max_position_embeddings} or raise max_position_embeddings.")
        if cfg.init_from is not None:
            # A new phase may change the expert placement (--ep-size) and the dispatch, not the weights' shapes or
            # meaning...
            check_same_model(self.init_source.model_config(ModelConfig).to_dict(), model.to_dict(),
                             cfg.init_from, ignore=("moe.dispatch",))
            # ... nor what each embedding row stands for: the data's tokenizer must be the checkpoint's.
            check_checkpoint_tokenizer(self.data.tokenizer, f"the tokenizer of --data {cfg.data}", self.init_source,
                                       model.vocab_size, tokenizer_file=self.data.tokenizer_file)
        return model

    def model_config_from_settings(self) -> ModelConfig:
        """Without the data: the preset's own vocabulary size (the data's manifest would set it)."""
        return resolve_model_config(ModelConfig, self.cfg.model_config, self.init_source, self.cfg.overrides)

    def batches_per_epoch(self, train_batch_size: int) -> int:
        return max(1, self.manifest.splits["train"].examples // train_batch_size)

    def requested_steps(self, ds) -> int | None:
        return self.cfg.max_steps

    def check_resume(self, meta: CheckpointMeta, source: CheckpointSource) -> None:
        saved = meta.run.get("data_manifest") or {}
        if saved.get("tokenizer_sha256") != self.manifest.tokenizer_sha256:
            raise DataError(f"checkpoint {source.tag_dir} was trained on data of another tokenizer than {self.cfg.data}; "
                            f"resume with the same data (a new phase on new data: use --init-from).")

    def prepare(self, plan: RunPlan) -> None:
        """This rank's loaders (the ranks of a branch group read the same examples)."""
        super().prepare(plan)
        cfg, parallel = self.cfg, plan.parallel
        micro = self.plan.ds.batch.micro_batch_size
        rank, world = parallel.data_parallel_rank, parallel.data_parallel_size
        self.loader = PretrainingDataLoader(self.data, micro, rank, world, cfg.seed, split="train",
                                            accumulation=self.plan.ds.batch.gradient_accumulation_steps,
                                            order=self.plan.data_order)
        self.valid_loader, self.no_evaluation = None, None
        if "valid" not in self.manifest.splits:
            if cfg.eval_interval:
                raise DataError(f"{cfg.data} has no 'valid' split for --eval-interval; prepare the data with "
                                f"--valid-fraction > 0, or pass --eval-interval 0.")
            self.no_evaluation = f"{cfg.data} has no 'valid' split"
            return
        try:
            self.valid_loader = PretrainingDataLoader(self.data, micro, rank, world, cfg.seed, split="valid")
        except DataError as err:
            if cfg.eval_interval:  # asked for: an error; the end-of-run evaluation alone: a note
                raise
            self.no_evaluation = str(err)
            return
        self.valid_start = self.valid_loader.state_dict()  # every evaluation reads the same batches

    # -- building ------------------------------------------------------------------------------------
    def build_model(self) -> tuple[WideNetForPreTraining, list[str]]:
        model = WideNetForPreTraining(self.plan.model_config, ep_size=self.plan.parallel.ep_size)
        init_from = self.init_source
        if init_from is None or not init_from.is_folder:
            return model, []  # a DeepSpeed checkpoint loads into the engine (the trainer does it)
        # Into the module before DeepSpeed copies its parameters (ZeRO partitions, fp32 master weights).
        report = load_into(model, init_from.read_weights(), str(init_from.given))
        return model, [f"weights from {init_from.given} (new optimizer and schedule)", *report.summary().splitlines()]

    def train_loader(self) -> PretrainingDataLoader:
        return self.loader

    def start(self, engine, log: TrainingLog, state) -> None:
        if torch_dist.get_rank() == 0:  # the run folder carries its tokenizer: finetuning and convert find it
            TokenizerFiles.in_folder(self.data.folder).copy_into(self.folder.path)
        if self.no_evaluation:
            log.event(state.step, f"no held-out evaluation: {self.no_evaluation}")

    def meta(self) -> dict[str, Any]:
        return {"data_manifest": {key: getattr(self.manifest, key) for key in MANIFEST_KEYS}}

    # -- the step --------------------------------------------------------------------------------------
    def micro_batch(self, batches, engine) -> dict[str, torch.Tensor]:
        return _to_device(next(batches), engine.device)

    def loss_weights(self, micro_batches: list[dict[str, torch.Tensor]]) -> list[torch.Tensor] | None:
        """Each micro-batch's masked tokens over the step's mean per micro-batch (summed over every rank; the ranks
        of a branch group hold the same micro-batch): the weighted micro-batch means average to the mean over the
        step's masked tokens, the same for any micro batch of the same global batch."""
        if self.plan.loss_normalisation != LOSS_PER_STEP:
            return None  # a run begun with each micro-batch's own mean continues with it (exactly)
        counts = torch.stack([(batch["mlm_labels"] != -100).sum() for batch in micro_batches]).to(torch.float64)
        total = counts.sum()
        if torch_dist.is_initialized() and torch_dist.get_world_size() > 1:
            torch_dist.all_reduce(total)
        parallel = self.plan.parallel
        per_step = len(micro_batches) * parallel.data_parallel_size
        weights = counts * (per_step * parallel.branch_parallel) / total.clamp(min=1.0)
        return list(weights.to(torch.float32).unbind())

    def forward(self, engine, batch: dict[str, torch.Tensor], branches: int | None,
                weight: torch.Tensor | None = None) -> PreTrainingOutput:
        output = super().forward(engine, batch, branches)
        if weight is None:
            return output
        # (weight 1 adds exactly 0: a micro-batch of the step's mean count trains as its own mean does)
        return replace(output, loss=output.loss + (weight - 1.0) * output.mlm_loss, mlm_loss=weight * output.mlm_loss)

    def train_line(self, s: dict[str, float]) -> str:
        return (f"loss {s['train/loss']:.4f} | mlm {s['train/mlm_loss']:.4f} acc {s['train/mlm_accuracy']:.3f} | sop "
                f"{s['train/sop_loss']:.4f} acc {s['train/sop_accuracy']:.3f} | lr {s['optim/lr']:.3g} | "
                f"{s['perf/samples_per_second']:.1f} samples/s")

    # -- evaluation ------------------------------------------------------------------------------------
    @torch.no_grad()
    def validate(self, engine, branches: int | None = None, prefix: str = "valid") -> dict[str, float]:
        """MLM/SOP on the held-out split: the same `eval_batches` micro-batches every time (the loader is
        rewound). `branches`: the first k branches only (ParaFormer's compression curve)."""
        engine.eval()
        self.valid_loader.load_state_dict(self.valid_start)
        metrics = self.metrics()
        for _, batch in zip(range(self.cfg.eval_batches), self.valid_loader):
            batch = _to_device(batch, engine.device)
            metrics.add(self.forward(engine, batch, branches), batch)
        engine.train()
        return metrics.reduce(prefix)[0]

    def evaluate(self, engine, step: int, log: TrainingLog) -> dict[str, float] | None:
        if self.valid_loader is None:
            return None
        s = self.validate(engine)
        log.record(step, s)
        log.console(step, f"validation: loss {s['valid/loss']:.4f} | mlm {s['valid/mlm_loss']:.4f} acc "
                          f"{s['valid/mlm_accuracy']:.3f} | sop {s['valid/sop_loss']:.4f} acc {s['valid/sop_accuracy']:.3f}")
        return s

    def finish(self, engine, state, log: TrainingLog) -> PretrainResults:
        held_out: dict[str, float] = {}
        final = self.evaluate(engine, state.step, log)
        if final is not None:
            held_out.update(final)
            branches = self.plan.model_config.num_branches
            for k in range(1, branches + 1) if branches > 1 else ():
                # ParaFormer's compression curve: the held-out loss of the first k branches, no retraining.
                scalars = self.validate(engine, branches=k, prefix=f"valid_branches_{k}")
                log.record(state.step, scalars)
                log.console(state.step, f"held-out with the first {k} of {branches} branches: mlm loss "
                                        f"{scalars[f'valid_branches_{k}/mlm_loss']:.4f}")
                held_out.update(scalars)
        return PretrainResults(state.step, held_out)
