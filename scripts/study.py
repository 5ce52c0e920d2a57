"""A reproducible small-scale WideNet study on CPU: the paper's Table 2 comparison (and its expert-count trend),
the Table 3 ablations, the routing-groups ablation and the LayerNorm analysis (eq. 9), paired over seeds.

    PYTHONPATH=. .venv/bin/python scripts/study.py --output runs/study --scale 1.0 --pretrain-seeds 3

1. Data: a WordPiece vocabulary and MLM+SOP examples from the shared corpus (WikiText-2 valid/test and
   five Gutenberg books, `$WIDENET_SHARED_DATA/corpus`).
2. Pretraining of nine models of the same small dimensions (H 128, 4 blocks, embeddings 64): WideNet (E 4,
   top-2) and with E 8 / 16, ALBERT, BERT with factorized embeddings, and WideNet with a shared LayerNorm,
   without MoE, without cross-block sharing, and with one routing decision for all blocks (routing groups 1).
   Every model with the same `--pretrain-seeds` seeds (1234, 1235, ...; a seed sets the initial weights and the
   data order), so that two models are compared seed by seed. At equal steps, and (`--budgets flops`) at equal
   training FLOPs: the models that cost less per token than WideNet (the dense ones) get proportionally more steps.
3. Finetuning of every pretrained model (every pretraining seed) on SST-2, MRPC, RTE, STS-B and CoLA (the median
   of `--finetune-seeds` finetuning seeds, dev sets) and a SQuAD v1.1 slice (trained on the questions of the first
   articles of the v1.1 dev file, scored on later, unseen articles: the shared data has no SQuAD train set).
4. The analysis: every comparison of the paper as a paired mean difference over the pretraining seeds with a
   95% Student-t interval, called resolved only when the interval excludes 0 (widenet_ds/report/paired.py); the
   LayerNorm divergence of eq. 9 (widenet_ds/model/layernorm_divergence.py) from the trained checkpoints.
5. `study.json` (every number, the commit of every stage), `tables.md`, `plots/` and `report/` (the
   `widenet-ds report` page of every run) in the output folder; `--archive DIR` copies study.json, tables.md and
   the plots there (docs/reproduction/).

Everything runs in this one process on 1 rank (a gloo group of 1): no launcher start-up per run. A stage
already done (its results on disk) is skipped, so an interrupted study continues where it stopped, and the
analysis can be rewritten from the runs' files at no training cost.
`--scale` multiplies the step counts and example caps (1.0 is the full study, see docs/reproduction.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from widenet_ds.checkpoint.source import CONVERT, CheckpointSource  # noqa: E402
from widenet_ds.data.manifest import MANIFEST_FILE, read_manifest  # noqa: E402
from widenet_ds.data.prepare import cli as prepare_cli  # noqa: E402
from widenet_ds.distributed.groups import init_distributed  # noqa: E402
from widenet_ds.model import WideNetForPreTraining  # noqa: E402
from widenet_ds.model.config import ModelConfig  # noqa: E402
from widenet_ds.model.counts import count_parameters, flops_per_token  # noqa: E402
from widenet_ds.model.layernorm_divergence import layernorm_divergence  # noqa: E402
from widenet_ds.report.cli import write_report  # noqa: E402
from widenet_ds.report.paired import format_interval, mean_interval, paired_difference  # noqa: E402
from widenet_ds.run.run_task import run_task  # noqa: E402
from widenet_ds.run_folder import RunFolder  # noqa: E402
from widenet_ds.tasks.finetune.results import FinetuneResults  # noqa: E402
from widenet_ds.tasks.glue.config import GlueConfig  # noqa: E402
from widenet_ds.tasks.pretrain.config import PretrainConfig  # noqa: E402
from widenet_ds.tasks.squad.config import SquadConfig  # noqa: E402
from widenet_ds.training.run_config import LATEST  # noqa: E402

PRETRAIN_DS = REPO / "ds_configs" / "cpu_small.json"
FINETUNE_DS = REPO / "ds_configs" / "finetune_cpu_small.json"
SEQ_LENGTH = 64  # pretraining and finetuning (SQuAD windows too): the small scale is bound by CPU time
VOCAB_SIZE = 8000
FIRST_SEED = 1234  # the first pretraining seed of every model (the trainer's default); --pretrain-seeds adds more
CONFIDENCE = 0.95


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
    Variant("widenet-e8", "widenet-tiny-e4", {"moe": {"num_experts": 8}}, "Table 2: WideNet 8 experts, 45M, avg 85.2"),
    Variant("widenet-e16", "widenet-tiny-e4", {"moe": {"num_experts": 16}},
            "Table 2: WideNet 16 experts, 83M, avg 85.8"),
    # The routing-groups ablation (the paper's Fig. 3, ImageNet): every block reuses the first block's routing.
    Variant("widenet-routing-g1", "widenet-tiny-e4", {"routing_groups": 1},
            "Fig. 3 (ImageNet): fewer routing groups, an obvious top-1 drop"),
)
GLUE_DATASETS = ("SST-2", "MRPC", "RTE", "STS-B", "CoLA")


@dataclass(frozen=True)
class Comparison:
    """One claim of the paper: `variant` against `reference`, paired by pretraining seed."""

    claim: str
    variant: str
    reference: str
    paper: str  # the paper's number for the same comparison


COMPARISONS = (
    Comparison("Table 2: WideNet above ALBERT", "widenet", "albert", "GLUE/SQuAD avg 84.7 vs 84.0: +0.7"),
    Comparison("Table 2: BERT above WideNet (E 4)", "widenet", "bert-factorized", "avg 84.7 vs 85.0: -0.3"),
    Comparison("Table 2: more experts, better (E 8 vs E 4)", "widenet-e8", "widenet", "avg 85.2 vs 84.7: +0.5"),
    Comparison("Table 2: more experts, better (E 16 vs E 4)", "widenet-e16", "widenet", "avg 85.8 vs 84.7: +1.1"),
    Comparison("Table 2: WideNet E 8 above ALBERT", "widenet-e8", "albert", "avg 85.2 vs 84.0: +1.2"),
    Comparison("Table 2: WideNet E 16 above ALBERT", "widenet-e16", "albert", "avg 85.8 vs 84.0: +1.8"),
    Comparison("Table 2: WideNet E 8 vs BERT", "widenet-e8", "bert-factorized", "avg 85.2 vs 85.0: +0.2"),
    Comparison("Table 2: WideNet E 16 above BERT", "widenet-e16", "bert-factorized", "avg 85.8 vs 85.0: +0.8"),
    Comparison("Table 3: shared LayerNorm hurts", "widenet-shared-ln", "widenet",
               "ImageNet top-1 -1.2 / -1.2 / -3.5 (B / L / H)"),
    Comparison("Table 3: removing the MoE hurts", "widenet-no-moe", "widenet", "diverged / -2.6 / -1.1"),
    Comparison("Table 3: no cross-block sharing", "widenet-no-sharing", "widenet", "+0.4 / -2.1 / OOM"),
    Comparison("Fig. 3: fewer routing groups hurt (G 1 vs 4)", "widenet-routing-g1", "widenet",
               "an obvious top-1 drop (ImageNet, figure only)"),
)
# Pretraining metrics compared (lower_is_better); finetuning tasks are compared on their GLUE metric.
PRETRAIN_METRICS = {"valid_mlm_loss": ("held-out MLM loss", True), "valid_mlm_accuracy": ("held-out MLM accuracy",
                                                                                          False)}
# Eq. 9 on the LayerNorm in front of the FFN / MoE: post-LN blocks compute x = LN_att(x + MHA(x)), then the FFN
# reads x, so it is the attention LayerNorm; the block's output LayerNorm is reported beside it.
LAYERNORMS = {"before_ffn": "attention_norm", "after_ffn": "ffn_norm"}
LAYERNORM_REFERENCES = ("widenet-no-sharing", "bert-factorized")  # unshared models (the paper's ViT)

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


def git_state() -> dict:
    """The commit a stage ran at, and the tracked files that differed from it then."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True).stdout.strip()
    return {"commit": git("rev-parse", "HEAD") or "unknown",
            "changed_files": git("diff", "HEAD", "--name-only").splitlines()}


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


def seed_suffix(seed: int) -> str:
    # The first seed's folders have no suffix (studies before paired seeds had only that one).
    return "" if seed == FIRST_SEED else f"-seed{seed}"


# --- stages -----------------------------------------------------------------------------------------
def prepare(shared: Path, out: Path, workers: int) -> Path:
    data = out / "data"
    if (data / MANIFEST_FILE).is_file():
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


def pretrain(variant: Variant, steps: int, budget: str, data: Path, out: Path, seed: int = FIRST_SEED) -> dict:
    run_dir = out / "pretrain" / f"{variant.name}-{budget}{seed_suffix(seed)}"
    done = run_dir / "study_done.json"
    if done.is_file():
        return {"seed": FIRST_SEED, **json.loads(done.read_text())}  # studies before --pretrain-seeds
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = model_config(variant, read_manifest(data).vocab_size)
    cfg.to_json(run_dir / "study_model.json")
    ds = write_ds_config(PRETRAIN_DS, run_dir / "study_ds.json", steps, batch=16)
    git = git_state()  # when the stage starts: the code it runs
    start = time.perf_counter()
    with quiet(run_dir / "console.log"):
        assert run_task(PretrainConfig(
            model_config=str(run_dir / "study_model.json"), deepspeed_config=ds, data=data, output_dir=run_dir,
            max_steps=steps, log_interval=max(1, steps // 40), eval_interval=_eval_interval(steps), eval_batches=8,
            save_interval=steps, keep_last=1, seed=seed, tensorboard=False, progress_bar=False,
            resume=LATEST)) is not None
    records = RunFolder(run_dir).read_metrics().records
    valid = [r for r in records if "valid/mlm_loss" in r][-1]
    train = [r for r in records if "train/mlm_loss" in r][-1]
    summary = {"variant": variant.name, "budget": budget, "seed": seed, "steps": steps, "params": parameter_count(cfg),
               "train_flops_per_token": training_flops_per_token(cfg), "seconds": time.perf_counter() - start,
               "train_mlm_loss": train["train/mlm_loss"], "valid_mlm_loss": valid["valid/mlm_loss"],
               "valid_mlm_accuracy": valid["valid/mlm_accuracy"], "valid_sop_accuracy": valid["valid/sop_accuracy"],
               "run_dir": str(run_dir), **git}
    done.write_text(json.dumps(summary, indent=2))
    return summary


def _eval_interval(steps: int) -> int:
    """About 4 held-out evaluations, the last one at the final step."""
    return next(d for d in range(max(1, steps // 4), steps + 1) if steps % d == 0)


def layernorm_divergences(run_dir: Path) -> dict[str, dict[str, float]]:
    """Eq. 9 averaged over the elements i, for gamma and beta of each LayerNorm position of the encoder blocks
    (0 for a LayerNorm shared by all blocks), from the run's last checkpoint."""
    state = CheckpointSource.open(run_dir, "source", purpose=CONVERT).read_weights().state
    result = {}
    for position, module in LAYERNORMS.items():
        result[position] = {}
        for name, kind in (("gamma", "weight"), ("beta", "bias")):
            prefix = f"widenet.encoder.{module}."
            blocks = sorted((k for k in state if k.startswith(prefix) and k.endswith(f".{kind}")),
                            key=lambda k: int(k[len(prefix):].split(".")[0]))
            stacked = torch.stack([state[k] for k in blocks])
            result[position][name] = layernorm_divergence(stacked).mean().item()
    return result


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


def finetune(pre: dict, task: str, shared: Path, data: Path, out: Path, sizes: dict[str, int],
             finetune_seeds: int, run: bool = True) -> dict | None:
    """Finetunes one pretraining run (one pretraining seed); the median over the finetuning seeds. With `run`
    false, only a finetuning already on disk is read (None when there is none)."""
    run_dir = (out / "finetune" / f"{pre['variant']}-{pre['budget']}{seed_suffix(pre['seed'])}"
               / task.lower().replace("-", ""))
    folder = RunFolder(run_dir)
    if not folder.results.is_file() and not run:
        return None
    if not folder.results.is_file():
        run_dir.mkdir(parents=True, exist_ok=True)
        steps = sizes["finetune_steps"]
        ds = write_ds_config(FINETUNE_DS, run_dir.parent / f"study_ds_{run_dir.name}.json", steps, batch=32)
        common = dict(init_from=Path(pre["run_dir"]), tokenizer=str(data), deepspeed_config=ds, output_dir=run_dir,
                      max_steps=steps, seeds=finetune_seeds, log_interval=max(1, steps // 10),
                      max_seq_length=SEQ_LENGTH,
                      # the study's small schedule is not the paper's recipe on purpose
                      allow_recipe_mismatch=True, tensorboard=False, progress_bar=False,
                      resume=LATEST)  # a stage stopped part-way continues where it was (finished seeds are kept)
        git = git_state()
        with quiet(run_dir.parent / "console.log"):
            if task == "SQuAD1.1":
                train, dev = squad_split(shared, out)
                results = run_task(SquadConfig(
                    version="1.1", data=str(dev), train_file=str(train), dev_file=str(dev),
                    max_train_examples=sizes["squad_train"], max_eval_examples=sizes["squad_eval"], doc_stride=16,
                    **common))
            else:
                results = run_task(GlueConfig(
                    glue_task=task, data=str(shared / "glue" / task), max_train_examples=sizes["train_examples"],
                    max_eval_examples=sizes["eval_examples"], **common))
        assert results is not None, (f"finetuning {task} of {pre['variant']} stopped (see "
                                     f"{run_dir.parent / 'console.log'})")
        (run_dir / "study_git.json").write_text(json.dumps(git, indent=2))
    results = folder.read_results(FinetuneResults)
    split = "dev"
    metric = "f1" if task == "SQuAD1.1" else results.primary_metric
    scores = [run.metrics[split][metric] for run in results.per_seed]
    scale100 = 1.0 if task == "SQuAD1.1" else 100.0  # SQuAD scores are already percentages
    git_file = run_dir / "study_git.json"
    return {"task": task, "metric": metric, "median": statistics.median(scores) * scale100,
            "scores": [s * scale100 for s in scores],
            "exact_match": (results.median[split].get("exact_match") if task == "SQuAD1.1" else None),
            "baseline": _baseline(results, split, metric, scale100), "run_dir": str(run_dir),
            **(json.loads(git_file.read_text()) if git_file.is_file() else {})}


def _baseline(results: FinetuneResults, split: str, metric: str, scale100: float) -> float | None:
    value = results.baseline.get(split, {}).get(metric)
    return None if value is None else value * scale100


# --- analysis -----------------------------------------------------------------------------------------
def by_seed(rows: list[dict], variant: str, budget: str) -> dict[int, dict]:
    return {r["seed"]: r for r in rows if r["variant"] == variant and r["budget"] == budget}


def compare(study: dict, budget: str) -> list[dict]:
    """Every comparison of COMPARISONS on every metric both sides have, paired over their common seeds."""
    rows = []
    tasks = [t for t in [*GLUE_DATASETS, "SQuAD1.1"] if any(f["task"] == t for f in study["finetune"])]
    for comparison in COMPARISONS:
        ours, theirs = (by_seed(study["pretrain"], v, budget) for v in (comparison.variant, comparison.reference))
        seeds = sorted(set(ours) & set(theirs))
        if not seeds:
            continue
        metrics = [(key, label, ours, theirs, lower) for key, (label, lower) in PRETRAIN_METRICS.items()]
        for task in tasks:
            other = {s: f for s, f in by_seed([f for f in study["finetune"] if f["task"] == task],
                                               comparison.reference, budget).items()}
            mine = {s: f for s, f in by_seed([f for f in study["finetune"] if f["task"] == task],
                                              comparison.variant, budget).items()}
            if set(mine) & set(other):
                unit = "(%)" if task == "SQuAD1.1" else "(x100)"
                metrics.append(("median", f"{task} {next(iter(mine.values()))['metric']} {unit}", mine, other, False))
        for key, label, mine, other, lower in metrics:
            common = sorted(set(mine) & set(other))
            if not common:
                continue
            diff = paired_difference([mine[s][key] for s in common], [other[s][key] for s in common], CONFIDENCE)
            rows.append({"claim": comparison.claim, "variant": comparison.variant, "reference": comparison.reference,
                         "paper": comparison.paper, "metric": label, "lower_is_better": lower, "seeds": common,
                         "mean": diff.mean, "low": diff.low, "high": diff.high, "resolved": diff.resolved,
                         "better": None if not diff.resolved else (diff.mean < 0) == lower})
    return rows


def layernorm_rows(study: dict, budget: str) -> list[dict]:
    """Eq. 9 per model (mean over seeds with its interval) and WideNet's paired difference to the unshared models."""
    rows = []
    runs = [p for p in study["pretrain"] if p["budget"] == budget and "layernorm_divergence" in p]
    for variant in dict.fromkeys(p["variant"] for p in runs):
        seeds = by_seed(runs, variant, budget)
        for position in LAYERNORMS:
            for name in ("gamma", "beta"):
                values = [seeds[s]["layernorm_divergence"][position][name] for s in sorted(seeds)]
                interval = mean_interval(values, CONFIDENCE)
                rows.append({"variant": variant, "position": position, "parameter": name, "seeds": sorted(seeds),
                             "mean": interval.mean, "low": interval.low, "high": interval.high})
    widenet = by_seed(runs, "widenet", budget)
    for reference in LAYERNORM_REFERENCES:
        other = by_seed(runs, reference, budget)
        common = sorted(set(widenet) & set(other))
        for position in LAYERNORMS if common else ():
            for name in ("gamma", "beta"):
                diff = paired_difference([widenet[s]["layernorm_divergence"][position][name] for s in common],
                                         [other[s]["layernorm_divergence"][position][name] for s in common], CONFIDENCE)
                rows.append({"variant": "widenet", "reference": reference, "position": position, "parameter": name,
                             "seeds": common, "mean": diff.mean, "low": diff.low, "high": diff.high,
                             "resolved": diff.resolved})
    return rows


def verdict(row: dict) -> str:
    """A comparison's verdict, with the direction when resolved (better / worse for the variant; for eq. 9
    whether WideNet's LayerNorms diverge more)."""
    if not row["resolved"]:
        return "not resolved"
    if "better" in row:
        return "resolved: " + ("better" if row["better"] else "worse")
    return "resolved: WideNet " + ("larger" if row["mean"] > 0 else "smaller")


def interval(row: dict, digits: int = 3, signed: bool = True) -> str:
    return format_interval(row["mean"], row["low"], row["high"], digits, signed)


# --- tables and plots ---------------------------------------------------------------------------------
def tables(study: dict) -> str:
    minutes = sum(p["seconds"] for p in study["pretrain"] if not p.get("same_run_as_steps")) / 60
    lines = [f"Scale {study['scale']}: {json.dumps(study['sizes'])}; pretraining seeds {study['pretrain_seeds']}; "
             f"pretraining stages {minutes:.1f} min (their own times), this invocation {study['seconds'] / 60:.1f} "
             f"min, on {study['threads']} thread(s). Intervals: {CONFIDENCE:.0%} Student t over the seeds "
             "(paired by pretraining seed for differences); resolved = the interval excludes 0.", ""]
    for budget in study["budgets"]:
        title = "equal steps" if budget == "steps" else "equal training FLOPs (WideNet's budget)"
        runs = [p for p in study["pretrain"] if p["budget"] == budget]
        lines += [f"### Pretraining, {title}: mean over seeds [{CONFIDENCE:.0%} interval]", "",
                  "| model | params | train MFLOPs/token | steps | seeds | held-out MLM loss per seed | MLM loss | "
                  "MLM accuracy | minutes per run |", "|---|---:|---:|---:|---|---|---:|---:|---:|"]
        for variant in dict.fromkeys(p["variant"] for p in runs):
            seeds = by_seed(runs, variant, budget)
            ordered = [seeds[s] for s in sorted(seeds)]
            first = ordered[0]
            loss = mean_interval([p["valid_mlm_loss"] for p in ordered], CONFIDENCE)
            accuracy = mean_interval([p["valid_mlm_accuracy"] for p in ordered], CONFIDENCE)
            lines.append(
                f"| {variant} | {first['params'] / 1e6:.2f}M | {first['train_flops_per_token'] / 1e6:.2f} | "
                f"{first['steps']} | {', '.join(str(s) for s in sorted(seeds))} | "
                f"{', '.join(format(p['valid_mlm_loss'], '.3f') for p in ordered)} | "
                f"{loss.format(signed=False)} | {accuracy.format(signed=False)} | "
                f"{statistics.mean(p['seconds'] for p in ordered) / 60:.1f} |")
        lines += ["", f"(uniform guess: ln {study.get('vocab_size', VOCAB_SIZE)} = "
                      f"{math.log(study.get('vocab_size', VOCAB_SIZE)):.2f})", ""]
        lines += finetune_table(study, budget, title)
        lines += [f"### The paper's claims, {title}: variant minus reference, paired by pretraining seed, mean "
                  f"[{CONFIDENCE:.0%} interval]", ""]
        comparisons = study["analysis"][budget]["comparisons"]
        for claim in dict.fromkeys(row["claim"] for row in comparisons):
            rows = [row for row in comparisons if row["claim"] == claim]
            lines += [f"#### {claim}: {rows[0]['variant']} − {rows[0]['reference']}", "",
                      f"Paper: {rows[0]['paper']}.", "", "| metric | ours | seeds | verdict |", "|---|---:|---:|---|"]
            lines += [f"| {row['metric']} | {interval(row)} | {len(row['seeds'])} | {verdict(row)} |" for row in rows]
            lines.append("")
        lines += ["(better / worse: for the variant, in the metric's own direction: lower MLM loss is better)", ""]
        lines += layernorm_table(study["analysis"][budget]["layernorm"], title)
    return "\n".join(lines)


def finetune_table(study: dict, budget: str, title: str) -> list[str]:
    scores = [f for f in study["finetune"] if f["budget"] == budget]
    tasks = [t for t in [*GLUE_DATASETS, "SQuAD1.1"] if any(f["task"] == t for f in scores)]
    if not tasks:
        return []
    counts = " or ".join(str(n) for n in sorted({len(f["scores"]) for f in scores}))  # the runs', not this call's
    lines = [f"### Finetuning, pretrained at {title}: per pretraining seed the median over "
             f"{counts} finetuning seed(s); mean over pretraining seeds [{CONFIDENCE:.0%} interval]",
             "", "| model | " + " | ".join(f"{t} ({_metric(t, scores)})" for t in tasks) + " |",
             "|---|" + "---:|" * len(tasks)]
    for variant in dict.fromkeys(f["variant"] for f in scores):
        cells = []
        for task in tasks:
            runs = by_seed([f for f in scores if f["task"] == task], variant, budget)
            values = [runs[s]["median"] for s in sorted(runs)]
            cells.append(mean_interval(values, CONFIDENCE).format(digits=1, signed=False) if values
                         else "–")
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    baselines = {f["task"]: f["baseline"] for f in scores}
    lines.append("| *trivial baseline* | " + " | ".join(
        "–" if baselines.get(t) is None else f"{baselines[t]:.1f}" for t in tasks) + " |")
    # STS-B has no trivial baseline in the results: a constant prediction correlates 0
    above = {t: [f for f in scores if f["task"] == t and f["median"] > (f["baseline"] or 0.0)] for t in tasks}
    lines += ["", "Runs (model x pretraining seed) whose median score is above the trivial baseline (the majority "
              "class; 0 for CoLA's MCC and STS-B's correlation): " + "; ".join(
                  f"{t} {len(above[t])} of {sum(1 for f in scores if f['task'] == t)}" for t in tasks), ""]
    return lines


def _metric(task: str, scores: list[dict]) -> str:
    return next((f["metric"] for f in scores if f["task"] == task), "")


def layernorm_table(rows: list[dict], title: str) -> list[str]:
    if not rows:
        return []
    lines = [f"### LayerNorm divergence (eq. 9, mean over the elements), {title}: mean over seeds "
             f"[{CONFIDENCE:.0%} interval]", "",
             "| model | seeds | γ, LN before the FFN/MoE | β, before | γ, LN after it | β, after |",
             "|---|---|---:|---:|---:|---:|"]
    per_model = [r for r in rows if "reference" not in r]
    for variant in dict.fromkeys(r["variant"] for r in per_model):
        cells = {(r["position"], r["parameter"]): r for r in per_model if r["variant"] == variant}
        first = next(iter(cells.values()))
        lines.append(f"| {variant} | {', '.join(str(s) for s in first['seeds'])} | " + " | ".join(
            interval(cells[p, n], digits=4, signed=False) for p in LAYERNORMS for n in ("gamma", "beta")) + " |")
    paired = [r for r in rows if "reference" in r]
    if paired:
        lines += ["", "| WideNet − unshared model | LayerNorm | parameter | difference | seeds | verdict |",
                  "|---|---|---|---:|---:|---|"]
        for r in paired:
            lines.append(f"| widenet − {r['reference']} | {r['position'].replace('_', ' ')} | {r['parameter']} | "
                         f"{interval(r, digits=4)} | {len(r['seeds'])} | {verdict(r)} |")
    return [*lines, "", "(a LayerNorm shared by all blocks, as in ALBERT and widenet-shared-ln, is 0 by construction)",
            ""]


def error_spans(rows: list[dict]) -> list[list[float]]:
    """matplotlib's xerr / yerr (below, above) from rows of mean, low, high; none where low is nan (1 seed)."""
    return [[0 if math.isnan(r["low"]) else r["mean"] - r["low"] for r in rows],
            [0 if math.isnan(r["high"]) else r["high"] - r["mean"] for r in rows]]


def plots(study: dict, folder: Path) -> list[str]:
    """Per budget: held-out MLM loss minus WideNet's (paired, with intervals, around 0) and the finetuning scores
    (mean over pretraining seeds with intervals, on an axis from 0, the trivial baseline marked); the eq. 9
    divergences of the LayerNorm before the FFN/MoE (axis from 0)."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for budget in study["budgets"]:
        rows = study["analysis"][budget]["comparisons"]
        against = []  # every model's held-out MLM loss minus WideNet's (a WideNet - X row shown as X - WideNet)
        for r in rows:
            if r["metric"] == "held-out MLM loss" and r["reference"] == "widenet":
                against.append({**r, "name": r["variant"]})
            elif r["metric"] == "held-out MLM loss" and r["variant"] == "widenet":
                against.append({**r, "name": r["reference"], "mean": -r["mean"], "low": -r["high"], "high": -r["low"]})
        order = [v.name for v in VARIANTS]
        against.sort(key=lambda r: order.index(r["name"]))
        scores = [f for f in study["finetune"] if f["budget"] == budget]
        tasks = [t for t in [*GLUE_DATASETS, "SQuAD1.1"] if any(f["task"] == t for f in scores)]
        fig = Figure(figsize=(6 + 3.6 * len(tasks), 4.6), layout="constrained")
        axes = fig.subplots(1, 1 + len(tasks), width_ratios=[2] + [1] * len(tasks), squeeze=False)[0]
        ax = axes[0]
        names = [r["name"] for r in against]
        means = [r["mean"] for r in against]
        errors = error_spans(against)
        colors = ["#55a868" if r["resolved"] and r["mean"] > 0 else "#c44e52" if r["resolved"] else "#8c8c8c"
                  for r in against]
        ax.barh(names, means, xerr=errors, color=colors, capsize=3)
        ax.axvline(0, color="black", linewidth=0.8)
        ax.invert_yaxis()
        ax.set_xlabel("held-out MLM loss of the model minus WideNet's (nats/token)")
        ax.set_title(f"paired by pretraining seed, {CONFIDENCE:.0%} intervals\n"
                     "> 0: worse than WideNet; grey: interval contains 0", fontsize="small")
        for ax, task in zip(axes[1:], tasks):
            variants = list(dict.fromkeys(f["variant"] for f in scores if f["task"] == task))
            values = [mean_interval([f["median"] for f in sorted(by_seed(
                [g for g in scores if g["task"] == task], v, budget).values(), key=lambda f: f["seed"])], CONFIDENCE)
                for v in variants]
            spans = error_spans([asdict(d) for d in values])
            ax.barh(variants, [d.mean for d in values], xerr=spans, color="#4c72b0", capsize=3)
            baseline = next((f["baseline"] for f in scores if f["task"] == task and f["baseline"] is not None), None)
            if baseline is not None:
                ax.axvline(baseline, color="black", linestyle="--", linewidth=0.8, label="trivial baseline")
                ax.legend(fontsize="x-small", loc="lower right")
            ends = [d.mean if math.isnan(end) else end for d in values for end in (d.low, d.high)]
            if min(ends) < 0:  # a correlation (STS-B, CoLA's MCC) below 0: symmetric around 0, nothing clipped
                edge = 1.05 * max(abs(end) for end in ends)
                ax.set_xlim(-edge, edge)
                ax.axvline(0, color="black", linewidth=0.8)
            else:
                ax.set_xlim(left=0)
            ax.invert_yaxis()
            axis = "axis symmetric around 0" if min(ends) < 0 else "axis from 0"
            ax.set_xlabel(f"{task} dev {_metric(task, scores)} x100 ({axis})")
            ax.set_title(f"mean over pretraining seeds\n{CONFIDENCE:.0%} intervals", fontsize="small")
        fig.suptitle("equal pretraining steps" if budget == "steps" else "equal pretraining FLOPs")
        file = f"study_{budget}.png"
        fig.savefig(folder / file, dpi=100)
        written.append(file)
        written += layernorm_plot(study, budget, folder)
    return written


def layernorm_plot(study: dict, budget: str, folder: Path) -> list[str]:
    rows = [r for r in study["analysis"][budget]["layernorm"] if "reference" not in r and r["position"] == "before_ffn"]
    if not rows:
        return []
    fig = Figure(figsize=(10, 4), layout="constrained")
    for ax, name in zip(fig.subplots(1, 2), ("gamma", "beta")):
        cells = [r for r in rows if r["parameter"] == name]
        spans = error_spans(cells)
        ax.barh([r["variant"] for r in cells], [r["mean"] for r in cells], xerr=spans, color="#8172b2", capsize=3)
        ax.set_xlim(left=0)
        ax.invert_yaxis()
        ax.set_xlabel(f"eq. 9 divergence of {name} across blocks (axis from 0)")
        ax.set_title(f"LayerNorm before the FFN/MoE; mean over seeds, {CONFIDENCE:.0%} intervals", fontsize="small")
    file = f"study_layernorm_{budget}.png"
    fig.savefig(folder / file, dpi=100)
    return [file]


def archive(out: Path, target: Path, plot_files: list[str], files: tuple[str, ...] = ("study.json", "tables.md")
            ) -> None:
    """`files` (study.json, tables.md) and the plots into `target` (docs/reproduction/), under their own names."""
    target.mkdir(parents=True, exist_ok=True)
    for source in [*(out / f for f in files), *(out / "plots" / f for f in plot_files)]:
        shutil.copyfile(source, target / source.name)


def redraw(study_json: Path, out: Path, target: Path | None) -> int:
    """tables.md and the plots of an archived study.json, e.g. after a change to how they are drawn."""
    study = json.loads(study_json.read_text())
    out.mkdir(parents=True, exist_ok=True)
    (out / "tables.md").write_text(tables(study))
    study_plots = plots(study, out / "plots")
    if target:
        archive(out, target, study_plots, files=("tables.md",))
    print(f"redrew {out / 'tables.md'} and {', '.join(study_plots)} from {study_json}")
    return 0


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
    parser.add_argument("--tasks", nargs="+", choices=[*GLUE_DATASETS, "SQuAD1.1"], help="a subset of the tasks")
    parser.add_argument("--pretrain-seeds", type=int, default=3,
                        help="pretrain (and finetune) every model with the seeds 1234 ... 1234+N-1 (default 3): the "
                             "models are compared seed by seed")
    parser.add_argument("--finetune-seeds", type=int, default=3,
                        help="finetuning seeds per pretrained model (their median is the model's score)")
    parser.add_argument("--budgets", nargs="+", choices=("steps", "flops"), default=["steps", "flops"],
                        help="pretraining budgets: equal steps, and equal training FLOPs (WideNet's) for the models "
                             "that cost less per token (default both)")
    parser.add_argument("--finetune-budgets", nargs="*", choices=("steps", "flops"), default=["steps", "flops"],
                        help="finetune the models pretrained at these budgets (default both; none: pretraining "
                             "only). Finetunings already on disk are reported at every budget")
    parser.add_argument("--archive", type=Path,
                        help="also copy study.json, tables.md and the plots into this folder (docs/reproduction)")
    parser.add_argument("--from-json", type=Path, metavar="STUDY_JSON",
                        help="only redraw tables.md and the plots into --output from an archived study.json (no runs)")
    args = parser.parse_args(argv)
    if args.from_json:
        return redraw(args.from_json, args.output.absolute(), args.archive)
    if args.scale <= 0:
        parser.error("--scale must be positive")
    if args.pretrain_seeds < 1 or args.finetune_seeds < 1:
        parser.error("--pretrain-seeds and --finetune-seeds must be at least 1")
    for needed in ("corpus/wikitext-2", "corpus/books", "glue/SST-2", "squad/dev-v1.1.json"):
        if not (args.shared_data / needed).exists():
            parser.error(f"{args.shared_data / needed} not found: pass --shared-data (or set WIDENET_SHARED_DATA) "
                         f"to the shared data folder with corpus/, glue/ and squad/")
    out = args.output.absolute()
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    sizes = scaled(args.scale)
    variants = [v for v in VARIANTS if not args.variants or v.name in args.variants]
    tasks = args.tasks or [*GLUE_DATASETS, "SQuAD1.1"]
    seeds = list(range(FIRST_SEED, FIRST_SEED + args.pretrain_seeds))
    start = time.perf_counter()
    log(f"scale {args.scale}: {sizes}; seeds {seeds}; output {out}", out)

    init_distributed()
    data = prepare(args.shared_data, out, workers=args.threads)
    vocab = read_manifest(data).vocab_size
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
    study = {"scale": args.scale, "sizes": sizes, "threads": args.threads, "vocab_size": vocab,
             "pretrain_seeds": seeds, "finetune_seeds": args.finetune_seeds,
             "budgets": [b for b in ("steps", "flops") if b in args.budgets], "pretrain": [], "finetune": []}
    for variant, steps, budget in runs:  # one model's seeds together: an interrupted study has whole models
        for seed in seeds:
            summary = pretrain(variant, steps, budget, data, out, seed)
            summary["layernorm_divergence"] = layernorm_divergences(Path(summary["run_dir"]))
            study["pretrain"].append(summary)
            log(f"pretrained {variant.name} ({budget}, {steps} steps, seed {seed}): held-out MLM loss "
                f"{summary['valid_mlm_loss']:.3f} in {summary['seconds']:.0f} s", out)
            for task in tasks:  # at the other budgets, finetunings of an earlier invocation are still reported
                found = finetune(summary, task, args.shared_data, data, out, sizes, args.finetune_seeds,
                                 run=budget in args.finetune_budgets)
                if found is None:
                    continue
                result = {"variant": variant.name, "budget": budget, "seed": seed, **found}
                study["finetune"].append(result)
                log(f"  {task}: {result['metric']} median {result['median']:.1f} (finetuning seeds "
                    f"{', '.join(f'{s:.1f}' for s in result['scores'])})", out)
    # Models whose FLOPs equal WideNet's (no equal-FLOPs rerun) stand in both tables with the same runs.
    for variant in variants if "flops" in args.budgets and "steps" in args.budgets else ():
        if not any(p["variant"] == variant.name and p["budget"] == "flops" for p in study["pretrain"]):
            study["pretrain"] += [{**p, "budget": "flops", "same_run_as_steps": True} for p in study["pretrain"]
                                  if p["variant"] == variant.name and p["budget"] == "steps"]
            study["finetune"] += [{**f, "budget": "flops"} for f in study["finetune"]
                                  if f["variant"] == variant.name and f["budget"] == "steps"]
    study["analysis"] = {budget: {"comparisons": compare(study, budget), "layernorm": layernorm_rows(study, budget)}
                         for budget in study["budgets"]}
    study["seconds"] = time.perf_counter() - start
    study["paper"] = {v.name: v.paper for v in variants}
    study["written_at"] = git_state()
    (out / "study.json").write_text(json.dumps(study, indent=2))
    (out / "tables.md").write_text(tables(study))
    study_plots = plots(study, out / "plots")
    if args.archive:
        archive(out, args.archive, study_plots)

    finetune_dirs = sorted(p for p in (out / "finetune").glob("*") if p.is_dir())
    page, _ = write_report([out / "pretrain", *finetune_dirs], out / "report", "WideNet study: pretraining and finetuning")
    log(f"done in {study['seconds'] / 60:.1f} min: {out / 'tables.md'}, plots {study_plots}, report {page}", out)
    print((out / "tables.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
