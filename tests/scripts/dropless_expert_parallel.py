"""Run by the deepspeed launcher: a WideNet with a given ep_size and dispatches (dropless; compact or deepspeed
at capacity factor 0.5, so that every rank drops routes), one training forward + backward on this rank's slice
of a fixed batch (no engine: gradients are this rank's own, not all-reduced); saves the logits, the loss, the
routing counts and every gradient this rank holds (experts under their global index)."""

import sys

import torch
from safetensors.torch import save_file

from widenet_ds.distributed.groups import init_distributed
from widenet_ds.model.config import ModelConfig
from widenet_ds.model.moe import MoEFeedForward
from widenet_ds.model.widenet import WideNetForPreTraining


def fixed_batch(rank: int):
    gen = torch.Generator().manual_seed(200 + rank)
    ids = torch.randint(0, 300, (4, 32), generator=gen)
    mask = torch.ones_like(ids)
    mask[2, 24:] = 0
    labels = torch.where(torch.rand(ids.shape, generator=gen) < 0.15, ids, torch.full_like(ids, -100))
    return ids, mask, labels, torch.tensor([1, 0, 1, 0])


def build(ep_size: int, dispatch: str = "dropless") -> WideNetForPreTraining:
    torch.manual_seed(4321)
    capacity = {} if dispatch == "dropless" else {"capacity_factor": 0.5}
    cfg = ModelConfig.from_preset("widenet-tiny-e4", vocab_size=300, classifier_dropout=0.0, routing_groups=2,
                                  moe={"dispatch": dispatch, "noise": "none", **capacity})
    model = WideNetForPreTraining(cfg, ep_size=ep_size)
    model.ensure_process_groups()
    return model.train()


def gradients(model: WideNetForPreTraining) -> dict[str, torch.Tensor]:
    """Every parameter's gradient; expert parameters named by their global expert index."""
    grads = {}
    for module_name, module in model.named_modules():
        if isinstance(module, MoEFeedForward):
            for expert, index in zip(module.experts, module.global_expert_indices()):
                for name, p in expert.named_parameters():
                    grads[f"{module_name}.expert{index}.{name}"] = p.grad
    experts = {id(p) for m in model.modules() if isinstance(m, MoEFeedForward) for p in m.experts.parameters()}
    grads.update({n: p.grad for n, p in model.named_parameters() if id(p) not in experts and p.grad is not None})
    return grads


def run(model: WideNetForPreTraining, rank: int) -> dict[str, torch.Tensor]:
    ids, mask, labels, sop = fixed_batch(rank)
    out = model(ids, None, mask, labels, sop)
    out.loss.backward()
    return {"mlm_logits": out.mlm_logits.detach().contiguous(), "loss": out.loss.detach().reshape(1),
            "expert_counts": out.routing.expert_counts, "dropped_fraction": out.routing.dropped_fraction,
            **{f"grad.{n}": g.contiguous() for n, g in gradients(model).items()}}


def main(out_prefix: str, ep_size: int, dispatches: list[str]) -> None:
    """Each dispatch in turn (one launch): `{out_prefix}.{dispatch}.rank{rank}.safetensors`."""
    init_distributed()
    rank = torch.distributed.get_rank()
    for dispatch in dispatches:
        save_file(run(build(ep_size, dispatch), rank), f"{out_prefix}.{dispatch}.rank{rank}.safetensors")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]  # the launcher adds --local_rank
    main(args[0], int(args[1]), args[2:] or ["dropless"])
    # Every rank exits together: a gloo group torn down while a peer still writes aborts that peer at exit.
    torch.distributed.barrier()
