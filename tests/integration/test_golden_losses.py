"""Golden loss curves (torchtitan's `tests/assets/losses` idea): the first 20 logged training losses of
fixed runs, stored in `tests/assets/losses/` and compared exactly. Any change to model construction,
initialisation order, routing, the optimizer or the data order shows up here as a changed number.

The runs: pretraining (WideNet, ALBERT, WideNet with expert parallelism 2), image classification
(ViT-WideNet on sklearn's digits with augmentation, ep 2) and GLUE finetuning (SST-2 from a random init,
ep 2; and the same with the paper-literal routing, `--set moe.route_padding=true`, whose curve is the one
recorded before padding was kept out of the experts). Each is a real `deepspeed`-launched process per rank with portable arithmetic
(tests/portable_arithmetic.py: one thread, one kernel path on every x86-64 CPU), so the curves hold on any
machine. Pretraining needs no shared data (the embedded default corpus); SST-2 is skipped without it.
To record new curves after an intended change: `WIDENET_UPDATE_GOLDEN=1 pytest tests/integration/test_golden_losses.py`,
and say why in the commit.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from launching import REPO
from portable_arithmetic import run_portable
from golden_curves import ASSETS, SEED, STEPS, VOCAB, read_asset
from pretrain_support import prepare_data, train_losses

pytestmark = pytest.mark.multirank


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
# placeholder -> the fixture that gives its value
FIXTURES = {"data": "pretraining_data", "shared": "shared_data"}


@pytest.fixture(scope="module")
def pretraining_data(tmp_path_factory):
    return prepare_data(tmp_path_factory.mktemp("golden") / "data", [], tokenizer=str(VOCAB))


@pytest.mark.parametrize("name", sorted(RUNS))
def test_first_20_losses_match_the_stored_curve(name, request, tmp_path):
    run = RUNS[name]
    out = tmp_path / name
    # Only the fixtures this run names: SST-2 alone needs (and is skipped without) the shared data.
    named = set(re.findall(r"{(\w+)}", run.args)) & set(FIXTURES)
    values = {key: request.getfixturevalue(FIXTURES[key]) for key in named}
    args = [arg.format(out=out, repo=REPO, **values) for arg in run.args.split()]
    run_portable(run.entry, args, num_ranks=run.ranks)
    losses = train_losses(out / run.losses_dir)
    assert sorted(losses) == list(range(1, STEPS + 1))
    asset = ASSETS / f"{name}.txt"
    if os.environ.get("WIDENET_UPDATE_GOLDEN") == "1":
        asset.parent.mkdir(parents=True, exist_ok=True)
        entry = " ".join(Path(part).relative_to(REPO).as_posix() if part.startswith(str(REPO)) else part
                         for part in run.entry)
        header = f"# {entry} {run.args} ({run.ranks} rank(s), tests/portable_arithmetic.py); step train/loss\n"
        asset.write_text(header + "".join(f"{step} {json.dumps(loss)}\n" for step, loss in sorted(losses.items())))
        pytest.skip(f"recorded {asset}")
    assert asset.is_file(), f"no golden curve at {asset}; record it with WIDENET_UPDATE_GOLDEN=1"
    expected = read_asset(asset)
    changed = {s: (expected[s], losses[s]) for s in expected if losses[s] != expected[s]}
    assert not changed, f"losses differ from {asset.name} (step: stored, now): {changed}"
