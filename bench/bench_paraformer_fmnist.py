"""ParaFormer on Fashion-MNIST at CPU scale: PF 3x4 and 4x3 against the sequential 12-layer ViT of the same
code (PF 1x12), and WideNet x ParaFormer (3x4 over one shared attention and one shared MoE). Not a CI test.

    PYTHONPATH=. .venv/bin/python bench/bench_paraformer_fmnist.py --steps 600 --output runs/bench_paraformer

Two budgets, each model trained by `python -m widenet_ds.train classify` on one process
(ds_configs/paraformer_cpu_small.json with the schedule fitted to the run's length, the same seed and data order):
* equal optimizer steps: every model takes --steps steps (ParaFormer: the authors' prefix schedule, phases of
  --cycle-batches batches; the sequential ViT: plain steps);
* equal wall-clock: each ParaFormer model gets as many steps as fit into the sequential ViT's training time
  at its own measured seconds per step (from the first budget's runs).
Prints and writes (results.json, table.md, fig4_fmnist.png, branches.md, report/) test accuracy, test accuracy
of the first k branches (the paper's Fig. 4 compression curve), trainable parameters, training time, steps/s,
and the forward latency of a 256-image batch (eval mode, median of 20, measured side by side in this process).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from widenet_ds.report.branches import ACCURACY  # noqa: E402
from widenet_ds.report.cli import write_report  # noqa: E402
from widenet_ds.run_folder import RunFolder  # noqa: E402
from widenet_ds.tasks.classify.config import ClassifyConfig  # noqa: E402
from widenet_ds.tasks.classify.results import ClassifyResults  # noqa: E402
from widenet_ds.vision.config import VisionConfig  # noqa: E402
from widenet_ds.vision.model import build_model, count_trainable_parameters  # noqa: E402

SEQUENTIAL = "paraformer-tiny-1x12"
MODELS = (SEQUENTIAL, "paraformer-tiny-3x4", "paraformer-tiny-4x3", "widenet-paraformer-tiny-3x4")


def train(name: str, steps: int, args: argparse.Namespace, tag: str) -> dict:
    out = RunFolder(args.output / f"{name}-{tag}")
    ds = json.loads((REPO / "ds_configs" / "paraformer_cpu_small.json").read_text())
    ds["scheduler"]["params"].update(total_num_steps=steps, warmup_num_steps=max(1, steps // 10))
    ds_path = args.output / f"ds-{steps}.json"
    ds_path.write_text(json.dumps(ds))
    if not out.results.is_file():
        schedule = ({"branch_schedule": "prefix", "prefix_cycle_batches": args.cycle_batches}
                    if VisionConfig.from_preset(name).num_branches > 1 else {})
        cfg = ClassifyConfig(model_config=name, deepspeed_config=ds_path, output_dir=out.path, max_steps=steps,
                             log_interval=max(1, min(25, steps // 4)), eval_interval=0, save_interval=10 * steps, workers=0, progress_bar=False,
                             tensorboard=False, flip=True, seed=args.seed,
                             max_eval_examples=args.max_eval_examples or None, **schedule)
        cmd = [sys.executable, "-m", "widenet_ds.train", cfg.TASK, *cfg.to_argv()]
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(args.threads)}
        subprocess.run(cmd, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL)
    results = out.read_results(ClassifyResults)
    records = [r for r in out.read_metrics().records if "perf/samples_per_second" in r]
    # seconds per step between the first and the last logged step (start-up, data decoding, the first
    # step's allocations and the final evaluation excluded), times the steps taken (>= 2 steps: >= 2 records)
    first, last = records[0], records[-1]
    per_step = (last["time"] - first["time"]) / max(1, last["step"] - first["step"])
    seconds = per_step * results.step
    return {"model": name, "budget": tag, "steps": results.step, "test_accuracy": results.accuracy,
            # "k" keys, as in results.json; None without branches
            "accuracy_by_branches": {str(k): a for k, a in results.accuracy_by_branches.items()} or None,
            "train_seconds": seconds,
            "seconds_per_step": per_step,
            "last_train_loss": records[-1]["train/task_loss"], "run_dir": str(out.path)}


def forward_latency_ms(name: str, threads: int, batch: int = 256, repeats: int = 20) -> float:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = build_model(VisionConfig.from_preset(name)).eval()
    pixels = torch.randn(batch, 1, 28, 28)
    times = []
    with torch.no_grad():
        for i in range(repeats + 3):
            start = time.perf_counter()
            model(pixels)
            if i >= 3:
                times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=600, help="at least 2 (the time per step is measured)")
    parser.add_argument("--cycle-batches", type=int, default=25, help="prefix schedule: batches per phase")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--max-eval-examples", type=int, default=None)
    parser.add_argument("--output", type=Path, default=REPO / "runs" / "bench_paraformer")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be at least 2: the seconds per step are measured between two logged steps")
    args.output.mkdir(parents=True, exist_ok=True)
    print(f"load average at start: {os.getloadavg()}", flush=True)
    latency = {name: forward_latency_ms(name, args.threads) for name in MODELS}
    rows = []
    for name in MODELS:
        rows.append(train(name, args.steps, args, "equal-steps"))
        print(json.dumps(rows[-1]), flush=True)
    budget = rows[0]["train_seconds"]  # the sequential ViT's training time
    for row in list(rows[1:]):
        steps = max(2, round(args.steps * budget / row["train_seconds"]))
        rows.append(train(row["model"], steps, args, "equal-time"))
        print(json.dumps(rows[-1]), flush=True)
    for row in rows:
        row["parameters"] = count_trainable_parameters(build_model(VisionConfig.from_preset(row["model"]),
                                                                   device="meta"))
        row["forward_ms_256"] = latency[row["model"]]
    lines = ["| model | budget | steps | params | test acc | acc with k = 1, 2, ... branches | train s | steps/s | "
             "forward ms (256 images) |", "|---|---|---:|---:|---:|---|---:|---:|---:|"]
    for row in rows:
        curve = row["accuracy_by_branches"]
        curve_text = ", ".join(f"{curve[k]:.3f}" for k in sorted(curve, key=int)) if curve else "-"
        lines.append(f"| {row['model']} | {row['budget']} | {row['steps']} | {row['parameters']:,} | "
                     f"{row['test_accuracy']:.4f} | {curve_text} | {row['train_seconds']:.0f} | "
                     f"{row['steps'] / row['train_seconds']:.2f} | {row['forward_ms_256']:.1f} |")
    table = "\n".join(lines)
    print(table)
    print(f"load average at end: {os.getloadavg()}")
    (args.output / "table.md").write_text(table + "\n")
    (args.output / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    # The paper's Fig. 4, accuracy of the first k branches (equal-steps runs; the sequential ViT has one
    # branch): the ParaFormer section of the runs' report, its plot copied under the name the docs use.
    branched = [Path(r["run_dir"]) for r in rows if r["accuracy_by_branches"] and r["budget"] == "equal-steps"]
    write_report(branched, args.output / "report", "ParaFormer on Fashion-MNIST (equal steps)",
                 branches_table=args.output / "branches.md")
    shutil.copy(args.output / "report" / ACCURACY.plot_file, args.output / "fig4_fmnist.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
