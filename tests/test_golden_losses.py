"""Golden loss curves (torchtitan's `tests/assets/losses` idea): the first 20 logged training losses of
fixed runs, stored in `tests/assets/losses/` and compared exactly. Any change to model construction,
initialisation order, routing, the optimizer or the data order shows up here as a changed number.

Each run is a real `deepspeed`-launched process with one thread per rank (fp32 CPU results then do not
depend on the machine's core count), on data prepared from the embedded default corpus (no shared
data needed). To record new curves after an intended change: `WIDENET_UPDATE_GOLDEN=1 pytest
tests/test_golden_losses.py`, and say why in the commit.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from launching import run_deepspeed
from pretrain_support import CPU_CONFIG, RUN_PRETRAIN, prepare_data, train_losses

pytestmark = pytest.mark.multirank

ASSETS = Path(__file__).parent / "assets" / "losses"
# A fixed WordPiece vocabulary: training one is not deterministic (the tokenizers trainer orders equal-count
# alphabet entries by hash), and the curves must depend on nothing but the code under test.
VOCAB = Path(__file__).parent / "assets" / "golden_vocab.txt"
STEPS = 20
SEED = 1234

# name -> (preset, ranks, extra run flags)
RUNS = {
    "widenet_tiny_e4_1rank": ("widenet-tiny-e4", 1, []),
    "albert_tiny_1rank": ("albert-tiny", 1, []),
    "widenet_tiny_e4_ep2_2ranks": ("widenet-tiny-e4", 2, ["--ep-size", "2"]),
}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepare_data(tmp_path_factory.mktemp("golden") / "data", [], tokenizer=str(VOCAB))


def read_asset(path: Path) -> dict[int, float]:
    rows = (line.split() for line in path.read_text().splitlines() if line and not line.startswith("#"))
    return {int(step): float(loss) for step, loss in rows}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_first_20_losses_match_the_stored_curve(name, data, tmp_path):
    preset, ranks, extra = RUNS[name]
    out = tmp_path / name
    run_deepspeed(RUN_PRETRAIN, ["--model-config", preset, "--deepspeed_config", str(CPU_CONFIG), "--data", str(data),
                                 "--output-dir", str(out), "--max-steps", str(STEPS), "--seed", str(SEED),
                                 "--log-interval", "1", "--eval-interval", "0", "--save-interval", "1000",
                                 "--no-progress-bar", "--no-tensorboard", *extra], num_ranks=ranks)
    losses = train_losses(out)
    assert sorted(losses) == list(range(1, STEPS + 1))
    asset = ASSETS / f"{name}.txt"
    if os.environ.get("WIDENET_UPDATE_GOLDEN") == "1":
        asset.parent.mkdir(parents=True, exist_ok=True)
        header = (f"# {preset}, {ranks} rank(s) {' '.join(extra)}, ds_configs/cpu_small.json, fp32, seed {SEED}, "
                  f"embedded default corpus, tests/assets/golden_vocab.txt, seq 64; step train/loss\n")
        asset.write_text(header + "".join(f"{step} {json.dumps(loss)}\n" for step, loss in sorted(losses.items())))
        pytest.skip(f"recorded {asset}")
    assert asset.is_file(), f"no golden curve at {asset}; record it with WIDENET_UPDATE_GOLDEN=1"
    expected = read_asset(asset)
    changed = {s: (expected[s], losses[s]) for s in expected if losses[s] != expected[s]}
    assert not changed, f"losses differ from {asset.name} (step: stored, now): {changed}"
