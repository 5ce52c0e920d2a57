"""`python tests/scripts/golden_variants.py OUTPUT VARIANT [VARIANT ...] [--runs NAME ...]`: the golden runs
(tests/support/golden_curves.py) under other arithmetic or with a one-line real change, each curve written to
OUTPUT/VARIANT/NAME.txt, and each curve's largest distance from its stored asset printed in float32 ulps.

The measurements behind the golden tolerance (tests/assets/README.md):
- arithmetic variants, the code unchanged: `native` (this CPU's own kernels, one thread per rank, as the tests
  run them), `aten-default` / `aten-avx2` / `aten-avx512` (ATen's kernels of that instruction set),
  `mkl-compatible` (MKL's SSE2 path), `avx2-cpu` (ATen, MKL and oneDNN all limited to AVX2, and glibc's
  AVX-512 variants off: an AVX2-only CPU such as AMD's Zen 3, as far as one can be emulated). With
  `--store`, their curves become tests/assets/losses/arithmetic/VARIANT/NAME.txt;
- real changes, each a one-line change a reviewer could miss, run under the tests' own arithmetic:
  `warmup+1` (one more warm-up step in the DeepSpeed JSON), `init-std-x1.01` (initializer_range x 1.01),
  `seed+1` (the next seed: other initial weights and data order). With `--store`, they become
  tests/assets/losses/changes/VARIANT/NAME.txt.
tests/integration/test_golden_losses.py checks that every stored variant passes the comparison and every
change fails it.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: the tests package and its support modules

from tests.conftest import shared_data_dir  # noqa: E402
from tests.support.golden_curves import (ASSETS, CHANGES, RUNS, VOCAB, GoldenRun, golden_args, read_asset,  # noqa: E402
                                         run_golden, ulps, write_asset)
from tests.support.pretrain_support import prepare_data  # noqa: E402

AVX2_CPU = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
            "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX512F,-AVX512DQ,-AVX512VL,-AVX512BW"}
ARITHMETIC = {
    "native": {}, "aten-default": {"ATEN_CPU_CAPABILITY": "default"},
    "aten-avx2": {"ATEN_CPU_CAPABILITY": "avx2"}, "aten-avx512": {"ATEN_CPU_CAPABILITY": "avx512"},
    "mkl-compatible": {"MKL_CBWR": "COMPATIBLE"}, "avx2-cpu": AVX2_CPU,
}
CHANGE_NAMES = ("warmup+1", "init-std-x1.01", "seed+1")


def _value_after(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def changed_args(change: str, run: GoldenRun, args: list[str], scratch: Path) -> tuple[list[str], str]:
    """The run's arguments with `change` applied, and the folder (under --output-dir) of its losses."""
    args = list(args)
    if change == "warmup+1":
        source = Path(_value_after(args, "--deepspeed_config"))
        config = json.loads(source.read_text())
        config["scheduler"]["params"]["warmup_num_steps"] += 1
        target = scratch / source.name
        target.write_text(json.dumps(config))
        args[args.index("--deepspeed_config") + 1] = str(target)
        return args, run.losses_dir
    if change == "init-std-x1.01":
        from widenet_ds.model.config import PRESETS, ModelConfig
        from widenet_ds.vision.config import VisionConfig

        preset = _value_after(args, "--model-config")
        cls = ModelConfig if preset in PRESETS else VisionConfig
        return [*args, "--set", f"initializer_range={cls.from_preset(preset).initializer_range * 1.01!r}"], run.losses_dir
    if change == "seed+1":
        seed = int(_value_after(args, "--seed")) + 1
        args[args.index("--seed") + 1] = str(seed)
        return args, re.sub(r"^seed\d+$", f"seed{seed}", run.losses_dir)
    raise ValueError(f"unknown change {change!r}; one of {CHANGE_NAMES}")


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "an unknown CPU"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output", type=Path)
    parser.add_argument("variants", nargs="+", choices=[*ARITHMETIC, *CHANGE_NAMES])
    parser.add_argument("--runs", nargs="+", choices=sorted(RUNS), default=sorted(RUNS))
    parser.add_argument("--store", action="store_true", help="keep the curves as assets (see above)")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="golden-variants-"))
    machine = f"{cpu_name()}, torch {torch.__version__}"
    values = {"data": prepare_data(scratch / "data", [], tokenizer=str(VOCAB)), "shared": shared_data_dir()}
    for variant in args.variants:
        for name in args.runs:
            run = RUNS[name]
            out = scratch / variant / name
            run_args = golden_args(run, out, values)
            env = ARITHMETIC.get(variant)
            if variant in CHANGE_NAMES:
                run_args, losses_dir = changed_args(variant, run, run_args, scratch)
                run = GoldenRun(run.entry, run.ranks, " ".join(run_args), losses_dir)
                env = {}
            losses = run_golden(run, out, values, env=env, args=run_args)
            header = f"{RUNS[name].command_line()} ({run.ranks} rank(s)), variant {variant}, measured on {machine}"
            write_asset(args.output / variant / f"{name}.txt", header, losses)
            if args.store:
                kept = CHANGES if variant in CHANGE_NAMES else CHANGES.parent / "arithmetic"
                write_asset(kept / variant / f"{name}.txt", header, losses)
            stored = read_asset(ASSETS / f"{name}.txt")
            distances = {step: ulps(stored[step], losses[step]) for step in stored}
            worst = max(distances, key=distances.get)
            moved = sum(d > 0 for d in distances.values())
            print(f"{variant:16s} {name:48s} steps moved {moved:2d}/20, largest {distances[worst]:10.1f} ulps "
                  f"(step {worst})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
