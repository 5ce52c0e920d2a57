"""`widenet-ds demo` and `vision-demo` end to end at a small scale: 2 real CPU ranks, expert parallelism 2.
demo (the embedded corpus): without SST-2 (and no HF hub) it pretrains, reports and stops saying what to
provide, exit 0; run again with SST-2 present it reuses the finished pretraining and finetunes. vision-demo:
Fashion-MNIST. The summary lines carry the runs' own numbers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.launching import REPO, child_env
from widenet_ds.run_folder import RunFolder
from widenet_ds.tasks.classify.results import ClassifyResults
from widenet_ds.tasks.finetune.results import FinetuneResults
from widenet_ds.vision.datasets import DEBIAN_FASHION_MNIST

pytestmark = [pytest.mark.multirank, pytest.mark.slow]
STEPS = 4


def widenet_ds(*args: str, **env: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "widenet_ds.cli", *args], cwd=REPO, env=child_env(**env),
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


def run_demo(out, shared_data, finetune_steps: int = STEPS) -> subprocess.CompletedProcess:
    return widenet_ds("demo", "--output", str(out), "--steps", str(STEPS), "--finetune-steps", str(finetune_steps),
                      WIDENET_SHARED_DATA=str(shared_data), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")


def test_demo_pretrains_reports_and_finetunes_once_sst2_is_there(shared_data, tmp_path):
    out = tmp_path / "demo"
    first = run_demo(out, tmp_path / "no-shared-data")
    pretrain = RunFolder(out / f"pretrain-{STEPS}steps")
    mlm = pretrain.read_metrics().series("train/mlm_loss")
    assert max(mlm) == STEPS
    assert f"pretraining ({STEPS} steps, widenet-tiny-e4, 2 ranks, ep 2): MLM loss {mlm[min(mlm)]:.3f} -> " \
           f"{mlm[STEPS]:.3f}" in first.stdout
    assert "skipped the finetuning step: no SST-2 at" in first.stderr and "run the demo again" in first.stderr
    assert "SST-2 dev accuracy" not in first.stdout and not list(out.glob("sst2*"))
    assert (out / "report" / "index.html").is_file()
    assert f"[step {STEPS}] loss" in first.stdout + first.stderr
    tokenizer = (out / "data" / "tokenizer.json").read_bytes()

    second = run_demo(out, shared_data)
    console = second.stdout + second.stderr
    # the finished pretraining is reported complete and reused, not launched, trained or evaluated again
    assert f"[demo] 2/3 the pretraining in {pretrain.path} is complete (step {STEPS}): reused" in console
    assert f"[step {STEPS}] loss" not in console and "initialising DeepSpeed (ZeRO stage 1" not in console
    # and so is its data: a tokenizer trained again would differ from the one the model learned with
    assert "corpus is prepared already" in console and (out / "data" / "tokenizer.json").read_bytes() == tokenizer
    sst2 = out / f"sst2-{STEPS}steps-after-{STEPS}"
    results = RunFolder(sst2).read_results(FinetuneResults)
    assert f"SST-2 dev accuracy {results.median['dev']['acc']:.4f} (majority class " \
           f"{results.baseline['dev']['acc']:.4f})" in second.stdout
    page = (out / "report" / "index.html").read_text()
    assert sst2.name in page and str(out) not in page  # the run by its name, no path of this machine

    # other options in the same folder (the README's quick look after the demo): runs of their own, each over its
    # whole schedule, the earlier ones kept (here another finetuning length: the pretraining is reused again)
    before = {f: f.stat().st_mtime_ns for run in (pretrain.path, sst2) for f in run.rglob("*") if f.is_file()}
    third = run_demo(out, shared_data, finetune_steps=STEPS + 1)
    assert f"holds the runs of other settings too ({sst2.name})" in third.stderr
    assert f"the pretraining in {pretrain.path} is complete (step {STEPS}): reused" in third.stderr
    other = RunFolder(out / f"sst2-{STEPS + 1}steps-after-{STEPS}")
    assert other.read_results(FinetuneResults).steps == STEPS + 1
    assert json.loads((out / "ds_configs" / f"finetune_cpu_small-{STEPS + 1}steps.json").read_text())["scheduler"][
        "params"]["total_num_steps"] == STEPS + 1
    assert {f: f.stat().st_mtime_ns for f in before} == before


@pytest.mark.skipif(not DEBIAN_FASHION_MNIST.is_dir(), reason="Debian's dataset-fashion-mnist is not installed "
                                                               "(./launcher.sh test installs it as root)")
def test_vision_demo_trains_on_fashion_mnist_and_prints_its_test_accuracy(tmp_path):
    proc = widenet_ds("vision-demo", "--output", str(tmp_path / "run"), "--steps", str(STEPS))
    results = RunFolder(tmp_path / "run").read_results(ClassifyResults)
    assert results.step == STEPS
    assert f"widenet-vit-tiny, {STEPS} steps on Fashion-MNIST (2 ranks, ep 2): test accuracy " \
           f"{results.accuracy:.4f} on the first 2000 test images" in proc.stdout
