"""Pretraining (`deepspeed --module widenet_ds.train pretrain`) under the real `deepspeed` launcher, 2 CPU ranks, ep_size 2, fp32, ZeRO 2.

One uninterrupted reference run; against it: a run killed with SIGKILL after a checkpoint and resumed,
a run stopped by SIGTERM and resumed (per-step losses equal to the last bit), activation
checkpointing (same losses), the TensorBoard scalars, and a batch size that does not fit 2 ranks.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.launching import REPO, child_env, free_port, run_train, train_command
from tests.support.pretrain_support import (
    BOOKS,
    events,
    prepare_data,
    train_losses,
    write_ds_config,
    write_model_config,
)

pytestmark = pytest.mark.multirank

STEPS = 10
SAVE_EVERY = 3


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, shared_data):
    root = tmp_path_factory.mktemp("multirank")
    return {
        "data": prepare_data(root / "data", [shared_data / b for b in BOOKS]),
        "model": write_model_config(root / "widenet.json"),
        "ds": write_ds_config(root / "zero2.json", zero_optimization={"stage": 2}),
        "root": root,
    }


def run_args(inputs, output_dir: Path, *extra: str) -> list[str]:
    return ["--model-config", str(inputs["model"]), "--deepspeed_config", str(inputs["ds"]),
            "--data", str(inputs["data"]), "--output-dir", str(output_dir), "--max-steps", str(STEPS),
            "--log-interval", "1", "--save-interval", str(SAVE_EVERY), "--eval-interval", "5",
            "--eval-batches", "2", "--ep-size", "2", "--no-progress-bar", *extra]


def launch_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def reference(inputs):
    out = inputs["root"] / "reference"
    run_train("pretrain", run_args(inputs, out))
    return out


def start(inputs, output_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(train_command("pretrain", run_args(inputs, output_dir)), cwd=REPO,
                            env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, text=True)


def wait_for_checkpoint(proc: subprocess.Popen, output_dir: Path, timeout: float = 180) -> str:
    latest = output_dir / "checkpoints" / "latest"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if latest.is_file():
            return latest.read_text()
        if proc.poll() is not None:
            pytest.fail(f"run ended ({proc.returncode}) before its first checkpoint:\n{proc.stdout.read()[-4000:]}")
        time.sleep(0.01)
    pytest.fail("no checkpoint within the timeout")


def rank_pids(launcher_pid: int) -> list[int]:
    import psutil

    children = psutil.Process(launcher_pid).children(recursive=True)
    # The ranks are the children started with --local_rank (launch.py's own command names the script too).
    return [p.pid for p in children if any(part.startswith("--local_rank") for part in p.cmdline())]


def assert_same_losses(reference: Path, resumed: Path) -> None:
    for key in ("train/loss", "train/mlm_loss", "train/sop_loss", "valid/loss"):
        expected, got = train_losses(reference, key), train_losses(resumed, key)
        assert sorted(got) == sorted(expected), f"{key}: steps {sorted(got)} vs {sorted(expected)}"
        # Exact float equality (metrics.jsonl keeps the full repr): the resumed run is the same run.
        mismatches = {s: (expected[s], got[s]) for s in expected if expected[s] != got[s]}
        assert not mismatches, f"{key} differs after resume: {mismatches}"


def test_reference_run_learns_and_logs_every_step(reference):
    losses = train_losses(reference)
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert (reference / "checkpoints" / "latest").read_text() == f"step{STEPS}"


def test_sigkill_after_checkpoint_then_resume_gives_identical_losses(inputs, reference):
    out = inputs["root"] / "sigkill"
    proc = start(inputs, out)
    first = wait_for_checkpoint(proc, out)
    os.killpg(proc.pid, signal.SIGKILL)  # launcher and both ranks, no chance to save anything
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    killed_at = (out / "checkpoints" / "latest").read_text()
    assert killed_at != f"step{STEPS}", "the run finished before it could be killed; the test proved nothing"
    assert first.startswith("step")

    run_train("pretrain", run_args(inputs, out, "--resume"))
    assert any(e.startswith("resumed from") for e in events(out))
    assert_same_losses(reference, out)


@pytest.mark.slow
def test_sigterm_saves_exits_cleanly_and_resumes_identically(inputs, reference):
    out = inputs["root"] / "sigterm"
    proc = start(inputs, out)
    wait_for_checkpoint(proc, out)
    pids = rank_pids(proc.pid)
    assert len(pids) == 2
    for pid in pids:  # as Slurm does on preemption: every task gets the signal
        os.kill(pid, signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output[-4000:]
    stopped = [e for e in events(out) if e.startswith("stopped by SIGTERM")]
    assert stopped, events(out)
    stop_step = max(train_losses(out))
    assert stop_step < STEPS, "the run finished before the signal; the test proved nothing"
    assert (out / "checkpoints" / "latest").read_text() == f"step{stop_step}"

    run_train("pretrain", run_args(inputs, out, "--resume"))
    assert_same_losses(reference, out)


def test_activation_checkpointing_under_zero2_matches_losses(inputs, reference):
    out = inputs["root"] / "activation_checkpointing"
    args = run_args(inputs, out, "--activation-checkpointing")
    args[args.index("--max-steps") + 1] = "2"
    run_train("pretrain", args)
    expected, got = train_losses(reference), train_losses(out)
    assert sorted(got) == [1, 2]
    for step in (1, 2):
        assert got[step] == pytest.approx(expected[step], rel=1e-6, abs=0), (step, got, expected)


def test_tensorboard_holds_every_scalar(reference):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(reference / "tensorboard"), size_guidance={"scalars": 0})
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    expected = {f"train/{name}" for name in ("loss", "mlm_loss", "mlm_accuracy", "sop_loss", "sop_accuracy",
                                             "balance_loss")}
    expected |= {f"valid/{name}" for name in ("loss", "mlm_loss", "mlm_accuracy", "sop_loss", "sop_accuracy")}
    expected |= {"optim/lr", "optim/grad_norm", "optim/loss_scale", "perf/samples_per_second",
                 "perf/tokens_per_second", "perf/memory_mib"}
    for block in range(4):  # widenet-tiny-e4: 4 blocks, 4 experts, one routing call per block
        expected |= {f"moe/block_{block:02d}/expert_{e:02d}_load" for e in range(4)}
        expected.add(f"moe/block_{block:02d}/dropped_fraction")
    assert not expected - tags, f"missing: {sorted(expected - tags)}"
    assert [e.step for e in accumulator.Scalars("train/loss")] == list(range(1, STEPS + 1))
    # TensorBoard and metrics.jsonl hold the same numbers (TensorBoard stores float32).
    jsonl = train_losses(reference, "moe/block_02/expert_01_load")
    for event in accumulator.Scalars("moe/block_02/expert_01_load"):
        assert event.value == pytest.approx(jsonl[event.step], rel=1e-6)
    for step in range(1, STEPS + 1):
        loads = [train_losses(reference, f"moe/block_00/expert_{e:02d}_load")[step] for e in range(4)]
        assert sum(loads) == pytest.approx(1.0)
    assert all(e.value > 0 for e in accumulator.Scalars("optim/grad_norm"))
    assert accumulator.Scalars("perf/memory_mib")[-1].value > 50


def test_batch_size_that_does_not_fit_two_ranks_fails_before_training(inputs):
    # 16 = 8 x 2 x 1 rank: right for one rank, wrong for two.
    ds = write_ds_config(inputs["root"] / "accum2.json", gradient_accumulation_steps=2)
    out = inputs["root"] / "bad_batch"
    args = run_args(inputs, out)
    args[args.index("--deepspeed_config") + 1] = str(ds)
    proc = run_train("pretrain", args, check=False)
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "train_batch_size 16 != train_micro_batch_size_per_gpu 8 x gradient_accumulation_steps 2 x 2" in text
    assert "set gradient_accumulation_steps to 1" in text
    assert not (out / "metrics.jsonl").exists() and not (out / "checkpoints").exists()


def launch_in(cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    """`widenet-ds launch` started in `cwd` (1 CPU rank)."""
    proc = subprocess.run([sys.executable, "-m", "widenet_ds.cli", "launch", "pretrain",
                           "--num-ranks", "1", "--master-port", str(free_port()), *argv], cwd=cwd,
                          env=child_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_a_run_started_with_relative_paths_continues_from_another_directory(inputs, tmp_path):
    """Issue 50, item 1: a run started in A with paths as typed (runs/x, data, ...), continued from B with
    `widenet-ds launch pretrain --config A/runs/x -- --resume --max-steps 4`: the steps after its checkpoint, in x's
    own folder; a --resume that finds nothing says so."""
    a, b = tmp_path / "A", tmp_path / "B"
    b.mkdir()
    shutil.copytree(inputs["data"], a / "data")
    shutil.copy(inputs["model"], a / "model.json")
    shutil.copy(REPO / "ds_configs/cpu_small.json", a / "cpu_small.json")
    first = launch_in(a, "--", "--model-config", "model.json", "--deepspeed_config", "cpu_small.json", "--data",
                      "data", "--output-dir", "runs/x", "--max-steps", "2", "--log-interval", "1",
                      "--eval-interval", "0", "--no-progress-bar", "--resume")
    assert "--resume: nothing to continue in runs/x (no checkpoint yet): starting a new run from step 1" \
        in first.stderr, first.stderr[-3000:]
    run = a / "runs" / "x"
    assert json.loads((run / "run_config.json").read_text())["data"] == str(a / "data")  # stored absolute
    launch_in(b, "--config", str(run), "--", "--resume", "--max-steps", "4")
    assert not (b / "runs").exists()
    assert sorted(train_losses(run)) == [1, 2, 3, 4]
    assert f"resumed from {run / 'checkpoints' / 'step2'}" in events(run)
    assert (run / "checkpoints" / "latest").read_text() == "step4"
