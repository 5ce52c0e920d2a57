"""The DeepSpeed ops that jobs build on a GPU node, for each DeepSpeed JSON given (default: ds_configs/*.json), as
`./launcher.sh setup --gpu` prints them (docs/gpu.md). An op is JIT-built at its first use, into
<venv>/torch_extensions (engine/extensions.py), unless it was pre-built at install with its DS_BUILD_* switch.

    .venv/bin/python scripts/gpu_ops.py [JSON ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from widenet_ds.engine.build import optimizer_op, plan_optimizer
from widenet_ds.engine.ds_config import load_ds_config, validate_ds_config
from widenet_ds.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent


def ops_by_json(paths: list[Path]) -> dict[str | None, list[str]]:
    """op (None: none) -> the JSONs whose engine loads it on a GPU, with `--optimizer auto`."""
    found: dict[str | None, list[str]] = {}
    for path in paths:
        # the world size only sets the accumulation steps; 1 divides every shipped batch
        settings = validate_ds_config(load_ds_config(path), world_size=1, has_moe=True, cuda_available=True)
        found.setdefault(optimizer_op(settings, plan_optimizer(settings, "auto", True)), []).append(path.name)
    return found


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or sorted((REPO / "ds_configs").glob("*.json"))
    try:
        found = ops_by_json(paths)
    except ConfigError as err:
        print(f"scripts/gpu_ops.py: {err}", file=sys.stderr)
        return 2
    print("DeepSpeed ops the jobs build on a GPU node (JIT at first use unless pre-built):")
    for op in sorted(found, key=lambda op: (op is None, op or "")):
        switch = f"{op} (DS_BUILD_{op.upper()}=1)" if op else "no op (our LAMB under ZeRO, or torch's optimizer)"
        print(f"  {switch}: {' '.join(found[op])}")
    if "fused_lamb" not in found:
        print("  fused_lamb (DS_BUILD_FUSED_LAMB=1): a Lamb JSON at ZeRO stage 0, or --optimizer deepspeed-fused")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
