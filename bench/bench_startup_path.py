"""How much of widenet_ds a run passes through before it trains: from `widenet_ds.train.main` to the first
optimizer step of a 1-step, 1-rank pretraining run, counted with `sys.setprofile` (Python calls only).

    .venv/bin/python bench/bench_startup_path.py [--data DIR]

Prints the distinct `widenet_ds` modules and functions entered, the calls into them, and the modules (or with
`--functions`, the functions) with the most calls; `--until loop` stops at the loop's first micro-batch, leaving
out the first batch's data and model work. Deterministic for one checkout (it counts calls, not time), so two checkouts compare side by
side; the numbers of a checkout are in docs/benchmarks.md ("The start-up path").
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def prepare(folder: Path) -> Path:
    from widenet_ds.data.prepare import cli as prepare_cli

    assert prepare_cli(["--default-corpus", "--tokenizer", "train", "--vocab-size", "1000", "--seq-length", "64",
                        "--valid-fraction", "0.05", "--output", str(folder), "--workers", "1", "--no-progress"]) == 0
    return folder


class FirstStep(Exception):
    """Raised out of DeepSpeed's first `step()`: the counting ends there."""


def count(argv: list[str], until: str) -> tuple[collections.Counter, collections.Counter]:
    """Calls into widenet_ds per module and per function, from main() to DeepSpeed's first `step()` ("step") or to
    the loop's first micro-batch ("loop": start-up without the first batch's data and model work)."""
    package = str(REPO / "widenet_ds")
    modules: collections.Counter = collections.Counter()
    functions: collections.Counter = collections.Counter()

    def profile(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if code.co_filename.startswith(package):
            if until == "loop" and code.co_name == "micro_batch":
                raise FirstStep
            module = os.path.relpath(code.co_filename, REPO)
            modules[module] += 1
            functions[f"{module}:{code.co_name}"] += 1
        elif code.co_name == "step" and code.co_filename.endswith(os.path.join("deepspeed", "runtime", "engine.py")):
            raise FirstStep

    from widenet_ds import train  # imports are not counted: the walk starts at main()

    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        train.main(argv)
    except FirstStep:
        pass
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return modules, functions


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="a prepared data folder (default: prepared from the embedded corpus)")
    parser.add_argument("--until", choices=("step", "loop"), default="step",
                        help="count to DeepSpeed's first optimizer step (default) or to the loop's first micro-batch")
    parser.add_argument("--functions", action="store_true", help="list the most-called functions, not modules")
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    args = parser.parse_args()
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29731", "RANK": "0", "WORLD_SIZE": "1",
                        "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(name, value)
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data or prepare(Path(tmp) / "data")
        argv = ["pretrain", "--model-config", "widenet-tiny-e4", "--deepspeed_config",
                str(REPO / "ds_configs" / "cpu_small.json"), "--data", str(data), "--output-dir",
                str(Path(tmp) / "run"), "--max-steps", "1", "--no-progress-bar", "--no-tensorboard"]
        modules, functions = count(argv, args.until)
    top = (functions if args.functions else modules).most_common(25 if args.functions else 12)
    result = {"until": args.until, "modules": len(modules), "functions": len(functions),
              "calls": sum(modules.values()), "top": top}
    if args.json:
        print(json.dumps(result))
    else:
        end = "first optimizer step" if args.until == "step" else "the loop's first micro-batch"
        print(f"start-up path (main() -> {end}): {result['modules']} widenet_ds modules, {result['functions']} "
              f"functions, {result['calls']} calls")
        for name, n in top:
            print(f"  {n:6d}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
