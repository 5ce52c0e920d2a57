"""A reproducible small-scale WideNet study on CPU: the paper's Table 2 comparison and Table 3 ablations.

    PYTHONPATH=. .venv/bin/python scripts/study.py --output runs/study --scale 1.0

1. Data: a WordPiece vocabulary and MLM+SOP examples from the shared corpus (WikiText-2 valid/test and
   five Gutenberg books, `$WIDENET_SHARED_DATA/corpus`).
2. Pretraining of six models of the same small dimensions (H 128, 4 blocks, embeddings 64): WideNet (E 4,
   top-2), ALBERT, BERT with factorized embeddings, and WideNet with a shared LayerNorm, without MoE, and
   without cross-block sharing. Once at equal steps, and once at equal training FLOPs: the models that
   cost less per token than WideNet (the dense ones) get proportionally more steps.
3. Finetuning of every pretrained model on SST-2, MRPC, RTE, STS-B and CoLA (median of 3 seeds, dev sets)
   and a SQuAD v1.1 slice (trained on the questions of the first articles of the v1.1 dev file, scored on
   later, unseen articles: the shared data has no SQuAD train set).
4. `study.json` (every number), `tables.md` (the tables), `plots/` (bar charts) and `report/` (the
   `widenet-ds report` page of every run) in the output folder.

Everything runs in this one process on 1 rank (a gloo group of 1): no launcher start-up per run. A stage
already done (its results on disk) is skipped, so an interrupted study continues where it stopped.
`--pretrain-seeds N` pretrains each model N times (seeds 1234, 1235, ...) for the spread of the held-out
MLM loss; only the first seed is finetuned.
`--scale` multiplies the step counts and example caps (1.0 is the full study, see docs/reproduction.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from widenet_ds.data.prepare import cli as prepare_cli  # noqa: E402
from widenet_ds.model import WideNetForPreTraining  # noqa: E402
from widenet_ds.model.config import ModelConfig  # noqa: E402
from widenet_ds.model.counts import count_parameters  # noqa: E402
from widenet_ds.model.counts import flops_per_token  # noqa: E402
from widenet_ds.report.cli import write_report  # noqa: E402
from widenet_ds.run_folder import RunFolder  # noqa: E402
from widenet_ds.runtime.distributed import init_distributed  # noqa: E402
from widenet_ds.training.command_line import parse  # noqa: E402
from widenet_ds.training.run import run_task  # noqa: E402

PRETRAIN_DS = REPO / "ds_configs" / "cpu_small.json"
FINETUNE_DS = REPO / "ds_configs" / "finetune_cpu_small.json"
SEQ_LENGTH = 64  # pretraining and finetuning (SQuAD windows too): the small scale is bound by CPU time
VOCAB_SIZE = 8000
SEEDS = 3  # finetuning seeds
FIRST_SEED = 1234  # the pretraining seed of every model (the trainer's default); --pretrain-seeds adds more


@dataclass(frozen=True)
class Variant:
    name: str
    preset: str
    overrides: dict
    paper: str  # what the paper says about it


VARIANTS = (
    Variant("widenet", "widenet-tiny-e4", {}, "Table 2: WideNet 4 experts, 26M params, avg 84.7"),
    Variant("albert", "albert-tiny", {}, "Table 2: ALBERT, 12M params, avg 84.0"),
    Variant("bert-factorized", "bert-tiny-factorized", {}, "Table 2: BERT (factorized embeddings), 89M, avg 85.0"),
    Variant("widenet-shared-ln", "widenet-tiny-e4", {"share_layernorm": True},
            "Table 3 (ImageNet): w/ shared LayerNorm -1.2 / -1.2 / -3.5 top-1 (B / L / H)"),
    Variant("widenet-no-moe", "widenet-tiny-e4", {"ffn": "dense"},
            "Table 3 (ImageNet): w/o MoE: NaN (diverged) / -2.6 / -1.1 top-1"),
    Variant("widenet-no-sharing", "widenet-tiny-e4", {"share_attention": False, "share_ffn": False},
            "Table 3 (ImageNet): w/o parameter sharing +0.4 / -2.1 / OOM top-1, 4-10x the parameters"),
    # Table 2's expert-count trend: the tiny WideNet with more experts (no tiny e8/e16 preset: E overridden).
    Variant("widenet-e8", "widenet-tiny-e4", {"moe": {"num_experts": 8}}, "Table 2: WideNet 8 experts, 45M, avg 85.4"),
    Variant("widenet-e16", "widenet-tiny-e4", {"moe": {"num_experts": 16}},
            "Table 2: WideNet 16 experts, 84M, avg 85.5"),
    # The routing-groups ablation: one routing decision (at the first block) reused by all four blocks.
    Variant("widenet-routing-g1", "widenet-tiny-e4", {"routing_groups": 1},
            "not in the paper: every block reuses the first block's routing (routing_groups 1)"),
)
GLUE_TASKS = ("SST-2", "MRPC", "RTE", "STS-B", "CoLA")

# Scale 1.0 (the full study); --scale multiplies each, with the floor in the second column.
FULL = {"pretrain_steps": (600, 20), "finetune_steps": (100, 10), "train_examples": (3200, 256),
        "eval_examples": (1000, 128), "squad_train": (1600, 128), "squad_eval": (400, 64)}


def scaled(scale: float) -> dict[str, int]:
    return {name: max(floor, round(full * scale)) for name, (full, floor) in FULL.items()}


def log(message: str, out: Path) -> None:
    line = f"[study {time.strftime('%H:%M:%S')}] {message}"
    print(line, file=sys.stderr, flush=True)
    with open(out / "progress.log", "a") as f:
        f.write(line + "\n")


def write_ds_config(template: Path, path: Path, steps: int, batch: int) -> Path:
    """The template's optimizer with this run's schedule (10% warmup, linear decay to `steps`), 1 rank."""
    config = json.loads(template.read_text())
    config.pop("_comment", None)
    config.update(train_batch_size=batch, train_micro_batch_size_per_gpu=batch)
    config["scheduler"]["params"].update(total_num_steps=steps, warmup_num_steps=max(1, steps // 10))
    path.write_text(json.dumps(config, indent=2))
    return path


def model_config(variant: Variant, vocab_size: int) -> ModelConfig:
    return ModelConfig.from_preset(variant.preset, vocab_size=vocab_size, **variant.overrides)


def training_flops_per_token(cfg: ModelConfig) -> float:
    return flops_per_token(cfg, SEQ_LENGTH).training


def parameter_count(cfg: ModelConfig) -> int:
    with torch.device("meta"):
        return count_parameters(WideNetForPreTraining(cfg))["total"]


@contextlib.contextmanager
def quiet(path: Path):
    """The runs' own console output goes to a log file beside their results."""
    with open(path, "a") as f, contextlib.redirect_stdout(f):
        yield


# --- stages -----------------------------------------------------------------------------------------
def prepare(shared: Path, out: Path, workers: int) -> Path:
    data = out / "data"
    if (data / "manifest.json").is_file():
        return data
    corpus = shared / "corpus"
    sources = sorted((corpus / "wikitext-2").glob("*.tokens")) + sorted((corpus / "books").glob("*.txt"))
    args = [a for s in sources for a in ("--source", str(s))]
    args += ["--tokenizer", "train", "--vocab-size", str(VOCAB_SIZE), "--seq-length", str(SEQ_LENGTH),
             "--valid-fraction", "0.02", "--output", str(data), "--workers", str(workers), "--seed", "1",
             "--no-progress"]
    with quiet(out / "data.log"):
        assert prepare_cli(args) == 0, "prepare-data failed (see data.log)"
    return data


def git_commit() -> str:
    """The commit the stage ran at (with "+dirty" when the work tree had changes)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True).stdout.strip()
    commit = git("rev-parse", "HEAD") or "unknown"
    return commit + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def pretrain(variant: Variant, steps: int, budget: str, data: Path, out: Path, seed: int = FIRST_SEED) -> dict:
    # The first seed's folder has no suffix (and is the one finetuned); further seeds only pretrain.
    run_dir = out / "pretrain" / (f"{variant.name}-{budget}" + ("" if seed == FIRST_SEED else f"-seed{seed}"))
    done = run_dir / "study_done.json"
    if done.is_file():
        return {"seed": FIRST_SEED, **json.loads(done.read_text())}  # studies before --pretrain-seeds
    run_dir.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((data / "manifest.json").read_text())
    cfg = model_config(variant, manifest["vocab_size"])
    cfg.to_json(run_dir / "study_model.json")
    ds = write_ds_config(PRETRAIN_DS, run_dir / "study_ds.json", steps, batch=16)
    start = time.perf_counter()
    with quiet(run_dir / "console.log"):
        assert run_task(parse("pretrain", [
            "--model-config", str(run_dir / "study_model.json"), "--deepspeed_config", str(ds), "--data", str(data),
            "--output-dir", str(run_dir), "--max-steps", str(steps), "--log-interval", str(max(1, steps // 40)),
            "--eval-interval", str(_eval_interval(steps)), "--eval-batches", "8", "--save-interval", str(steps),
            "--keep-last", "1", "--seed", str(seed), "--no-tensorboard", "--no-progress-bar", "--resume"])) is not None
    records = RunFolder(run_dir).read_metrics().records
    valid = [r for r in records if "valid/mlm_loss" in r][-1]
    train = [r for r in records if "train/mlm_loss" in r][-1]
    summary = {"variant": variant.name, "budget": budget, "seed": seed, "steps": steps, "params": parameter_count(cfg),
               "train_flops_per_token": training_flops_per_token(cfg), "seconds": time.perf_counter() - start,
               "train_mlm_loss": train["train/mlm_loss"], "valid_mlm_loss": valid["valid/mlm_loss"],
               "valid_mlm_accuracy": valid["valid/mlm_accuracy"], "valid_sop_accuracy": valid["valid/sop_accuracy"],
               "run_dir": str(run_dir), "commit": git_commit()}
    done.write_text(json.dumps(summary, indent=2))
    return summary


def _eval_interval(steps: int) -> int:
    """About 4 held-out evaluations, the last one at the final step."""
    return next(d for d in range(max(1, steps // 4), steps + 1) if steps % d == 0)


def squad_split(shared: Path, out: Path) -> tuple[Path, Path]:
    """Train on the first 40 articles of the v1.1 dev file, score on the last 8 (unseen articles)."""
    folder = out / "data" / "squad"
    train, dev = folder / "train-slice-v1.1.json", folder / "dev-slice-v1.1.json"
    if not dev.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        full = json.loads((shared / "squad" / "dev-v1.1.json").read_text())
        train.write_text(json.dumps({"version": "1.1", "data": full["data"][:40]}))
        dev.write_text(json.dumps({"version": "1.1", "data": full["data"][40:]}))
    return train, dev


def finetune(pre: dict, task: str, shared: Path, data: Path, out: Path, sizes: dict[str, int]) -> dict:
    run_dir = out / "finetune" / f"{pre['variant']}-{pre['budget']}" / task.lower().replace("-", "")
    folder = RunFolder(run_dir)
    if not folder.results.is_file():
        run_dir.mkdir(parents=True, exist_ok=True)
        steps = sizes["finetune_steps"]
        ds = write_ds_config(FINETUNE_DS, run_dir.parent / f"study_ds_{run_dir.name}.json", steps, batch=32)
        common = ["--init-from", pre["run_dir"], "--tokenizer", str(data), "--deepspeed_config", str(ds),
                  "--output-dir", str(run_dir), "--max-steps", str(steps), "--seeds", str(SEEDS),
                  "--log-interval", str(max(1, steps // 10)), "--max-seq-length", str(SEQ_LENGTH),
                  # the study's small schedule is not the paper's recipe on purpose
                  "--allow-recipe-mismatch", "--no-tensorboard", "--no-progress-bar",
                  "--resume"]  # a stage stopped part-way continues where it was (finished seeds are kept)
        with quiet(run_dir.parent / "console.log"):
            if task == "SQuAD1.1":
                train, dev = squad_split(shared, out)
                results = run_task(parse("squad", [
                    "--version", "1.1", "--data", str(dev), "--train-file", str(train), "--dev-file", str(dev),
                    "--max-train-examples", str(sizes["squad_train"]), "--max-eval-examples",
                    str(sizes["squad_eval"]), "--doc-stride", "16", *common]))
            else:
                results = run_task(parse("glue", [
                    "--task", task, "--data", str(shared / "glue" / task),
                    "--max-train-examples", str(sizes["train_examples"]),
                    "--max-eval-examples", str(sizes["eval_examples"]), *common]))
        assert results is not None, (f"finetuning {task} of {pre['variant']} stopped (see "
                                     f"{run_dir.parent / 'console.log'})")
    results = folder.read_results()
    split = "dev"
    metric = "f1" if task == "SQuAD1.1" else results["primary_metric"]
    scores = [run["metrics"][split][metric] for run in results["per_seed"]]
    scale100 = 1.0 if task == "SQuAD1.1" else 100.0  # SQuAD scores are already percentages
    return {"task": task, "metric": metric, "median": statistics.median(scores) * scale100,
            "seeds": [s * scale100 for s in scores],
            "exact_match": (results["median"][split].get("exact_match") if task == "SQuAD1.1" else None),
            "baseline": _baseline(results, split, metric, scale100), "run_dir": str(run_dir)}


def _baseline(results: dict, split: str, metric: str, scale100: float) -> float | None:
    value = (results.get("baseline") or {}).get(split, {}).get(metric)
    return None if value is None else value * scale100


# --- tables and plots ---------------------------------------------------------------------------------
def tables(study: dict) -> str:
    tasks = [t for t in [*GLUE_TASKS, "SQuAD1.1"] if any(f["task"] == t for f in study["finetune"])]
    # A continued study skips finished stages: its own wall time is not the study's.
    pretraining = sum(p["seconds"] for p in study["pretrain"] if p["run_dir"].endswith(f"-{p['budget']}"))
    pretraining += sum(p["seconds"] for p in study.get("pretrain_seeds") or [])
    lines = [f"Scale {study['scale']}: {json.dumps(study['sizes'])}; pretraining stages {pretraining / 60:.1f} min "
             f"(their own times), this invocation {study['seconds'] / 60:.1f} min, on {study['threads']} thread(s).",
             ""]
    for budget in ("steps", "flops"):
        rows = [p for p in study["pretrain"] if p["budget"] == budget]
        title = "equal steps" if budget == "steps" else "equal training FLOPs (WideNet's budget)"
        lines += [f"### Pretraining, {title}", "",
                  "| model | params | train MFLOPs/token | steps | held-out MLM loss | MLM acc | SOP acc | minutes |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for p in rows:
            lines.append(f"| {p['variant']} | {p['params'] / 1e6:.2f}M | {p['train_flops_per_token'] / 1e6:.2f} | "
                         f"{p['steps']} | {p['valid_mlm_loss']:.3f} | {p['valid_mlm_accuracy']:.3f} | "
                         f"{p['valid_sop_accuracy']:.3f} | {p['seconds'] / 60:.1f} |")
        lines += ["", f"### Finetuning (median of {SEEDS} seeds, dev), pretrained at {title}", "",
                  "| model | " + " | ".join(_task_header(t, study) for t in tasks) + " | GLUE avg |",
                  "|---|" + "---:|" * (len(tasks) + 1)]
        for p in rows:
            scores = {f["task"]: f for f in study["finetune"] if f["variant"] == p["variant"] and f["budget"] == budget}
            glue = [scores[t]["median"] for t in GLUE_TASKS if t in scores]
            cells = [f"{scores[t]['median']:.1f}" if t in scores else "–" for t in tasks]
            avg = f"{statistics.mean(glue):.1f}" if len(glue) == len(GLUE_TASKS) else "–"
            lines.append(f"| {p['variant']} | " + " | ".join(cells) + f" | {avg} |")
        baselines = {f["task"]: f["baseline"] for f in study["finetune"]}
        lines.append("| *trivial baseline* | " + " | ".join(
            "–" if baselines.get(t) is None else f"{baselines[t]:.1f}" for t in tasks) + " | |")
        lines.append("")
    return "\n".join(lines + seed_table(study))


def seed_table(study: dict) -> list[str]:
    """Held-out MLM loss over pretraining seeds, for the runs pretrained with more than one."""
    extra = study.get("pretrain_seeds") or []
    keys = sorted({(p["variant"], p["budget"]) for p in extra}, key=lambda k: (k[1], k[0]))
    if not keys:
        return []
    lines = ["### Pretraining seeds: held-out MLM loss", "",
             "| model | budget | seeds | MLM loss per seed | mean | sd |", "|---|---|---:|---|---:|---:|"]
    for variant, budget in keys:
        first = next(p for p in study["pretrain"] if p["variant"] == variant and p["budget"] == budget)
        runs = [first, *sorted((p for p in extra if (p["variant"], p["budget"]) == (variant, budget)),
                               key=lambda p: p["seed"])]
        losses = [p["valid_mlm_loss"] for p in runs]
        lines.append(f"| {variant} | {budget} | {', '.join(str(p['seed']) for p in runs)} | "
                     f"{', '.join(f'{x:.3f}' for x in losses)} | {statistics.mean(losses):.3f} | "
                     f"{statistics.stdev(losses):.3f} |")
    return [*lines, ""]


def _task_header(task: str, study: dict) -> str:
    metric = next((f["metric"] for f in study["finetune"] if f["task"] == task), "")
    return f"{task} ({metric})"


def plots(study: dict, folder: Path, names: list[str]) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for budget in ("steps", "flops"):
        pre = {p["variant"]: p for p in study["pretrain"] if p["budget"] == budget}
        fig = Figure(figsize=(11, 4.2), layout="constrained")
        ax_loss, ax_glue = fig.subplots(1, 2, width_ratios=[1, 2])
        ax_loss.bar(names, [pre[n]["valid_mlm_loss"] for n in names], color="#4c72b0")
        ax_loss.set_title("held-out MLM loss (lower is better)")
        ax_loss.set_ylim(min(pre[n]["valid_mlm_loss"] for n in names) * 0.95,
                         max(pre[n]["valid_mlm_loss"] for n in names) * 1.02)
        ax_loss.tick_params(axis="x", rotation=35)
        tasks = [t for t in [*GLUE_TASKS, "SQuAD1.1"] if any(f["task"] == t for f in study["finetune"])]
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            scores = {f["task"]: f["median"] for f in study["finetune"] if f["variant"] == name and f["budget"] == budget}
            ax_glue.bar([t + i * width for t in range(len(tasks))], [scores.get(t, 0) for t in tasks], width,
                        label=name)
        ax_glue.set_xticks([t + 0.4 - width / 2 for t in range(len(tasks))])
        ax_glue.set_xticklabels([_task_header(t, study) for t in tasks], fontsize="small")
        unscored = [n for n in names if not any(f["variant"] == n and f["budget"] == budget for f in study["finetune"])]
        ax_glue.set_title(f"finetuning, median of {SEEDS} seeds (x100; SQuAD F1)"
                          + (f"\nnot finetuned at this budget: {', '.join(unscored)}" if unscored else ""))
        ax_glue.axhline(0, color="black", linewidth=0.5)
        ax_glue.legend(fontsize="x-small", ncol=2)
        fig.suptitle("equal pretraining steps" if budget == "steps" else "equal pretraining FLOPs")
        file = f"study_{budget}.png"
        fig.savefig(folder / file, dpi=100)
        written.append(file)
    return written


# --- main -------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, required=True, help="study folder (re-run to continue)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies steps and example caps (1.0: full)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch CPU threads")
    parser.add_argument("--shared-data", type=Path,
                        default=Path(os.environ.get("WIDENET_SHARED_DATA", REPO.parent / "shared" / "data")))
    parser.add_argument("--variants", nargs="+", choices=[v.name for v in VARIANTS],
                        help="a subset of the models (default: all)")
    parser.add_argument("--tasks", nargs="+", choices=[*GLUE_TASKS, "SQuAD1.1"], help="a subset of the tasks")
    parser.add_argument("--pretrain-seeds", type=int, default=1,
                        help="pretrain each model with this many seeds (the first one is finetuned; the others "
                             "give the spread of the held-out MLM loss). Further seeds found on disk from an "
                             "earlier invocation are reported too")
    parser.add_argument("--budgets", nargs="+", choices=("steps", "flops"), default=["steps", "flops"],
                        help="pretraining budgets: equal steps, and equal training FLOPs (WideNet's) for the models "
                             "that cost less per token (default both)")
    parser.add_argument("--finetune-budgets", nargs="*", choices=("steps", "flops"), default=["steps", "flops"],
                        help="finetune the models pretrained at these budgets (default both; the others are "
                             "compared on held-out MLM loss only; none: pretraining only)")
    args = parser.parse_args(argv)
    if args.scale <= 0:
        parser.error("--scale must be positive")
    if args.pretrain_seeds < 1:
        parser.error("--pretrain-seeds must be at least 1")
    for needed in ("corpus/wikitext-2", "corpus/books", "glue/SST-2", "squad/dev-v1.1.json"):
        if not (args.shared_data / needed).exists():
            parser.error(f"{args.shared_data / needed} not found: pass --shared-data (or set WIDENET_SHARED_DATA) "
                         f"to the shared data folder with corpus/, glue/ and squad/")
    out = args.output.absolute()
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    sizes = scaled(args.scale)
    variants = [v for v in VARIANTS if not args.variants or v.name in args.variants]
    tasks = args.tasks or [*GLUE_TASKS, "SQuAD1.1"]
    start = time.perf_counter()
    log(f"scale {args.scale}: {sizes}; output {out}", out)

    init_distributed()
    data = prepare(args.shared_data, out, workers=args.threads)
    vocab = json.loads((data / "manifest.json").read_text())["vocab_size"]
    log(f"data ready ({vocab} tokens) at {time.perf_counter() - start:.0f} s", out)

    # Equal FLOPs: WideNet's training FLOPs at its step count is the budget of every model.
    reference = training_flops_per_token(model_config(VARIANTS[0], vocab))
    runs = []
    for variant in variants if "steps" in args.budgets else ():
        runs.append((variant, sizes["pretrain_steps"], "steps"))
    for variant in variants if "flops" in args.budgets else ():
        flops_steps = round(sizes["pretrain_steps"] * reference / training_flops_per_token(model_config(variant, vocab)))
        if flops_steps != sizes["pretrain_steps"]:
            runs.append((variant, flops_steps, "flops"))
    study = {"scale": args.scale, "sizes": sizes, "threads": args.threads, "pretrain": [], "finetune": [],
             "pretrain_seeds": []}
    for variant, steps, budget in runs:
        summary = pretrain(variant, steps, budget, data, out)
        study["pretrain"].append(summary)
        log(f"pretrained {variant.name} ({budget}, {steps} steps): held-out MLM loss "
            f"{summary['valid_mlm_loss']:.3f} in {summary['seconds']:.0f} s", out)
        for task in tasks if budget in args.finetune_budgets else ():
            result = {"variant": variant.name, "budget": budget,
                      **finetune(summary, task, args.shared_data, data, out, sizes)}
            study["finetune"].append(result)
            log(f"  {task}: {result['metric']} median {result['median']:.1f} (seeds "
                f"{', '.join(f'{s:.1f}' for s in result['seeds'])})", out)
    for variant, steps, budget in runs:  # the spread over pretraining seeds
        for seed in range(FIRST_SEED + 1, FIRST_SEED + args.pretrain_seeds):
            summary = pretrain(variant, steps, budget, data, out, seed)
            log(f"pretrained {variant.name} ({budget}, {steps} steps, seed {seed}): held-out MLM loss "
                f"{summary['valid_mlm_loss']:.3f} in {summary['seconds']:.0f} s", out)
        for done in sorted((out / "pretrain").glob(f"{variant.name}-{budget}-seed*/study_done.json")):
            study["pretrain_seeds"].append(json.loads(done.read_text()))
    # Models whose FLOPs equal WideNet's (no equal-FLOPs rerun) stand in both tables with the same run.
    for variant in variants:
        if not any(p["variant"] == variant.name and p["budget"] == "flops" for p in study["pretrain"]):
            same = next(p for p in study["pretrain"] if p["variant"] == variant.name and p["budget"] == "steps")
            study["pretrain"].append({**same, "budget": "flops"})
            study["finetune"] += [{**f, "budget": "flops"} for f in study["finetune"]
                                  if f["variant"] == variant.name and f["budget"] == "steps"]
    study["seconds"] = time.perf_counter() - start
    study["paper"] = {v.name: v.paper for v in variants}
    (out / "study.json").write_text(json.dumps(study, indent=2))
    (out / "tables.md").write_text(tables(study))
    study_plots = plots(study, out / "plots", [v.name for v in variants])

    finetune_dirs = sorted(p for p in (out / "finetune").glob("*") if p.is_dir())
    page, _ = write_report([out / "pretrain", *finetune_dirs], out / "report", "WideNet study: pretraining and finetuning")
    log(f"done in {study['seconds'] / 60:.1f} min: {out / 'tables.md'}, plots {study_plots}, report {page}", out)
    print((out / "tables.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
