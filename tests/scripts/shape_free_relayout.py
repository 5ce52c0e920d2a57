"""Run by the deepspeed launcher for tests/checkpoint/test_shape_free.py and the branch-parallel re-layout test.

    relayout SPEC [SPEC ...]        SPEC = STATE_FOLDER,OUT_DIR,EP_SIZE,ZERO_STAGE,PRECISION,BRANCH_PARALLEL
        for each SPEC: build the model the shape-free state's marker records (its architecture and config, text or
        image) in a fresh engine of this layout (the launcher's ranks, EP_SIZE, ZERO_STAGE, PRECISION fp32 or bf16,
        branch groups of BRANCH_PARALLEL ranks), with the source run's DeepSpeed JSON otherwise; put the state into
        it (widenet_ds.checkpoint.relayout.apply_to_engine) and save it with CheckpointManager (tag step<N> under
        OUT_DIR/checkpoints): DeepSpeed's own save_checkpoint writes the files of the new layout.
    resume OUT_PREFIX TAG_DIR...
        for each tag (of the launcher's world size): a fresh engine of the tag's layout loads it as `--resume`
        does (CheckpointManager.load: weights, optimizer, schedule), trains one more step on a fixed batch (the
        RNG seeded alike) and writes the eval logits to OUT_PREFIX.<i>.rank<r>.safetensors (i: the tag's position)
"""

import sys
from pathlib import Path
from typing import Any

import torch
from convert_make_checkpoint import FixedBatchLoader, build, fixed_batch, save_logits

from widenet_ds.checkpoint.manager import CheckpointManager, TrainingState
from widenet_ds.checkpoint.marker import CheckpointMeta
from widenet_ds.checkpoint.relayout import apply_to_engine
from widenet_ds.checkpoint.shape_free import ShapeFreeState, load_shape_free
from widenet_ds.checkpoint.source import RESUME, CheckpointSource
from widenet_ds.distributed.groups import init_distributed
from widenet_ds.distributed.parallel import ParallelPlan
from widenet_ds.engine.build import build_engine
from widenet_ds.engine.ds_config import validate_ds_config
from widenet_ds.portable.format import TEXT_DEFAULT, architecture


def target_meta(state: ShapeFreeState, *, world_size: int, ep_size: int, deepspeed_config: dict[str, Any],
                branch_parallel: int = 1) -> CheckpointMeta:
    """The marker of the re-laid-out tag: the source's, with the new layout and where it came from (what `--resume`
    on a new shape records, built by hand here)."""
    where = Path(state.scalars["source"]["tag_dir"])
    marker = {**CheckpointMeta.from_json(state.scalars["marker"], where).to_json(), "world_size": world_size,
              "ep_size": ep_size, "deepspeed_config": deepspeed_config, "branch_parallel": branch_parallel,
              "files": {}, "relaid_out_from": state.scalars["source"]}
    return CheckpointMeta.from_json(marker, where)


def relayout(spec: str) -> None:
    folder, out_dir, ep_size, zero_stage, precision, branch_parallel = spec.split(",")
    ep_size, zero_stage, branch_parallel = int(ep_size), int(zero_stage), int(branch_parallel)
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    state = load_shape_free(Path(folder))
    source = CheckpointMeta.from_json(state.scalars["marker"], Path(folder))
    arch = architecture(source.architecture or TEXT_DEFAULT, folder)
    model_config = arch.config.from_dict(source.model_config)
    torch.manual_seed(1234)  # (any weights: the state replaces them)
    model = arch.model(model_config, ep_size=ep_size)
    parallel = ParallelPlan.plan(world, rank, ep_size, branch_parallel, model_config)
    parallel.apply(model)
    config = {k: v for k, v in source.deepspeed_config.items() if k not in ("bf16", "fp16")}
    config = {**config, "zero_optimization": {"stage": zero_stage},
              **({precision: {"enabled": True}} if precision != "fp32" else {})}
    settings = validate_ds_config(config, world_size=parallel.data_parallel_size, has_moe=model_config.is_moe,
                                  cuda_available=False)
    engine, _ = build_engine(model, settings, config=parallel.deepspeed_config(settings.config))
    apply_to_engine(engine, state, ep_size=ep_size, rank=rank)
    meta = target_meta(state, world_size=world, ep_size=ep_size, deepspeed_config=settings.config,
                       branch_parallel=branch_parallel)
    CheckpointManager(Path(out_dir) / "checkpoints", keep_last=1, rank=rank, world_size=world).save(
        engine, TrainingState(step=meta.step, samples=meta.samples), FixedBatchLoader(), meta)


class ResumableLoader(FixedBatchLoader):
    def load_state_dict(self, state: dict) -> None:
        assert state == {}, state


def resume(out_prefix: str, tag_dirs: list[Path]) -> None:
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    for index, tag_dir in enumerate(tag_dirs):
        source = CheckpointSource.open(tag_dir, "--resume", purpose=RESUME)  # its files checked, its state complete
        config = source.meta.deepspeed_config
        engine, _ = build(source.meta.ep_size, config["zero_optimization"]["stage"], world,
                          "bf16" if (config.get("bf16") or {}).get("enabled") else "fp32")
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
    init_distributed()
    if args[0] == "relayout":
        for spec in args[1:]:
            relayout(spec)
    else:
        resume(args[1], [Path(a) for a in args[2:]])
    torch.distributed.barrier()  # every rank exits together (see convert_make_checkpoint.py)
