"""The image half of the WideNet study on CPU, paired over seeds: the paper's Table 1 and Table 3 comparisons at
Fashion-MNIST scale, and ParaFormer's training schedules with their compression curves.

    PYTHONPATH=. .venv/bin/python scripts/image_study.py --output runs/image_study --seeds 3 --jobs 2

1. Table 1 / Table 3: ViT, ViT-MoE (MoE in the last 2 of 6 blocks), WideNet, and WideNet with a shared LayerNorm,
   without MoE and without cross-block sharing, all at the tiny Fashion-MNIST dims (d 96, 6 blocks, 49 patches of
   4 px, the authors' router), trained with the same seeds (a seed sets the initial weights, the data order, the
   augmentation and the router's noise) for `--steps` steps and tested on all 10,000 test images at four points
   of the run, so the table shows whether accuracy has stopped moving.
2. ParaFormer: `paraformer-tiny` (d 64, 12 layers) as 3x4, 4x3, 6x2 and 12x1 branches x layers (the layouts of
   its Table 1), each under the three schedules (`prefix`: the authors' code, two cycles of N prefix steps per
   batch then one joint step per batch; `staged`: branch i+1 joins at i x S, every branch in by mid-run; `joint`:
   every branch from the start, the control), and the sequential ViT12 of the same code (1x12); same seeds, same
   optimizer steps; the test accuracy of the first k branches at the end (the compression curve).
3. The analysis: every comparison as a paired mean difference over the seeds with a 95% Student-t interval,
   resolved only when the interval excludes 0 (widenet_ds/report/paired.py).
4. `image_study.json` (every number, the commit of every run), `image_tables.md` and the plots in the output
   folder; `--archive DIR` copies them there (docs/reproduction/).

Every run is `python -m widenet_ds.train classify` on one process and one thread; `--jobs` run side by side. A
run already done (its summary on disk) is skipped, so an interrupted study continues where it stopped and the
analysis can be rewritten from the runs' files at no training cost.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.figure import Figure
from study import (
    CONFIDENCE,
    FIRST_SEED,
    REPO,
    archive,
    error_spans,
    git_state,
    interval,
    log,
    verdict,
    write_ds_config,
)

from widenet_ds.distributed.launch_env import TORCH_VARS  # noqa: E402
from widenet_ds.report.paired import mean_interval, paired_difference  # noqa: E402
from widenet_ds.run_folder import RunFolder  # noqa: E402
from widenet_ds.tasks.classify.config import ClassifyConfig  # noqa: E402
from widenet_ds.tasks.classify.results import ClassifyResults  # noqa: E402
from widenet_ds.training.run_config import LATEST  # noqa: E402
from widenet_ds.vision.config import VisionConfig  # noqa: E402
from widenet_ds.vision.model import build_model, count_trainable_parameters  # noqa: E402

TABLE3_DS = REPO / "ds_configs" / "vision_cpu_small.json"
PARAFORMER_DS = REPO / "ds_configs" / "paraformer_cpu_small.json"  # ZeRO 0: prefix / staged need it
BATCH = 64
SEQUENTIAL = "vit12"


@dataclass(frozen=True)
class ImageModel:
    name: str
    preset: str
    overrides: dict = field(default_factory=dict)
    schedule: str = "joint"  # ParaFormer's branch schedule

    @property
    def config(self) -> VisionConfig:
        return VisionConfig.from_preset(self.preset, **self.overrides)


# ViT-MoE at tiny scale: WideNet's dims and router, nothing shared, MoE in the last 2 blocks (as vit-moe-b16).
TABLE3 = (
    ImageModel("vit", "vit-tiny"),
    ImageModel("vit-moe", "widenet-vit-tiny", {"share_attention": False, "share_ffn": False, "moe_blocks": 2}),
    ImageModel("widenet", "widenet-vit-tiny"),
    ImageModel("widenet-shared-ln", "widenet-vit-tiny", {"share_layernorm": True}),
    ImageModel("widenet-no-moe", "widenet-vit-tiny-no-moe"),
    ImageModel("widenet-no-sharing", "widenet-vit-tiny", {"share_attention": False, "share_ffn": False}),
)
LAYOUTS = ((3, 4), (4, 3), (6, 2), (12, 1))
SCHEDULES = ("prefix", "staged", "joint")
PARAFORMER = (ImageModel(SEQUENTIAL, "paraformer-tiny-1x12"),) + tuple(
    ImageModel(f"pf-{n}x{depth}-{schedule}", "paraformer-tiny-1x12", {"num_branches": n}, schedule)
    for n, depth in LAYOUTS for schedule in SCHEDULES)


@dataclass(frozen=True)
class Claim:
    claim: str
    variant: str
    reference: str
    paper: str
    metric: str = "test_accuracy"  # or "first_branch_accuracy": the compression curve at k = 1


# The paper's numbers: WideNet Tables 1 and 3 (ImageNet-1K top-1, B / L / H), ParaFormer Table 1 (Fashion-MNIST).
CLAIMS = (
    Claim("Table 1: WideNet level with ViT at a third of the parameters", "widenet", "vit",
          "WideNet-B 77.5 (29M) vs ViT-B 78.6 (87M): -1.1"),
    Claim("Table 1: WideNet level with ViT-MoE at a quarter of the parameters", "widenet", "vit-moe",
          "WideNet-B 77.5 (29M) vs ViT-MoE-B 77.9 (128M): -0.4"),
    Claim("Table 1: MoE does not help ViT on a small data set", "vit-moe", "vit", "ViT-MoE-B 77.9 vs ViT-B 78.6: -0.7"),
    Claim("Table 3: shared LayerNorm hurts", "widenet-shared-ln", "widenet", "-1.2 / -1.2 / -3.5"),
    Claim("Table 3: removing the MoE hurts", "widenet-no-moe", "widenet", "diverged / -2.6 / -1.1"),
    Claim("Table 3: no cross-block sharing", "widenet-no-sharing", "widenet", "+0.4 / -2.1 / OOM"),
    *(Claim(f"ParaFormer Table 1: PF {n}x{depth} (prefix) vs ViT12", f"pf-{n}x{depth}-prefix", SEQUENTIAL, paper)
      for (n, depth), paper in zip(LAYOUTS, ("94.08 vs 93.90: +0.18", "93.94 vs 93.90: +0.04",
                                             "93.40 vs 93.90: -0.50", "91.75 vs 93.90: -2.15"))),
    *(Claim(f"Progressive training: PF {n}x{depth}, {schedule} vs joint", f"pf-{n}x{depth}-{schedule}",
            f"pf-{n}x{depth}-joint", "no joint control reported; the gain is credited to progressive training",
            metric)
      for n, depth in LAYOUTS for schedule in ("prefix", "staged")
      for metric in ("test_accuracy", "first_branch_accuracy")),
)
METRICS = {"test_accuracy": "test accuracy (%)", "first_branch_accuracy": "first branch alone: test accuracy (%)"}


def schedule_settings(model: ImageModel, steps: int) -> dict:
    n = model.config.num_branches
    if model.schedule == "prefix":  # two cycles: (N prefix steps per batch) x B batches, then B joint steps
        return {"branch_schedule": "prefix", "prefix_cycle_batches": max(1, steps // (2 * (n + 1)))}
    if model.schedule == "staged":  # branch i+1 joins at i x S: the last one at mid-run
        return {"branch_schedule": "staged", "stage_steps": [max(1, steps // (2 * (n - 1)))]}
    return {}


def run_folder(out: Path, part: str, model: ImageModel, seed: int) -> Path:
    return out / part / f"{model.name}-seed{seed}"


def steps_on_disk(run_dir: Path) -> int | None:
    """The --max-steps a finished run was started with (None: not finished)."""
    done = run_dir / "study_done.json"
    if not done.is_file():
        return None
    command = json.loads(done.read_text())["command"]
    return int(command[command.index("--max-steps") + 1])


def train(model: ImageModel, part: str, steps: int, seed: int, out: Path, data: str | None,
          eval_examples: int | None = None) -> dict:
    run_dir = run_folder(out, part, model, seed)
    done = run_dir / "study_done.json"
    if done.is_file():
        return json.loads(done.read_text())
    run_dir.mkdir(parents=True, exist_ok=True)
    config = model.config
    config.to_json(run_dir / "study_model.json")
    ds = write_ds_config(TABLE3_DS if part == "table3" else PARAFORMER_DS, run_dir / "study_ds.json", steps, BATCH)
    evals = 4 if part == "table3" else 1  # the accuracy curve of the Table 3 models; ParaFormer: the end only
    cfg = ClassifyConfig(model_config=str(run_dir / "study_model.json"), deepspeed_config=ds, output_dir=run_dir,
                         max_steps=steps, log_interval=max(1, steps // 20), eval_interval=steps // evals,
                         save_interval=steps, keep_last=1, workers=0, flip=True, seed=seed, tensorboard=False,
                         progress_bar=False, resume=LATEST, data=data or None, max_eval_examples=eval_examples or None,
                         **schedule_settings(model, steps))
    command = [sys.executable, "-m", "widenet_ds.train", cfg.TASK, *cfg.to_argv()]
    git = git_state()
    start = time.perf_counter()
    # a job of its own: never the rendezvous of whatever started the study (a launcher's or a test's MASTER_PORT)
    env = {**{k: v for k, v in os.environ.items() if k not in TORCH_VARS}, "PYTHONPATH": str(REPO),
           "OMP_NUM_THREADS": "1"}
    with open(run_dir / "console.log", "a") as console:
        finished = subprocess.run(command, cwd=REPO, env=env, stdout=console, stderr=subprocess.STDOUT)
    if finished.returncode:
        raise RuntimeError(f"{model.name} seed {seed} failed (exit {finished.returncode}): see {run_dir / 'console.log'}")
    folder = RunFolder(run_dir)
    results = folder.read_results(ClassifyResults)
    curve = {}
    for record in folder.read_metrics().records:  # the final evaluation repeats the last interval's: one per step
        if "test/accuracy" in record:
            curve[record["step"]] = 100 * record["test/accuracy"]
    by_branches = {str(k): 100 * v for k, v in results.accuracy_by_branches.items()}  # "k": as in JSON
    summary = {"part": part, "model": model.name, "preset": model.preset, "overrides": model.overrides,
               "schedule": model.schedule, "branches": config.num_branches, "seed": seed, "steps": results.step,
               "params": count_trainable_parameters(build_model(config, device="meta")),
               "test_accuracy": 100 * results.accuracy, "test_loss": results.test["test/task_loss"],
               "curve": sorted(curve.items()), "accuracy_by_branches": by_branches,
               "first_branch_accuracy": by_branches.get("1"), "seconds": time.perf_counter() - start,
               "run_dir": str(run_dir), "command": command[1:], **git}
    done.write_text(json.dumps(summary, indent=2))
    return summary


# --- analysis ---------------------------------------------------------------------------------------------
def by_seed(runs: list[dict], model: str) -> dict[int, dict]:
    return {r["seed"]: r for r in runs if r["model"] == model}


def compare(runs: list[dict]) -> list[dict]:
    rows = []
    for claim in CLAIMS:
        mine, other = by_seed(runs, claim.variant), by_seed(runs, claim.reference)
        seeds = sorted(s for s in set(mine) & set(other)
                       if mine[s][claim.metric] is not None and other[s][claim.metric] is not None)
        if not seeds:
            continue
        diff = paired_difference([mine[s][claim.metric] for s in seeds], [other[s][claim.metric] for s in seeds],
                                 CONFIDENCE)
        rows.append({"claim": claim.claim, "variant": claim.variant, "reference": claim.reference,
                     "paper": claim.paper, "metric": METRICS[claim.metric], "seeds": seeds, "mean": diff.mean,
                     "low": diff.low, "high": diff.high, "resolved": diff.resolved,
                     "better": None if not diff.resolved else diff.mean > 0})
    return rows


def model_rows(runs: list[dict], models: tuple[ImageModel, ...]) -> list[dict]:
    rows = []
    for model in models:
        seeds = by_seed(runs, model.name)
        if not seeds:
            continue
        ordered = [seeds[s] for s in sorted(seeds)]
        accuracy = mean_interval([r["test_accuracy"] for r in ordered], CONFIDENCE)
        steps = [step for step, _ in ordered[0]["curve"]]
        curve = [sum(dict(r["curve"])[step] for r in ordered) / len(ordered) for step in steps
                 if all(step in dict(r["curve"]) for r in ordered)]
        branches = sorted(ordered[0]["accuracy_by_branches"], key=int)  # JSON keys: "1", "2", …, "10" in order
        compression = [mean_interval([r["accuracy_by_branches"][k] for r in ordered], CONFIDENCE) for k in branches]
        rows.append({"model": model.name, "schedule": model.schedule, "branches": ordered[0]["branches"],
                     "params": ordered[0]["params"], "steps": ordered[0]["steps"], "seeds": sorted(seeds),
                     "per_seed": [r["test_accuracy"] for r in ordered], "mean": accuracy.mean, "low": accuracy.low,
                     "high": accuracy.high, "curve_steps": steps[:len(curve)], "curve": curve,
                     "compression": [{"k": int(k), "mean": c.mean, "low": c.low, "high": c.high}
                                     for k, c in zip(branches, compression)],
                     "minutes": sum(r["seconds"] for r in ordered) / len(ordered) / 60})
    return rows


def tables(study: dict) -> str:
    lines = [f"Fashion-MNIST, batch {BATCH}, one thread per run; seeds {study['seeds']}; intervals: "
             f"{CONFIDENCE:.0%} Student t over the seeds (paired by seed for differences); resolved = the interval "
             f"excludes 0. Test accuracy on {study['test_images']} test images.", ""]
    for part, title in (("table3", "WideNet's Tables 1 and 3"), ("paraformer", "ParaFormer's schedules")):
        rows = study["models"][part]
        if not rows:
            continue
        steps = rows[0]["curve_steps"]
        lines += [f"### {title}: test accuracy (%), mean over seeds [{CONFIDENCE:.0%} interval]", "",
                  "| model | params | steps | per seed | mean | " + (
                      " | ".join(f"at step {s}" for s in steps) if part == "table3" else "first k = 1, 2, … branches")
                  + " | minutes per run |",
                  "|---|---:|---:|---|---:|" + ("---:|" * len(steps) if part == "table3" else "---|") + "---:|"]
        for row in rows:
            cells = (" | ".join(f"{a:.2f}" for a in row["curve"]) if part == "table3"
                     else ", ".join(f"{c['mean']:.1f}" for c in row["compression"]) or "–")
            lines.append(f"| {row['model']} | {row['params']:,} | {row['steps']} | "
                         f"{', '.join(f'{a:.2f}' for a in row['per_seed'])} | {interval(row, 2, False)} | {cells} | "
                         f"{row['minutes']:.1f} |")
        lines.append("")
    lines += [f"### The papers' claims: variant minus reference, paired by seed, mean [{CONFIDENCE:.0%} interval]", "",
              "| claim | variant − reference | metric | paper | ours | seeds | verdict |", "|---|---|---|---|---:|---:|---|"]
    lines += [f"| {r['claim']} | {r['variant']} − {r['reference']} | {r['metric']} | {r['paper']} | "
              f"{interval(r, 2)} | {len(r['seeds'])} | {verdict(r)} |" for r in study["comparisons"]]
    lines += ["", "(better / worse: for the variant; higher accuracy is better)", ""]
    return "\n".join(lines)


def plots(study: dict, folder: Path) -> list[str]:
    """The Table 3 models' test-accuracy curves and their paired differences to WideNet; ParaFormer's compression
    curves per layout, one line per schedule, with the sequential ViT12 as a line."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    rows = study["models"]["table3"]
    if rows:
        fig = Figure(figsize=(12, 4.6), layout="constrained")
        curves, bars = fig.subplots(1, 2)
        for row in rows:
            curves.plot(row["curve_steps"], row["curve"], marker="o", label=row["model"])
        curves.set_xlabel("optimizer step")
        curves.set_ylabel("test accuracy (%), mean over seeds")
        curves.set_title("has accuracy stopped moving?", fontsize="small")
        curves.legend(fontsize="x-small")
        against = [r for r in study["comparisons"] if r["reference"] == "widenet"]
        against += [{**r, "variant": r["reference"], "mean": -r["mean"], "low": -r["high"], "high": -r["low"]}
                    for r in study["comparisons"] if r["variant"] == "widenet"]
        _difference_bars(bars, against, "test accuracy of the model minus WideNet's (points)")
        written.append(_save(fig, folder, "image_study_table3.png"))
    rows = [r for r in study["models"]["paraformer"] if r["compression"]]
    if rows:
        fig = Figure(figsize=(4 * len(LAYOUTS), 4.2), layout="constrained")
        axes = fig.subplots(1, len(LAYOUTS), sharey=True)
        sequential = next((r for r in study["models"]["paraformer"] if r["model"] == SEQUENTIAL), None)
        for ax, (n, depth) in zip(axes, LAYOUTS):
            for row in (r for r in rows if r["branches"] == n):
                ks = [c["k"] for c in row["compression"]]
                means = [c["mean"] for c in row["compression"]]
                spans = error_spans(row["compression"])
                ax.errorbar(ks, means, yerr=spans, marker="o", capsize=3, label=row["schedule"])
            if sequential:
                ax.axhline(sequential["mean"], color="black", linestyle="--", linewidth=0.8, label="ViT12 (1x12)")
            ax.set_xlabel(f"branches kept (of {n})")
            ax.set_title(f"PF {n}x{depth}", fontsize="small")
            ax.legend(fontsize="x-small")
        axes[0].set_ylabel(f"test accuracy (%), mean over seeds, {CONFIDENCE:.0%} intervals")
        written.append(_save(fig, folder, "image_study_paraformer.png"))
    return written


def _difference_bars(ax, rows: list[dict], label: str) -> None:
    colors = ["#55a868" if r["resolved"] and r["mean"] > 0 else "#c44e52" if r["resolved"] else "#8c8c8c"
              for r in rows]
    ax.barh([r["variant"] for r in rows], [r["mean"] for r in rows], xerr=error_spans(rows), color=colors, capsize=3)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.invert_yaxis()
    ax.set_xlabel(label)
    ax.set_title(f"paired by seed, {CONFIDENCE:.0%} intervals; grey: interval contains 0", fontsize="small")


def _save(fig: Figure, folder: Path, name: str) -> str:
    fig.savefig(folder / name, dpi=100)
    return name


# --- main -------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, required=True, help="study folder (re-run to continue)")
    parser.add_argument("--parts", nargs="+", choices=("table3", "paraformer"), default=["table3", "paraformer"])
    parser.add_argument("--steps", type=int, default=1000, help="optimizer steps of the Table 3 models")
    parser.add_argument("--paraformer-steps", type=int, default=600, help="optimizer steps of the ParaFormer runs")
    parser.add_argument("--seeds", type=int, default=3, help="train every model with the seeds 1234 ... 1234+N-1")
    parser.add_argument("--jobs", type=int, default=1, help="runs side by side (one thread each)")
    parser.add_argument("--models", nargs="+", help="a subset of the models (default: all of the parts)")
    parser.add_argument("--data", help="Fashion-MNIST folder (default: the trainer's, Debian's package)")
    parser.add_argument("--max-eval-examples", type=int, help="test on the first N test images (default: all)")
    parser.add_argument("--archive", type=Path, help="also copy image_study.json, image_tables.md and the plots here")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.jobs < 1 or args.steps < 4 or args.paraformer_steps < 4:
        parser.error("--seeds and --jobs must be at least 1, the step counts at least 4")
    out = args.output.absolute()
    out.mkdir(parents=True, exist_ok=True)
    seeds = list(range(FIRST_SEED, FIRST_SEED + args.seeds))
    parts = {"table3": (TABLE3, args.steps), "paraformer": (PARAFORMER, args.paraformer_steps)}
    runs = [(model, part, parts[part][1], seed) for part in args.parts for seed in seeds
            for model in parts[part][0] if not args.models or model.name in args.models]
    for model, part, steps, seed in runs:  # one step count per folder: never a table of mixed runs
        ran = steps_on_disk(run_folder(out, part, model, seed))
        if ran not in (None, steps):
            parser.error(f"{run_folder(out, part, model, seed)} holds a run of {ran} steps, this study asks for "
                         f"{steps}: give the study another --output folder (one step count per folder)")
    start = time.perf_counter()
    log(f"{len(runs)} runs, {args.jobs} at a time; seeds {seeds}; output {out}", out)

    def one(run: tuple) -> dict:
        model, part, steps, seed = run
        summary = train(model, part, steps, seed, out, args.data, args.max_eval_examples)
        log(f"{part} {model.name} seed {seed}: test accuracy {summary['test_accuracy']:.2f} "
            f"({summary['seconds']:.0f} s)", out)
        return summary

    with ThreadPoolExecutor(args.jobs) as pool:
        summaries = list(pool.map(one, runs))
    study = {"seeds": seeds, "steps": {p: parts[p][1] for p in args.parts}, "batch": BATCH, "runs": summaries,
             "test_images": args.max_eval_examples or "all 10,000",
             "models": {p: model_rows([s for s in summaries if s["part"] == p], parts[p][0]) for p in parts},
             "comparisons": compare(summaries), "seconds": time.perf_counter() - start, "written_at": git_state()}
    (out / "image_study.json").write_text(json.dumps(study, indent=2))
    (out / "image_tables.md").write_text(tables(study))
    written = plots(study, out / "plots")
    if args.archive:
        archive(out, args.archive, written, ("image_study.json", "image_tables.md"))
    log(f"done in {study['seconds'] / 60:.1f} min: {out / 'image_tables.md'}, plots {written}", out)
    print((out / "image_tables.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
