"""`widenet-ds demo` end to end at a small scale: the embedded corpus, 2 real CPU ranks, expert parallelism 2.
Without SST-2 (and no HF hub) it pretrains, reports and stops saying what to provide, exit 0; run again with
SST-2 present it reuses the finished pretraining and finetunes. The summary lines carry the runs' own numbers."""

from __future__ import annotations

import subprocess
import sys

import pytest

from launching import REPO, child_env

from widenet_ds.run_folder import RunFolder

pytestmark = [pytest.mark.multirank, pytest.mark.slow]
STEPS = 4


def run_demo(out, shared_data) -> subprocess.CompletedProcess:
    env = child_env(WIDENET_SHARED_DATA=str(shared_data), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "widenet_ds.cli", "demo", "--output", str(out), "--steps", str(STEPS),
                           "--finetune-steps", str(STEPS)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


def test_demo_pretrains_reports_and_finetunes_once_sst2_is_there(shared_data, tmp_path):
    out = tmp_path / "demo"
    first = run_demo(out, tmp_path / "no-shared-data")
    pretrain = RunFolder(out / "pretrain")
    mlm = pretrain.read_metrics().series("train/mlm_loss")
    assert max(mlm) == STEPS
    assert f"pretraining ({STEPS} steps, widenet-tiny-e4, 2 ranks, ep 2): MLM loss {mlm[min(mlm)]:.3f} -> " \
           f"{mlm[STEPS]:.3f}" in first.stdout
    assert "skipped the finetuning step: no SST-2 at" in first.stderr and "run the demo again" in first.stderr
    assert "SST-2 dev accuracy" not in first.stdout and not (out / "sst2").exists()
    assert (out / "report" / "index.html").is_file()

    assert f"[step {STEPS}] loss" in first.stdout + first.stderr

    second = run_demo(out, shared_data)
    console = second.stdout + second.stderr
    assert f"resumed from {out / 'pretrain' / 'checkpoints' / f'step{STEPS}'}" in console
    assert f"[step {STEPS}] loss" not in console  # the finished pretraining is reused, not repeated
    results = RunFolder(out / "sst2").read_results()
    assert f"SST-2 dev accuracy {results['median']['dev']['acc']:.4f} (majority class " \
           f"{results['baseline']['dev']['acc']:.4f})" in second.stdout
    assert str(out / "sst2") in (out / "report" / "index.html").read_text()
