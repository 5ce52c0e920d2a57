"""Issue 12's "no host sync" on a GPU: a WideNet bf16 forward + backward under
`torch.cuda.set_sync_debug_mode("error")` (any device -> host synchronisation raises), per dispatch.

    python bench/check_sync.py --preset widenet-base-e4 --batch 64
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import init_single_rank, machine  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="widenet-base-e4")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("check_sync.py needs CUDA", file=sys.stderr)
        return 2
    from widenet_ds.model.config import ModelConfig
    from widenet_ds.model.widenet import WideNetForPreTraining
    init_single_rank()
    print(f"# sync check: {machine()}; {args.preset} bf16, batch {args.batch} x seq {args.seq}")
    failures = 0
    for dispatch in ("deepspeed", "compact", "dropless"):
        torch.manual_seed(0)
        cfg = ModelConfig.from_preset(args.preset, moe={"dispatch": dispatch})
        model = WideNetForPreTraining(cfg)
        model.ensure_process_groups()
        model = model.cuda().to(torch.bfloat16).train()
        ids = torch.randint(5, cfg.vocab_size, (args.batch, args.seq), device="cuda")
        labels = torch.where(torch.rand(ids.shape, device="cuda") < 0.15, ids, -100)
        sop = torch.randint(0, 2, (args.batch,), device="cuda")
        model(ids, mlm_labels=labels, sop_labels=sop).loss.backward()  # warm-up: lazy initialisations may sync
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            model(ids, mlm_labels=labels, sop_labels=sop).loss.backward()
            print(f"{dispatch}: forward + backward without a host sync")
        except RuntimeError as error:
            failures += 1
            print(f"{dispatch}: HOST SYNC: {error}")
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
