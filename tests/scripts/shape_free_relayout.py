"""Run by the deepspeed launcher for tests/checkpoint/test_shape_free.py.

    relayout SHAPE_FREE_FOLDER OUT_DIR EP_SIZE ZERO_STAGE
        build the tiny WideNet of convert_make_checkpoint.py in a fresh engine of this layout (the launcher's
        ranks, EP_SIZE, ZERO_STAGE), put the shape-free state into it (widenet_ds.checkpoint.shape_free.
        apply_to_engine) and save it with CheckpointManager (tag step<N> under OUT_DIR/checkpoints): DeepSpeed's
        own save_checkpoint writes the files of the new layout.
    resume OUT_PREFIX TAG_DIR...
        for each tag (of the launcher's world size): a fresh engine of the tag's layout loads it as `--resume`
        does (CheckpointManager.load: weights, optimizer, schedule), trains one more step on a fixed batch (the
        RNG seeded alike) and writes the eval logits to OUT_PREFIX.<i>.rank<r>.safetensors (i: the tag's position)
"""

import sys
from pathlib import Path

import torch
from convert_make_checkpoint import FixedBatchLoader, build, fixed_batch, save_logits

from widenet_ds.checkpoint.manager import CheckpointManager, TrainingState
from widenet_ds.checkpoint.shape_free import apply_to_engine, load_shape_free, target_meta
from widenet_ds.checkpoint.source import RESUME, CheckpointSource
from widenet_ds.runtime.distributed import init_distributed


def relayout(folder: Path, out_dir: Path, ep_size: int, zero_stage: int) -> None:
    init_distributed()
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    state = load_shape_free(folder)
    engine, settings = build(ep_size, zero_stage, world)
    apply_to_engine(engine, state, ep_size=ep_size, rank=rank)
    meta = target_meta(state, world_size=world, ep_size=ep_size, deepspeed_config=settings.config)
    CheckpointManager(out_dir / "checkpoints", keep_last=1, rank=rank, world_size=world).save(
        engine, TrainingState(step=meta.step, samples=meta.samples), FixedBatchLoader(), meta)


class ResumableLoader(FixedBatchLoader):
    def load_state_dict(self, state: dict) -> None:
        assert state == {}, state


def resume(out_prefix: str, tag_dirs: list[Path]) -> None:
    init_distributed()
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    for index, tag_dir in enumerate(tag_dirs):
        source = CheckpointSource.open(tag_dir, "--resume", purpose=RESUME)  # its files checked, its state complete
        meta = source.meta
        engine, _ = build(meta.ep_size, meta.deepspeed_config["zero_optimization"]["stage"], world)
        CheckpointManager(tag_dir.parent, keep_last=1, rank=rank, world_size=world).load(
            engine, source, ResumableLoader())
        torch.manual_seed(7 + rank)
        engine.train()
        out = engine(**fixed_batch(rank, seed=520))
        engine.backward(out.loss)
        engine.step()
        save_logits(engine, rank, f"{out_prefix}.{index}.rank{rank}.safetensors")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]  # the launcher adds --local_rank
    if args[0] == "relayout":
        relayout(Path(args[1]), Path(args[2]), int(args[3]), int(args[4]))
    else:
        resume(args[1], [Path(a) for a in args[2:]])
    torch.distributed.barrier()  # every rank exits together (see convert_make_checkpoint.py)
