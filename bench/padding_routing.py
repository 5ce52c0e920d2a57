"""Padding in the experts, measured on a GLUE task: the same finetuning run with padding kept out of the
experts (the default) and routed like real tokens (`--set moe.route_padding=true`, the paper-literal
routing), each over the same seeds. Reports per mode the median dev score over the seeds (results.json) and
the real tokens' routes dropped by capacity in the training forwards (train capacity factor) and the
evaluation forwards (eval capacity factor), counted at every routing call from the `Routing` the gate
returns, whatever the mode (the logged `moe/.../dropped_fraction` counts padding's routes too in the
literal mode), plus the slots padding took in the literal mode.

    python bench/padding_routing.py --out /tmp/pad -- --glue-task sst2 --data $SHARED/glue/SST-2 \
        --tokenizer $SHARED/vocab/bert-base-uncased-vocab.txt --model-config widenet-tiny-e4 \
        --deepspeed_config ds_configs/finetune_cpu_small.json --allow-recipe-mismatch --seeds 3 ...

One rank (the trainer runs in this process; a padding position is one whose input id is the pad id 0 of
BERT's vocabulary). Writes OUT/<mode>/ (the run folders) and OUT/padding_routing.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODES = {"masked": [], "route_padding": ["--set", "moe.route_padding=true"]}


class RouteCounter:
    """Global forward hooks: the embeddings' input ids give the call's real tokens; each gate's `Routing`
    gives its routes (expert_index -1: dropped, or padding's no-route)."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id
        self.real: torch.Tensor | None = None
        self.counts: Counter = Counter()

    def __call__(self, module, inputs, output) -> None:
        from widenet_ds.model.moe import WideNetGate
        from widenet_ds.model.widenet import FactorizedEmbeddings
        if isinstance(module, FactorizedEmbeddings):
            self.real = (inputs[0] != self.pad_id).reshape(-1)
        elif isinstance(module, WideNetGate):
            phase = "train" if module.training else "eval"
            k = output.expert_index.shape[0]
            real = self.real.expand(k, -1)
            routed = output.expert_index >= 0
            self.counts[f"{phase}/real_routes"] += int(real.sum())
            self.counts[f"{phase}/real_dropped"] += int((real & ~routed).sum())
            self.counts[f"{phase}/padding_routed"] += int((~real & routed).sum())
            self.counts[f"{phase}/slots"] += output.capacity * output.expert_counts.numel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--pad-id", type=int, default=0)
    parser.add_argument("glue_args", nargs=argparse.REMAINDER, help="after --: the glue task's flags")
    args = parser.parse_args()
    glue_args = [a for a in args.glue_args if a != "--"]

    from widenet_ds import train
    from widenet_ds.run_folder import RunFolder
    from widenet_ds.tasks.finetune.results import FinetuneResults
    report = {"command": " ".join(sys.argv), "modes": {}}
    for mode, extra in MODES.items():
        counter = RouteCounter(args.pad_id)
        handle = torch.nn.modules.module.register_module_forward_hook(counter)
        try:
            code = train.main(["glue", *glue_args, "--output-dir", str(args.out / mode), *extra])
        finally:
            handle.remove()
        if code:
            sys.exit(code)
        results = RunFolder(args.out / mode).read_results(FinetuneResults).to_json()
        counts = dict(counter.counts)
        for phase in ("train", "eval"):
            routes = counts.get(f"{phase}/real_routes", 0)
            counts[f"{phase}/real_dropped_fraction"] = counts.get(f"{phase}/real_dropped", 0) / max(routes, 1)
        report["modes"][mode] = {"results": results, "routes": counts}
        print(mode, json.dumps(counts), flush=True)
    (args.out / "padding_routing.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
