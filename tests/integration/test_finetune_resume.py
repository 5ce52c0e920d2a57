"""GLUE finetuning (`deepspeed --module widenet_ds.train glue`) under the real `deepspeed` launcher, 2 CPU ranks, expert parallelism 2, two seeds on
an SST-2 slice: a run killed with SIGKILL after a checkpoint of its second seed and continued with --resume
logs the same per-step losses and evaluations, writes the same dev predictions and the same results.json as
an uninterrupted run, and leaves the finished first seed untouched."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from tests.support.launching import REPO, child_env, run_train, train_command

from widenet_ds.run_folder import read_metrics

pytestmark = pytest.mark.multirank

STEPS = 8


def run_args(shared_data: Path, output_dir: Path, *extra: str) -> list[str]:
    return ["--task", "sst2", "--data", str(shared_data / "glue/SST-2"), "--model-config", "widenet-tiny-e4",
            "--tokenizer", str(shared_data / "vocab/bert-base-uncased-vocab.txt"),
            "--deepspeed_config", str(REPO / "ds_configs/finetune_cpu_small.json"), "--allow-recipe-mismatch",
            "--output-dir", str(output_dir), "--max-steps", str(STEPS), "--seeds", "2", "--seed", "11",
            "--ep-size", "2", "--max-train-examples", "512", "--max-eval-examples", "64", "--max-seq-length", "48",
            "--log-interval", "1", "--save-interval", "3", "--eval-interval", "5", "--no-tensorboard",
            "--no-progress-bar", *extra]


def records(seed_dir: Path) -> dict[tuple[int, str], float]:
    """(step, name) -> value of every number logged for the seed (losses, lr, evaluations)."""
    return {(r["step"], name): value for r in read_metrics(seed_dir / "metrics.jsonl").records
            for name, value in r.items() if name not in ("step", "time") and not name.startswith("perf/")}


def events(seed_dir: Path) -> list[str]:
    return [r["event"] for r in read_metrics(seed_dir / "metrics.jsonl").events]


@pytest.fixture(scope="module")
def reference(shared_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("finetune_resume") / "reference"
    run_train("glue", run_args(shared_data, out), timeout=600)
    return out


def test_sigkill_after_a_checkpoint_then_resume_gives_identical_losses_and_metrics(shared_data, reference, tmp_path):
    out = tmp_path / "killed"
    proc = subprocess.Popen(train_command("glue", run_args(shared_data, out)), cwd=REPO, env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, text=True)
    latest = out / "seed12" / "checkpoints" / "latest"  # the second seed's first checkpoint
    deadline = time.monotonic() + 480
    while not latest.is_file():
        if proc.poll() is not None:
            pytest.fail(f"run ended ({proc.returncode}) before the second seed's checkpoint:\n"
                        f"{proc.stdout.read()[-4000:]}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail("no checkpoint of the second seed within 480 s")
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)  # launcher and both ranks: nothing more is saved
    proc.wait(timeout=60)
    killed_at = latest.read_text()
    assert not (out / "seed12" / "results.json").exists() and not (out / "results.json").exists(), \
        "the second seed finished before it could be killed; the test proved nothing"
    first_seed = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (out / "seed11").iterdir()}
    assert "results.json" in first_seed and not (out / "seed11" / "checkpoints").exists()

    resumed = run_train("glue", run_args(shared_data, out, "--resume"), timeout=600)
    assert f"resumed from {out / 'seed12' / 'checkpoints' / killed_at}" in events(out / "seed12")
    assert f"[seed 12 step {killed_at[4:]}] resumed from" in resumed.stdout
    assert "[seed 11 step" not in resumed.stdout  # the finished seed is not trained again
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (out / "seed11").iterdir()} == first_seed

    for seed in ("seed11", "seed12"):
        expected, got = records(reference / seed), records(out / seed)
        assert sorted(got) == sorted(expected), seed
        assert {(s, n) for s, n in expected if n == "train/loss"} == {(s, "train/loss") for s in range(1, STEPS + 1)}
        assert {(s, n) for s, n in expected if n.startswith("eval/")} == {(5, "eval/dev/acc"), (STEPS, "eval/dev/acc")}
        # Exact float equality (metrics.jsonl keeps the full repr): the resumed run is the same run.
        mismatches = {key: (expected[key], got[key]) for key in expected if expected[key] != got[key]}
        assert not mismatches, f"{seed} differs after resume: {mismatches}"
        assert (out / seed / "SST-2.dev.tsv").read_bytes() == (reference / seed / "SST-2.dev.tsv").read_bytes()
        assert not (out / seed / "checkpoints").exists()  # a finished seed's checkpoints are removed
    want, got = json.loads((reference / "results.json").read_text()), json.loads((out / "results.json").read_text())
    assert got["per_seed"] == want["per_seed"] and got["median"] == want["median"]
    assert [r["seed"] for r in got["per_seed"]] == [11, 12] and got["ep_size"] == 2
