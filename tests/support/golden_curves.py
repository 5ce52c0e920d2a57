"""The golden loss curves: the runs (tests/integration/test_golden_losses.py runs them), their stored assets
(tests/assets/losses), and how a curve is compared with its asset.

A stored curve is compared within TOLERANCE_ULPS float32 ulps per step: fp32 results on CPU differ between
processors (MKL, glibc's libm and ATen pick code paths per CPU), by 1-2 ulps of a loss between an Intel
Xeon and an AMD EPYC, while a one-line real change moves some step of every curve by far more. Both
sides are measured and stored (tests/assets/README.md, `tests/assets/losses/changes/`), and
tests/integration/test_golden_losses.py checks that the tolerance lies between them (every measured kernel path
passes, every real change fails). `WIDENET_GOLDEN_EXACT=1` compares to
the bit instead: for a refactor that must not move a bit, record on this machine first
(`WIDENET_UPDATE_GOLDEN=1 WIDENET_GOLDEN_DIR=DIR`), change the code, compare against DIR exactly.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tests.support.launching import REPO

ASSETS = Path(os.environ.get("WIDENET_GOLDEN_DIR") or REPO / "tests" / "assets" / "losses")
# The curves of one-line real changes (tests/scripts/golden_variants.py records them): what the tolerance
# must keep failing.
CHANGES = REPO / "tests" / "assets" / "losses" / "changes"
# A fixed WordPiece vocabulary: training one is not deterministic (the tokenizers trainer orders equal-count
# alphabet entries by hash), and the curves must depend on nothing but the code under test.
VOCAB = REPO / "tests" / "assets" / "golden_vocab.txt"
STEPS = 20
SEED = 1234
# Per step, in float32 ulps of the stored loss. Measured (tests/assets/README.md): other CPUs and kernel
# paths move a step by at most 2 ulps; every one-line change moves some step of every curve by >= 1,436.
TOLERANCE_ULPS = 8


def exact_mode() -> bool:
    return os.environ.get("WIDENET_GOLDEN_EXACT") == "1"


# The trainers' entries: "-m", module, task.
PRETRAIN = ["-m", "widenet_ds.train", "pretrain"]
CLASSIFY = ["-m", "widenet_ds.train", "classify"]
GLUE = ["-m", "widenet_ds.train", "glue"]


@dataclass(frozen=True)
class GoldenRun:
    entry: list[str]
    ranks: int
    # Whitespace-separated; {out}: the run's output folder, {repo}: the checkout, {data}: the prepared
    # pretraining data, {shared}: the shared data folder (the run is skipped without it).
    args: str
    losses_dir: str = "."  # the folder of the metrics.jsonl holding train/loss, under {out}

    def command_line(self) -> str:
        entry = " ".join(Path(part).relative_to(REPO).as_posix() if part.startswith(str(REPO)) else part
                         for part in self.entry)
        return f"{entry} {self.args}"


COMMON = f"--output-dir {{out}} --max-steps {STEPS} --log-interval 1 --no-progress-bar --no-tensorboard"
PRETRAIN_ARGS = (f"--deepspeed_config {{repo}}/ds_configs/cpu_small.json --data {{data}} --seed {SEED} "
                 f"--eval-interval 0 --save-interval 1000 {COMMON}")
RUNS = {
    "widenet_tiny_e4_1rank": GoldenRun(PRETRAIN, 1, f"--model-config widenet-tiny-e4 {PRETRAIN_ARGS}"),
    "albert_tiny_1rank": GoldenRun(PRETRAIN, 1, f"--model-config albert-tiny {PRETRAIN_ARGS}"),
    "widenet_tiny_e4_ep2_2ranks": GoldenRun(PRETRAIN, 2, f"--model-config widenet-tiny-e4 --ep-size 2 {PRETRAIN_ARGS}"),
    # Workers 0: decoding in the rank's process; the augmentation draws from the rank's seeded RNG.
    "vit_digits_ep2_2ranks": GoldenRun(CLASSIFY, 2, (
        "--model-config widenet-vit-digits --dataset digits --deepspeed_config {repo}/ds_configs/vision_cpu_small.json "
        f"--ep-size 2 --workers 0 --seed {SEED} --flip --mixup-alpha 0.5 --label-smoothing 0.1 --eval-interval 0 "
        f"--max-eval-examples 64 --save-interval 1000 {COMMON}")),
    "sst2_widenet_tiny_e4_ep2_2ranks": GoldenRun(GLUE, 2, (
        "--task sst2 --data {shared}/glue/SST-2 --tokenizer {shared}/vocab/bert-base-uncased-vocab.txt "
        "--model-config widenet-tiny-e4 --deepspeed_config {repo}/ds_configs/finetune_cpu_small.json --allow-recipe-mismatch "
        f"--ep-size 2 --seed 1 --max-train-examples 640 --max-seq-length 64 --max-eval-examples 32 {COMMON}"),
        losses_dir="seed1"),
}
# The paper-literal routing (padding routed like a token): the numbers of every run before padding was kept out
# of the experts, recorded before that change (tests/assets/README.md).
LITERAL = "--set moe.route_padding=true"
RUNS["sst2_widenet_tiny_e4_ep2_2ranks_route_padding"] = GoldenRun(
    GLUE, 2, f"{RUNS['sst2_widenet_tiny_e4_ep2_2ranks'].args} {LITERAL}", losses_dir="seed1")


def read_asset(path: Path) -> dict[int, float]:
    rows = (line.split() for line in path.read_text().splitlines() if line and not line.startswith("#"))
    return {int(step): float(loss) for step, loss in rows}


def write_asset(path: Path, header: str, losses: dict[int, float]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# {header}; step train/loss\n" + "".join(f"{step} {json.dumps(loss)}\n"
                                                               for step, loss in sorted(losses.items())))


def ulps(stored: float, now: float) -> float:
    """|now - stored| in float32 ulps at the stored value (the losses are float32 numbers)."""
    return abs(now - stored) / float(np.spacing(np.float32(abs(stored))))


def beyond_tolerance(stored: dict[int, float], now: dict[int, float],
                     tolerance: float = TOLERANCE_ULPS) -> dict[int, tuple[float, float, float]]:
    """step -> (stored, now, ulps) of the steps that differ by more than `tolerance` ulps (0: any difference);
    a step missing from `now` counts as infinitely far."""
    far = {}
    for step, value in stored.items():
        distance = ulps(value, now[step]) if step in now else float("inf")
        if distance > tolerance:
            far[step] = (value, now.get(step, float("nan")), distance)
    return far



def run_golden(run: GoldenRun, out: Path, values: dict[str, Path], env: dict[str, str] | None = None,
               args: list[str] | None = None) -> dict[int, float]:
    """Run `run` into `out` ({data}/{shared} from `values`; `args`: its formatted arguments, changed) with this
    CPU's own kernels, one thread per rank (launching.child_env) plus `env`; its step -> train/loss."""
    from tests.support.launching import run_train
    from tests.support.pretrain_support import train_losses

    args = args if args is not None else golden_args(run, out, values)
    run_train(run.entry[2], args, num_ranks=run.ranks, env=env)
    return train_losses(out / run.losses_dir)


def golden_args(run: GoldenRun, out: Path, values: dict[str, Path]) -> list[str]:
    return [arg.format(out=out, repo=REPO, **values) for arg in run.args.split()]
