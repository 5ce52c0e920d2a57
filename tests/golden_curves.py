"""The golden loss curves' assets (tests/assets/losses) and the settings they were recorded with, for the golden
test (tests/integration/test_golden_losses.py) and the tests that compare other runs with the same curves."""

from __future__ import annotations

from pathlib import Path

from launching import REPO

ASSETS = REPO / "tests" / "assets" / "losses"
# A fixed WordPiece vocabulary: training one is not deterministic (the tokenizers trainer orders equal-count
# alphabet entries by hash), and the curves must depend on nothing but the code under test.
VOCAB = REPO / "tests" / "assets" / "golden_vocab.txt"
STEPS = 20
SEED = 1234


def read_asset(path: Path) -> dict[int, float]:
    rows = (line.split() for line in path.read_text().splitlines() if line and not line.startswith("#"))
    return {int(step): float(loss) for step, loss in rows}
