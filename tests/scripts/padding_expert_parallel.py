"""Run by the deepspeed launcher: a WideNet with a given ep_size (no engine), one training forward + backward
per dispatch on this rank's slice of a padded batch, twice: with the batch's padding ids, and with other ids
in the same padding positions. Saves per dispatch and batch the classifier logits, the balance loss, the
routing statistics and the router's and this rank's experts' gradients."""

import sys

import torch
from safetensors.torch import save_file

from widenet_ds.distributed.groups import init_distributed
from widenet_ds.model.config import ModelConfig
from widenet_ds.model.widenet import WideNetForSequenceClassification

DISPATCHES = ("deepspeed", "dropless")


def padded_batch(rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, the same ids with other padding ids, attention mask): a third to half of the positions padding."""
    gen = torch.Generator().manual_seed(300 + rank)
    ids = torch.randint(5, 300, (4, 24), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, 8:] = 0
    mask[2, 14:] = 0
    mask[3, 20 - 4 * rank:] = 0                             # the ranks' real-token counts differ
    other = ids.masked_fill(mask == 0, 0) + torch.randint(0, 300, ids.shape, generator=gen) * (mask == 0)
    return ids, other, mask


def build(ep_size: int, dispatch: str) -> WideNetForSequenceClassification:
    torch.manual_seed(2024)
    cfg = ModelConfig.from_preset("widenet-tiny-e4", vocab_size=300, hidden_dropout=0.0, attention_dropout=0.0,
                                  classifier_dropout=0.0,
                                  moe={"dispatch": dispatch, "noise": "none", "capacity_factor": 0.5, "min_capacity": 0})
    model = WideNetForSequenceClassification(cfg, num_labels=2, ep_size=ep_size)
    model.ensure_process_groups()
    return model.train()


def run(ep_size: int, rank: int) -> dict[str, torch.Tensor]:
    ids, other, mask = padded_batch(rank)
    labels = torch.tensor([0, 1, 1, 0])
    results = {}
    for dispatch in DISPATCHES:
        model = build(ep_size, dispatch)
        for name, batch in (("a", ids), ("b", other)):
            out = model(batch, attention_mask=mask, labels=labels)
            out.loss.backward()
            key = f"{dispatch}.{name}"
            results.update({f"{key}.logits": out.logits.detach(), f"{key}.balance_loss": out.balance_loss.detach(),
                            f"{key}.expert_counts": out.routing.expert_counts,
                            f"{key}.dropped_fraction": out.routing.dropped_fraction})
            for pname, p in model.named_parameters():
                if p.grad is not None and ("moe" in pname):
                    results[f"{key}.grad.{pname}"] = p.grad.clone()
            model.zero_grad()
    return {k: v.contiguous() for k, v in results.items()}


def main(out_prefix: str, ep_size: int) -> None:
    init_distributed()
    rank = torch.distributed.get_rank()
    save_file(run(ep_size, rank), f"{out_prefix}.rank{rank}.safetensors")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]  # the launcher adds --local_rank
    main(args[0], int(args[1]))
    # Every rank exits together: a gloo group torn down while a peer still writes aborts that peer at exit.
    torch.distributed.barrier()
