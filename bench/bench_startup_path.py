"""How much of widenet_ds a run passes through before it trains: from `widenet_ds.train.main` to the first
optimizer step of a 1-step, 1-rank pretraining run, counted with `sys.setprofile` (Python calls only).

    .venv/bin/python bench/bench_startup_path.py [--data DIR]

Prints the distinct `widenet_ds` modules entered, the calls into `widenet_ds` functions, and the modules with
the most calls. Deterministic for one checkout (it counts calls, not time), so two checkouts compare side by
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


def count(argv: list[str]) -> tuple[collections.Counter, int]:
    package = str(REPO / "widenet_ds")
    calls: collections.Counter = collections.Counter()

    def profile(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if code.co_filename.startswith(package):
            calls[os.path.relpath(code.co_filename, REPO)] += 1
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
    return calls, sum(calls.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="a prepared data folder (default: prepared from the embedded corpus)")
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
        calls, total = count(argv)
    result = {"modules": len(calls), "calls": total, "top": calls.most_common(12)}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"start-up path (main() -> first optimizer step): {result['modules']} widenet_ds modules, "
              f"{result['calls']} calls")
        for module, n in result["top"]:
            print(f"  {n:6d}  {module}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
