"""The preflight's training steps: a tiny MoE with the job's parallel layout against a one-rank run of the same steps,
and a few steps of the job's own model and DeepSpeed JSON with a checkpoint saved and loaded back.

The tiny model: `widenet-tiny-e4` with the job's number of experts, on synthetic batches, trained by a real DeepSpeed
engine (engine/build.py) with the job's `--ep-size` on the job's ranks, rank r taking micro-batch r of each step. The
reference is a one-rank run of the same steps: a process of its own on node 1 with a 1-rank group (torch allows one
process group per process, and only a run with a world of one holds every expert itself, so that no all-to-all
between ranks is involved), taking all the micro-batches of a step in turn as gradient-accumulation steps. Every
micro-batch's loss must be the reference's within the golden curves' tolerance (tests/support/golden_curves.py): the
two runs differ only in the order of floating-point sums, as a resume on another shape does
(tests/integration/test_resume_new_shape.py), while an all-to-all that hands tokens to the wrong experts moves the
first step's losses by far more. The tiny model routes with DeepSpeed's capacity dispatch (every peer's share of an
all-to-all the same size), no routing noise and no dropout: nothing in a step draws a random number.

The job's steps run in a scratch folder (launch/preflight_folders.py) with its settings but the output folder's, from
step 0: the step time after the first (the first holds the warm-up), tokens per second, the model FLOP utilisation
against the device's dense bf16/fp16 peak where the GPU is one of PEAK_TFLOPS, each rank's peak memory, and a
checkpoint saved with the run's own CheckpointManager, one step more taken, and the checkpoint loaded back: every
rank's weights must be those it saved (a rank that loaded another rank's experts is named).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as torch_dist

from widenet_ds.checkpoint.manager import CheckpointManager, TrainingState
from widenet_ds.checkpoint.marker import CheckpointMeta
from widenet_ds.checkpoint.source import RESUME, CheckpointSource
from widenet_ds.distributed.collective_timeouts import apply_current_timeout
from widenet_ds.distributed.console import LAUNCHER_RANKS
from widenet_ds.distributed.every_rank import describe_ranks
from widenet_ds.distributed.ports import free_port
from widenet_ds.engine.build import build_engine
from widenet_ds.engine.compile import compile_for_training
from widenet_ds.engine.ds_config import DeepSpeedSettings, validate_ds_config
from widenet_ds.fs.checksums import total_size
from widenet_ds.fs.disk_space import mib
from widenet_ds.launch.options import PREFLIGHT_MODULE
from widenet_ds.launch.preflight_table import Row, failed, passed
from widenet_ds.model.config import ModelConfig
from widenet_ds.model.counts import flops_per_token
from widenet_ds.model.widenet import WideNetForPreTraining
from widenet_ds.run_folder import RunFolder
from widenet_ds.tasks.pretrain.config import PretrainConfig
from widenet_ds.tasks.pretrain.task import PretrainTask
from widenet_ds.training.log import memory_mib
from widenet_ds.training.plan import plan_task
from widenet_ds.training.trainer import seed_everything

# The golden curves' tolerance per step, in float32 ulps of the loss (tests/support/golden_curves.py TOLERANCE_ULPS,
# which tests/launch/test_preflight_steps.py holds this to).
LOSS_TOLERANCE_ULPS = 8
TINY_PRESET, TINY_VOCAB, TINY_SEQ, TINY_MICRO, TINY_STEPS, TINY_LR = "widenet-tiny-e4", 128, 16, 2, 3, 0.02
TINY_SEED = 1234
JOB_STEPS = 3  # before the checkpoint; the first is the warm-up
# Dense tensor-core peak of bf16/fp16 per GPU, TFLOP/s (NVIDIA's data sheets; SXM boards): the first name a GPU's
# name contains.
PEAK_TFLOPS = {"H100 PCIe": 756.0, "H100": 989.0, "H200": 989.0, "A100": 312.0}
RENDEZVOUS_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


# --- the tiny model against one rank --------------------------------------------------------------------------------
@dataclass(frozen=True)
class TinyLayout:
    """The tiny run's shape: the job's ranks and expert-parallel size, the job's number of experts."""

    world: int
    ep_size: int
    num_experts: int

    def words(self) -> str:
        return (f"{TINY_PRESET} with {self.num_experts} experts, {TINY_STEPS} steps of {self.world} micro-batches on "
                f"{self.world} ranks, --ep-size {self.ep_size}")


def tiny_model_config(num_experts: int) -> ModelConfig:
    return ModelConfig.from_preset(TINY_PRESET, vocab_size=TINY_VOCAB, classifier_dropout=0.0,
                                   moe={"num_experts": num_experts, "noise": "none", "dispatch": "deepspeed"})


def tiny_ds_config(data_parallel: int, accumulation: int) -> dict:
    """fp32, ZeRO 0 and LAMB, as ds_configs/cpu_small.json trains (run as widenet_ds.engine.lamb.Lamb on every device:
    no op to build)."""
    return {"train_batch_size": TINY_MICRO * accumulation * data_parallel, "train_micro_batch_size_per_gpu": TINY_MICRO,
            "optimizer": {"type": "Lamb", "params": {"lr": TINY_LR, "weight_decay": 0.01}},
            "zero_optimization": {"stage": 0}, "steps_per_print": 10**9}


def tiny_batch(step: int, index: int, device) -> dict[str, torch.Tensor]:
    """Micro-batch `index` of `step`, the same on every rank and process: every 4th token a masked one, so that each
    micro-batch holds as many and the mean over a step is the mean of the micro-batches' means."""
    generator = torch.Generator().manual_seed(TINY_SEED + 1009 * step + index)
    ids = torch.randint(5, TINY_VOCAB, (TINY_MICRO, TINY_SEQ), generator=generator)
    labels = torch.full_like(ids, -100)
    labels[:, 1::4] = ids[:, 1::4]
    token_types = (torch.arange(TINY_SEQ) >= TINY_SEQ // 2).long().expand(TINY_MICRO, -1)
    batch = {"input_ids": ids, "token_type_ids": token_types, "attention_mask": torch.ones_like(ids),
             "mlm_labels": labels, "sop_labels": torch.randint(0, 2, (TINY_MICRO,), generator=generator)}
    return {name: tensor.to(device) for name, tensor in batch.items()}


def tiny_losses(layout: TinyLayout, micro_batches: list[int]) -> list[list[float]]:
    """Collective: the tiny model trained on this process's group, each step on the micro-batches `micro_batches` (one
    per rank of the job's layout; all of them in a one-rank reference, as accumulation steps); the loss of each, per
    step."""
    world = torch_dist.get_world_size()
    seed_everything(TINY_SEED)
    model = WideNetForPreTraining(tiny_model_config(layout.num_experts), ep_size=layout.ep_size if world > 1 else 1)
    settings = validate_ds_config(tiny_ds_config(world, len(micro_batches)), world_size=world, has_moe=True,
                                  cuda_available=torch.cuda.is_available())
    engine, _ = build_engine(model, settings, "torch-lamb")
    apply_current_timeout()
    losses = []
    for step in range(TINY_STEPS):
        row = []
        for index in micro_batches:
            output = engine(**tiny_batch(step, index, engine.device))
            engine.backward(output.loss)
            engine.step()
            row.append(float(output.loss.detach()))
        losses.append(row)
    return losses


def start_reference(layout: TinyLayout) -> subprocess.Popen:
    """The one-rank run of the tiny steps, on this node, in a process of its own with a 1-rank group on the loopback
    (the job's rank variables replaced); its losses come back as JSON on its stdout."""
    env = {name: value for name, value in os.environ.items() if name not in (*RENDEZVOUS_VARS, *LAUNCHER_RANKS)}
    env.update(RANK="0", LOCAL_RANK=os.environ.get("LOCAL_RANK", "0"), WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()))
    spec = json.dumps(dataclasses.asdict(layout))
    return subprocess.Popen([sys.executable, "-m", PREFLIGHT_MODULE, "--reference", spec], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def reference_losses(proc: subprocess.Popen, timeout_s: float) -> list[list[float]]:
    out, err = proc.communicate(timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"the one-rank reference process exited {proc.returncode}: {err.strip()[-600:]}")
    return json.loads(out.strip().splitlines()[-1])


def ulps(value: float, reference: float) -> float:
    return abs(value - reference) / float(np.spacing(np.float32(abs(reference))))


def routing_row(layout: TinyLayout, losses: list[list[float]], reference: list[list[float]],
                hosts: list[str]) -> Row:
    """Every rank's losses (step x rank) against the one-rank reference's (step x micro-batch)."""
    distance = [[ulps(losses[s][r], reference[s][r]) for r in range(layout.world)] for s in range(TINY_STEPS)]
    worst = max(max(row) for row in distance)
    if worst <= LOSS_TOLERANCE_ULPS:
        return passed("expert routing", f"{layout.words()}: every loss within {LOSS_TOLERANCE_ULPS} ulps of a "
                                        f"one-rank run's (largest {worst:.0f})")
    far = sorted({r for row in distance for r, d in enumerate(row) if d > LOSS_TOLERANCE_ULPS})
    first = next(s for s, row in enumerate(distance) if max(row) > LOSS_TOLERANCE_ULPS)
    shown = ", ".join(f"{losses[first][r]:.7g} against {reference[first][r]:.7g}" for r in far[:4])
    return failed("expert routing", f"{layout.words()}: the losses of {describe_ranks(far, hosts)} differ from a "
                                    f"one-rank run's from step {first + 1} on by up to {worst:.0f} ulps ({shown}): "
                                    f"tokens reach other experts than on one rank",
                  "the all-to-all row says whether the ranks receive what their peers send: a wrong value there is "
                  "the link's or the collective library's (its fix); with every value right, report this table",
                  sorted({hosts[r] for r in far}, key=hosts.index))


# --- the job's own steps ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobSteps:
    """What the job's steps found on one rank."""

    step_seconds: list[float]
    first_seconds: float
    seq_length: int                  # of the data's sequences
    finite: bool
    peak_bytes: int
    checkpoint_bytes: int | None = None
    restored: bool | None = None     # None: no checkpoint taken
    moved: bool | None = None        # the extra step changed this rank's weights


def weights_digest(engine) -> str:
    """SHA-256 of this rank's module weights, to the byte."""
    digest = hashlib.sha256()
    for name, tensor in engine.module.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _step(task: PretrainTask, engine, batches, accumulation: int) -> tuple[float, bool]:
    """One optimizer step as the trainer takes it (training/trainer.py): its seconds, and whether its losses were
    finite."""
    _sync()
    start = time.perf_counter()
    micro_batches = [task.micro_batch(batches, engine) for _ in range(accumulation)]
    weights = task.loss_weights(micro_batches)
    finite = True
    for index, batch in enumerate(micro_batches):
        output = task.forward(engine, batch, None, None if weights is None else weights[index])
        engine.backward(output.loss)
        engine.step()
        finite &= bool(torch.isfinite(output.loss.detach()))
    _sync()
    return time.perf_counter() - start, finite


def job_steps(cfg: PretrainConfig, run_dir: Path, init_source: CheckpointSource | None, checkpoint: bool) -> JobSteps:
    """Collective: JOB_STEPS steps of the job in `run_dir`, then (`checkpoint`) the round trip of a checkpoint."""
    world, rank = torch_dist.get_world_size(), torch_dist.get_rank()
    cfg = dataclasses.replace(cfg, output_dir=run_dir, resume=None, max_steps=JOB_STEPS + 1, eval_interval=0,
                              tensorboard=False, progress_bar=False)
    task = PretrainTask(cfg, RunFolder(run_dir), init_source)
    plan = plan_task(cfg, task, world, rank)
    seed_everything(task.init_seed)
    model, _ = task.build_model()
    model.set_activation_checkpointing(cfg.activation_checkpointing)
    plan.parallel.apply(model)
    compile_for_training(model, cfg.compile, cfg.compile_backend)
    engine, _ = build_engine(model, plan.ds, cfg.optimizer, plan.parallel.deepspeed_config(plan.ds.config))
    apply_current_timeout()
    seed_everything(task.stream_seed + 1 + plan.parallel.data_parallel_rank)
    engine.train()
    loader = task.train_loader()
    batches = iter(loader)
    accumulation = plan.ds.batch.gradient_accumulation_steps
    timed = [_step(task, engine, batches, accumulation) for _ in range(JOB_STEPS)]
    result = JobSteps([seconds for seconds, _ in timed[1:]], timed[0][0], task.manifest.seq_length,
                      all(ok for _, ok in timed), int(memory_mib() * 2**20))
    if not checkpoint:
        return result
    manager = CheckpointManager(task.folder.checkpoints, 1, rank, world)
    state = TrainingState(step=JOB_STEPS, samples=JOB_STEPS * plan.ds.batch.train_batch_size)
    meta = CheckpointMeta(step=state.step, samples=state.samples, world_size=world, ep_size=plan.parallel.ep_size,
                          model_config=plan.model_config.to_dict(), deepspeed_config=plan.ds.config,
                          architecture=type(model).__name__, task=cfg.TASK, branch_schedule=plan.schedule.kind,
                          data_order=plan.data_order, branch_parallel=plan.parallel.branch_parallel,
                          loss_normalisation=plan.loss_normalisation, run=task.meta())
    saved = weights_digest(engine)
    tag_dir = manager.save(engine, state, loader, meta)
    _step(task, engine, batches, accumulation)
    moved = weights_digest(engine) != saved
    source = CheckpointSource.open(tag_dir, "--resume", purpose=RESUME)
    restored = manager.load(engine, source, loader)
    return dataclasses.replace(result, checkpoint_bytes=total_size(source.meta.files),
                               restored=weights_digest(engine) == saved and restored.step == JOB_STEPS, moved=moved)


def peak_tflops(device: str) -> float | None:
    return next((peak for name, peak in PEAK_TFLOPS.items() if name in device), None)


def mfu_words(model_config: ModelConfig, seq_length: int, tokens_per_s: float, world: int, device: str,
              precision: str) -> str:
    if device == "CPU":
        return "MFU: no peak known for CPUs"
    peak = peak_tflops(device)
    if peak is None or precision == "fp32":
        return (f"MFU: no {'fp32 ' if precision == 'fp32' else ''}peak known for {device} (known: bf16/fp16 on "
                f"{', '.join(PEAK_TFLOPS)})")
    achieved = flops_per_token(model_config, seq_length).training * tokens_per_s / world
    return f"MFU {achieved / (peak * 1e12):.1%} of the {device}'s {peak:g} TFLOP/s ({precision})"


def steps_rows(found: list[JobSteps], model_config: ModelConfig, cfg: PretrainConfig, ds: DeepSpeedSettings,
               device: str, hosts: list[str]) -> list[Row]:
    """Every rank's findings: the step time (a step ends with its slowest rank), tokens/s, MFU, peak memory; the
    checkpoint's round trip."""
    world, seq_length, precision = len(found), found[0].seq_length, ds.precision
    step_s = statistics.median(max(f.step_seconds[i] for f in found) for i in range(len(found[0].step_seconds)))
    tokens_per_s = ds.batch.train_batch_size * seq_length / step_s
    peak_rank = max(range(world), key=lambda r: found[r].peak_bytes)
    where = f"{cfg.deepspeed_config.name}, {cfg.model_config}"
    words = (f"{JOB_STEPS} steps ({where}) on {world} ranks: {step_s:.3f} s a step after the first "
             f"({found[0].first_seconds:.1f} s), {tokens_per_s:,.0f} tokens/s, "
             f"{mfu_words(model_config, seq_length, tokens_per_s, world, device, precision)}, peak memory "
             f"{mib(found[peak_rank].peak_bytes)} (rank {peak_rank} on {hosts[peak_rank]})")
    not_finite = [r for r, f in enumerate(found) if not f.finite]
    rows = [failed("job's steps", f"{words}; the loss is not finite on {describe_ranks(not_finite, hosts)}",
                   "the model diverged at once: check the DeepSpeed JSON's learning rate and precision against the "
                   "README's recipe", sorted({hosts[r] for r in not_finite}, key=hosts.index))
            if not_finite else passed("job's steps", words)]
    if found[0].restored is None:
        return rows
    wrong = [r for r, f in enumerate(found) if not f.restored]
    still = [r for r, f in enumerate(found) if not f.moved]
    size = found[0].checkpoint_bytes
    if wrong:
        rows.append(failed("checkpoint", f"saved ({mib(size)}) at step {JOB_STEPS} and loaded back, but "
                                         f"{describe_ranks(wrong, hosts)} then held other weights than it saved",
                           "report this with the table: DeepSpeed loaded another rank's files (its experts' files "
                           "are named by expert-parallel rank)", sorted({hosts[r] for r in wrong}, key=hosts.index)))
    else:
        unchanged = f" (which left the weights of {describe_ranks(still, hosts)} as they were)" if still else ""
        rows.append(passed("checkpoint", f"saved ({mib(size)}) at step {JOB_STEPS}, one step more taken{unchanged}, "
                                         f"loaded back: every rank's weights and the step restored"))
    return rows

