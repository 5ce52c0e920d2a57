"""Run by the deepspeed launcher: build a WideNet with a given ep_size inside a DeepSpeed engine and save
this rank's eval logits and loss on this rank's slice of a fixed batch."""

import sys

import deepspeed
import torch
from safetensors.torch import save_file

from widenet_ds.distributed.groups import init_distributed
from widenet_ds.model.config import ModelConfig
from widenet_ds.model.widenet import WideNetForPreTraining


def fixed_batch(rank: int):
    gen = torch.Generator().manual_seed(100 + rank)
    ids = torch.randint(0, 300, (4, 32), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 20:] = 0
    labels = torch.where(torch.rand(ids.shape, generator=gen) < 0.15, ids, torch.full_like(ids, -100))
    return ids, mask, labels, torch.tensor([0, 1, 1, 0])


def build(ep_size: int) -> WideNetForPreTraining:
    torch.manual_seed(1234)
    return WideNetForPreTraining(ModelConfig.from_preset("widenet-tiny-e4", vocab_size=300), ep_size=ep_size)


def main(out_prefix: str, ep_size: int) -> None:
    init_distributed()
    rank = torch.distributed.get_rank()
    engine, *_ = deepspeed.initialize(model=build(ep_size), config={"train_micro_batch_size_per_gpu": 4})
    engine.eval()
    ids, mask, labels, sop = fixed_batch(rank)
    with torch.no_grad():
        out = engine(ids, None, mask, labels, sop)
    save_file({"mlm_logits": out.mlm_logits.contiguous(), "sop_logits": out.sop_logits.contiguous(),
               "loss": out.loss.reshape(1), "expert_counts": out.routing.expert_counts},
              f"{out_prefix}.rank{rank}.safetensors")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]  # the launcher adds --local_rank
    main(args[0], int(args[1]))
    # Every rank exits together: a gloo group torn down while a peer still writes aborts that peer at exit.
    torch.distributed.barrier()
