"""`legacy_logits.py INPUTS OUT`: load tests/assets/legacy_folder with today's code, compute the MLM/SOP
logits of the fixed input in INPUTS (a safetensors file) with the old code's routing (padding routed,
`moe.route_padding = true`) and with today's default (prefix "masked."), and save them, with the load
report, to OUT (tests/checkpoint/test_load_legacy.py runs it in a process of its own)."""

import json
import sys
from pathlib import Path

from widenet_ds.engine.quiet import quiet_third_party

quiet_third_party()  # before DeepSpeed is imported

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from widenet_ds.checkpoint.source import load_pretrained  # noqa: E402
from widenet_ds.distributed.groups import init_distributed  # noqa: E402
from widenet_ds.model.widenet import WideNetForPreTraining  # noqa: E402

FOLDER = Path(__file__).resolve().parents[1] / "assets" / "legacy_folder"


def main(inputs: Path, out: Path) -> None:
    init_distributed()  # DeepSpeed's MoE all-to-all needs a (1-rank) process group
    batch = load_file(inputs)
    results = {}
    # The old code routed padding like a token (moe.route_padding = true); today's default keeps it out.
    for prefix, overrides in (("", {"moe": {"route_padding": True}}), ("masked.", None)):
        model, report = load_pretrained(WideNetForPreTraining, FOLDER, model_overrides=overrides)
        model.eval()
        with torch.no_grad():
            logits = model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                           attention_mask=batch["attention_mask"])
        results.update({f"{prefix}mlm_logits": logits.mlm_logits.contiguous(),
                        f"{prefix}sop_logits": logits.sop_logits.contiguous()})
    report = {"new": sorted(report.new), "unused": sorted(report.unused), "saved_ep_size": report.saved_ep_size}
    save_file(results, out, metadata={"report": json.dumps(report)})


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
