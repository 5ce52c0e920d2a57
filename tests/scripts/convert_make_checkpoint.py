"""Run by the deepspeed launcher for the conversion tests.

    save OUT_DIR EP_SIZE ZERO_STAGE[,STAGE...] [PRECISION [STEPS]]
                                      build a tiny WideNet in a real engine (widenet_ds.engine.build.build_engine,
                                      LAMB, the MoE param groups; PRECISION fp32 or bf16), train STEPS (2) steps,
                                      save a checkpoint with CheckpointManager (tag step<STEPS> under
                                      OUT_DIR/checkpoints), then write this rank's eval logits on its fixed batch to
                                      OUT_DIR/logits.rank<r>; several stages: one run each, into OUT_DIR/zero<stage>
                                      (the schedule's first two steps run at lr 0: the weights move from step 3)
    load CKPT_TAG_DIR EP_SIZE OUT [FOLDER]
                                      a fresh engine with EP_SIZE loads the (resharded) checkpoint's
                                      weights (load_optimizer_states=False) and writes its eval logits to
                                      OUT.rank<r>; with FOLDER also a model from FOLDER.from_pretrained with
                                      EP_SIZE, in an engine, to OUT.folder.rank<r>

Logits are what the converted models must reproduce.
"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from widenet_ds.checkpoint.manager import CheckpointManager, TrainingState
from widenet_ds.checkpoint.marker import CheckpointMeta
from widenet_ds.checkpoint.source import load_pretrained
from widenet_ds.distributed.groups import init_distributed
from widenet_ds.engine.build import build_engine
from widenet_ds.engine.ds_config import validate_ds_config
from widenet_ds.model.config import ModelConfig
from widenet_ds.model.widenet import WideNetForPreTraining

VOCAB = 300
MICRO_BATCH = 4
CPU_CONFIG = Path(__file__).resolve().parents[2] / "ds_configs" / "cpu_small.json"


def model_config() -> ModelConfig:
    return ModelConfig.from_preset("widenet-tiny-e4", vocab_size=VOCAB, max_position_embeddings=64)


def fixed_batch(rank: int, seed: int = 100) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed + rank)
    ids = torch.randint(0, VOCAB, (MICRO_BATCH, 32), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 20:] = 0
    types = torch.zeros_like(ids)
    types[:, 16:] = 1
    labels = torch.where(torch.rand(ids.shape, generator=gen) < 0.15, ids, torch.full_like(ids, -100))
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask, "mlm_labels": labels,
            "sop_labels": torch.tensor([0, 1, 1, 0])}


class FixedBatchLoader:
    """The loader CheckpointManager saves the position of: this script's batches are fixed, so none."""

    def state_dict(self) -> dict:
        return {}


def build(ep_size: int, zero_stage: int, world: int, precision: str = "fp32"):
    torch.manual_seed(1234)
    ds = dict(json.loads(CPU_CONFIG.read_text()), zero_optimization={"stage": zero_stage},
              train_batch_size=MICRO_BATCH * world, train_micro_batch_size_per_gpu=MICRO_BATCH,
              **({precision: {"enabled": True}} if precision != "fp32" else {}))
    settings = validate_ds_config(ds, world_size=world, has_moe=True, cuda_available=False)
    engine, _ = build_engine(WideNetForPreTraining(model_config(), ep_size=ep_size), settings)
    return engine, settings


def save_logits(engine, rank: int, path: str) -> None:
    engine.eval()
    batch = fixed_batch(rank)
    with torch.no_grad():
        out = engine(**{k: v for k, v in batch.items() if k not in ("mlm_labels", "sop_labels")})
    save_file({"mlm_logits": out.mlm_logits.contiguous(), "sop_logits": out.sop_logits.contiguous()}, path)


def save(out_dir: Path, ep_size: int, zero_stage: int, precision: str = "fp32", steps: int = 2) -> None:
    init_distributed()
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    engine, settings = build(ep_size, zero_stage, world, precision)
    engine.train()
    for step in range(steps):
        out = engine(**fixed_batch(rank, seed=500 + 10 * step))
        engine.backward(out.loss)
        engine.step()
    meta = CheckpointMeta(step=steps, samples=0, world_size=world, ep_size=ep_size,
                          model_config=model_config().to_dict(), deepspeed_config=settings.config,
                          architecture="WideNetForPreTraining", task="pretrain")
    CheckpointManager(out_dir / "checkpoints", keep_last=2, rank=rank, world_size=world).save(
        engine, TrainingState(step=steps, samples=steps * MICRO_BATCH * world), FixedBatchLoader(), meta)
    save_logits(engine, rank, str(out_dir / f"logits.rank{rank}.safetensors"))


def load(tag_dir: Path, ep_size: int, out_prefix: str, folder: str | None) -> None:
    init_distributed()
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    engine, settings = build(ep_size, zero_stage=1, world=world)
    path, _ = engine.load_checkpoint(str(tag_dir.parent), tag=tag_dir.name, load_optimizer_states=False,
                                     load_lr_scheduler_states=False, load_module_only=True)
    assert path is not None, f"DeepSpeed loaded nothing from {tag_dir}"
    save_logits(engine, rank, f"{out_prefix}.rank{rank}.safetensors")
    if folder:
        model, report = load_pretrained(WideNetForPreTraining, folder, ep_size=ep_size)
        print(f"rank {rank}: {report.summary()}", flush=True)
        folder_engine, _ = build_engine(model, settings)
        save_logits(folder_engine, rank, f"{out_prefix}.folder.rank{rank}.safetensors")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]  # the launcher adds --local_rank
    if args[0] == "save":
        stages = [int(stage) for stage in args[3].split(",")]
        for stage in stages:
            save(Path(args[1]) / f"zero{stage}" if len(stages) > 1 else Path(args[1]), int(args[2]), stage,
                 *args[4:5], *map(int, args[5:6]))
    else:
        load(Path(args[1]), int(args[2]), args[3], args[4] if len(args) > 4 else None)
    # Every rank exits together: a gloo group torn down while a peer still writes aborts that peer at exit.
    torch.distributed.barrier()
