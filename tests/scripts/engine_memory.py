"""Run by the deepspeed launcher: real DeepSpeed engines of widenet-tiny-e4, one per layout given as
ZERO:PRECISION:EP (e.g. 1:bf16:2), each trained two steps of two micro-batches; this rank's bytes at the gradient
peak (tests/support/engine_bytes.py) for each layout, written to OUT.rank<R>.json."""

import json
import sys

import torch

from tests.support.engine_bytes import bytes_at_the_gradient_peak
from widenet_ds.distributed.groups import init_distributed
from widenet_ds.engine.build import build_engine
from widenet_ds.engine.ds_config import validate_ds_config
from widenet_ds.model.config import ModelConfig
from widenet_ds.model.widenet import WideNetForPreTraining

VOCAB, MICRO, SEQ = 300, 4, 32


def layout_config(zero: int, precision: str, world: int) -> dict:
    """cpu_small.json's LAMB and clipping, 2 micro-batches of 4 per rank; small reduce buckets (DeepSpeed's 5e8
    elements would be reserved per backward)."""
    config = {"train_batch_size": 2 * MICRO * world, "train_micro_batch_size_per_gpu": MICRO, "gradient_clipping": 1.0,
              "steps_per_print": 10**6, "optimizer": {"type": "Lamb", "params": {"lr": 0.01, "weight_decay": 0.01}},
              "zero_optimization": {"stage": zero, "reduce_bucket_size": 100000}, "zero_allow_untested_optimizer": True}
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    return config


def main(out: str, layouts: list[str]) -> None:
    init_distributed()
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    measured = {}
    for layout in layouts:
        zero, precision, ep = layout.split(":")
        torch.manual_seed(0)
        model = WideNetForPreTraining(ModelConfig.from_preset("widenet-tiny-e4", vocab_size=VOCAB), ep_size=int(ep))
        ds = validate_ds_config(layout_config(int(zero), precision, world), world_size=world, has_moe=True,
                                cuda_available=False)
        engine, _ = build_engine(model, ds)
        measured[layout] = bytes_at_the_gradient_peak(engine, torch.Generator().manual_seed(rank), MICRO, SEQ, VOCAB)
        del engine
    with open(f"{out}.rank{rank}.json", "w") as file:
        json.dump(measured, file)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]  # the launcher adds --local_rank
    main(args[0], args[1:])
    # Every rank exits together: a gloo group torn down while a peer still writes aborts that peer at exit.
    torch.distributed.barrier()
