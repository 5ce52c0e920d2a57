"""The one training loop (training/trainer.py) with a fake task on a tiny real model, in this process, in seconds:
where it saves, which steps it records (a checkpoint closes the logging window), when it evaluates, how a stop
signal ends it, and that a resume continues with the uninterrupted run's losses to the bit. No data folder: the
task draws its token batches from a generator keyed by the batch index."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.support.pretrain_support import CPU_CONFIG, events, train_losses
from widenet_ds.checkpoint.tags import complete_tags
from widenet_ds.model.config import ModelConfig
from widenet_ds.model.widenet import WideNetForPreTraining
from widenet_ds.tasks.pretrain.config import PretrainConfig
from widenet_ds.tasks.pretrain.results import PretrainResults
from widenet_ds.training.command_line import parse
from widenet_ds.training.metrics import PretrainMetrics
from widenet_ds.training.plan import plan_task
from widenet_ds.training.preemption import StopRequest
from widenet_ds.training.task import Task
from widenet_ds.training.trainer import Trainer

VOCAB, SEQ = 64, 16


class RandomTokens:
    """Pretraining-shaped micro-batches from a generator keyed by (seed, batch index): resumable anywhere."""

    def __init__(self, micro: int, seed: int) -> None:
        self.micro, self.seed, self.batch = micro, seed, 0

    def __iter__(self):
        while True:
            generator = torch.Generator().manual_seed(self.seed * 100_003 + self.batch)
            input_ids = torch.randint(5, VOCAB, (self.micro, SEQ), generator=generator)
            mlm_labels = torch.where(torch.rand(self.micro, SEQ, generator=generator) < 0.15, input_ids, -100)
            self.batch += 1
            yield {"input_ids": input_ids, "token_type_ids": torch.zeros_like(input_ids),
                   "attention_mask": torch.ones_like(input_ids), "mlm_labels": mlm_labels,
                   "sop_labels": torch.randint(0, 2, (self.micro,), generator=generator)}

    def state_dict(self) -> dict[str, int]:
        return {"batch": self.batch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.batch = state["batch"]


class FakeTask(Task):
    METRICS = PretrainMetrics

    RESULTS = PretrainResults

    def __init__(self, cfg, stop: StopRequest, signal_in_step: int | None = None) -> None:
        super().__init__(cfg, cfg.folder)
        self.stop, self.signal_in_step = stop, signal_in_step
        self.evaluated: list[int] = []
        self.drawn = 0

    def model_config(self) -> ModelConfig:
        return ModelConfig.from_preset("widenet-tiny-e4", vocab_size=VOCAB, max_position_embeddings=SEQ)

    def batches_per_epoch(self, train_batch_size: int) -> int:
        return 1000

    def requested_steps(self, ds) -> int | None:
        return self.cfg.max_steps

    def prepare(self, plan) -> None:
        super().prepare(plan)
        self.loader = RandomTokens(plan.ds.batch.micro_batch_size, self.cfg.seed)

    def build_model(self):
        return WideNetForPreTraining(self.plan.model_config), []

    def train_loader(self):
        return self.loader

    def micro_batch(self, batches, engine) -> dict[str, torch.Tensor]:
        self.drawn += 1
        accumulation = self.plan.ds.batch.gradient_accumulation_steps
        if self.signal_in_step is not None and self.drawn == (self.signal_in_step - 1) * accumulation + 1:
            self.stop.signal_name = "SIGTERM"  # what StopRequest's handler sets when the signal arrives
        return next(batches)

    def evaluate(self, engine, step: int, log) -> None:
        self.evaluated.append(step)

    def train_line(self, scalars: dict[str, float]) -> str:
        return f"loss {scalars['train/loss']:.4f}"

    def finish(self, engine, state, log) -> PretrainResults:
        self.evaluate(engine, state.step, log)
        return PretrainResults(state.step)


def train(out: Path, *flags: str, signal_in_step: int | None = None) -> tuple[bool, FakeTask]:
    cfg = parse(PretrainConfig, ["--model-config", "widenet-tiny-e4", "--deepspeed_config", str(CPU_CONFIG), "--data",
                             str(out.parent / "no-data"), "--output-dir", str(out), "--no-progress-bar",
                             "--no-tensorboard", "--keep-last", "10", *flags])
    stop = StopRequest()
    task = FakeTask(cfg, stop, signal_in_step)
    plan = plan_task(cfg, task, 1, 0)
    finished, _ = Trainer(cfg, task, plan, stop).run()
    return finished, task


def test_saves_records_and_evaluations_follow_their_intervals(tmp_path, dist):
    """Saves every 3 steps and at the end; records every 5 steps, at the end and at each save (so a run resumed
    from a checkpoint logs the same windows); evaluates every 4 steps and once at the end."""
    out = tmp_path / "run"
    finished, task = train(out, "--max-steps", "7", "--save-interval", "3", "--log-interval", "5",
                           "--eval-interval", "4")
    assert finished
    assert complete_tags(out / "checkpoints") == ["step3", "step6", "step7"]
    assert sorted(train_losses(out)) == [3, 5, 6, 7]
    assert task.evaluated == [4, 7]
    assert task.drawn == 7 * 2  # 16 samples a step = 2 micro-batches of 8 on one rank


def test_a_signal_saves_its_step_and_the_resumed_run_continues_to_the_bit(tmp_path, dist):
    _, _ = train(tmp_path / "uninterrupted", "--max-steps", "6", "--log-interval", "1", "--save-interval", "100")
    reference = train_losses(tmp_path / "uninterrupted")
    out = tmp_path / "stopped"
    finished, task = train(out, "--max-steps", "6", "--log-interval", "1", "--save-interval", "100", signal_in_step=3)
    assert not finished and task.drawn == 3 * 2  # the step the signal arrived in is finished, then saved
    assert complete_tags(out / "checkpoints") == ["step3"]
    assert any(e.startswith("stopped by SIGTERM") for e in events(out))
    finished, task = train(out, "--max-steps", "6", "--log-interval", "1", "--save-interval", "100", "--resume")
    assert finished and task.drawn == 3 * 2
    assert train_losses(out) == reference  # steps 1-3 of the first attempt, 4-6 of the resumed one
