"""Image classification (`python -m widenet_ds.train classify`) on the one trainer: digits learns far above
chance (1 rank); ep 1 = ep 2 forward on 2 ranks; an ep-2 run killed with SIGKILL resumes with identical losses
(augmentation, mixup and gate noise included)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.support.launching import REPO, child_env, python_train_command, run_deepspeed, run_train, train_command
from tests.support.pretrain_support import events, train_losses
from tests.support.report_page import parse_page, report
from widenet_ds.commands.params import preset_counts
from widenet_ds.fs.run_lock import LOCK_FILE
from widenet_ds.run_folder import RunFolder
from widenet_ds.tasks.classify.results import ClassifyResults

EP_FORWARD = REPO / "tests" / "scripts" / "vision_expert_parallel_forward.py"


def write_ds_config(path: Path, steps: int, lr: float = 0.003, **changes) -> Path:
    config = json.loads((REPO / "ds_configs" / "vision_cpu_small.json").read_text())
    config["optimizer"]["params"]["lr"] = lr
    config["scheduler"]["params"].update(total_num_steps=steps, warmup_num_steps=max(1, steps // 10), warmup_max_lr=lr)
    config.update(changes)
    path.write_text(json.dumps(config))
    return path


@pytest.mark.slow  # a real run to convergence (24 s of CPU)
def test_digits_single_rank_learns_far_above_chance(tmp_path):
    ds = write_ds_config(tmp_path / "ds.json", steps=120)
    out = tmp_path / "digits"
    start = time.monotonic()
    proc = subprocess.run(python_train_command("classify", [
        "--model-config", "widenet-vit-digits", "--dataset", "digits", "--deepspeed_config", str(ds), "--output-dir",
        str(out), "--log-interval", "40", "--eval-interval", "0", "--workers", "0", "--no-progress-bar",
        "--no-tensorboard"]), cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads((out / "results.json").read_text())
    # 10 balanced classes: chance is 0.1; a trained model is far above it.
    assert results["test/accuracy"] > 0.7, results
    losses = train_losses(out)
    assert losses[120] < losses[40] - 0.5, losses
    loads = [train_losses(out, f"moe/block_03/expert_{e:02d}_load")[120] for e in range(4)]
    assert sum(loads) == pytest.approx(1.0) and min(loads) > 0.05, loads  # the balance loss keeps experts in use
    print(f"digits: test accuracy {results['test/accuracy']:.3f} in {time.monotonic() - start:.0f} s")


@pytest.mark.multirank
def test_expert_parallel_two_ranks_matches_ep1(tmp_path):
    run_deepspeed(EP_FORWARD, [str(tmp_path / "ep"), "widenet-vit-digits", "1", "2"], num_ranks=2)  # one launch
    for rank in (0, 1):
        ep1 = load_file(tmp_path / f"ep1.rank{rank}.safetensors")
        ep2 = load_file(tmp_path / f"ep2.rank{rank}.safetensors")
        torch.testing.assert_close(ep2["logits"], ep1["logits"], atol=1e-5, rtol=0)
        torch.testing.assert_close(ep2["loss"], ep1["loss"], atol=1e-5, rtol=0)
        assert torch.equal(ep2["expert_counts"], ep1["expert_counts"])
        assert ep1["expert_counts"].shape == (4, 4)  # 4 routing blocks, 4 experts
    # the two ranks saw different images: a comparison of equal outputs would prove little
    assert not torch.allclose(load_file(tmp_path / "ep1.rank0.safetensors")["logits"],
                              load_file(tmp_path / "ep1.rank1.safetensors")["logits"])


STEPS, SAVE_EVERY = 8, 3


def resume_args(ds: Path, out: Path, *extra: str) -> list[str]:
    return ["--model-config", "widenet-vit-digits", "--dataset", "digits", "--deepspeed_config", str(ds),
            "--output-dir", str(out), "--ep-size", "2", "--log-interval", "1", "--save-interval", str(SAVE_EVERY),
            "--eval-interval", "4", "--workers", "1", "--no-progress-bar", "--no-tensorboard",
            "--randaugment", "1,10", "--inception-crop", "--flip", "--mixup-alpha", "0.5", "--label-smoothing", "0.1",
            *extra]


@pytest.mark.multirank
@pytest.mark.slow
def test_sigkill_then_resume_gives_identical_losses(tmp_path):
    ds = write_ds_config(tmp_path / "zero2.json", steps=STEPS, zero_optimization={"stage": 2})
    reference = tmp_path / "reference"
    run_train("classify", resume_args(ds, reference))
    assert sorted(train_losses(reference)) == list(range(1, STEPS + 1))
    # the report's trainable parameters: the whole model's, though each of the 2 ranks holds 2 of the 4 experts
    parameters = preset_counts("widenet-vit-digits")["total"]
    assert RunFolder(reference).read_results(ClassifyResults).parameters == parameters
    assert report(reference, "--output", tmp_path / "report").returncode == 0
    assert parse_page(tmp_path / "report" / "index.html").cells[("reference", "results", "parameters")] == \
        str(parameters)

    out = tmp_path / "killed"
    proc = subprocess.Popen(train_command("classify", resume_args(ds, out)), cwd=REPO, env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, text=True)
    latest = out / "checkpoints" / "latest"
    deadline = time.monotonic() + 240
    while not latest.is_file():
        if proc.poll() is not None:
            pytest.fail(f"run ended ({proc.returncode}) before its first checkpoint:\n{proc.stdout.read()[-4000:]}")
        assert time.monotonic() < deadline, "no checkpoint within the timeout"
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)  # launcher and both ranks: nothing saved after this
    proc.wait(timeout=60)
    killed_at = latest.read_text()
    assert killed_at != f"step{STEPS}", "the run finished before it was killed; the test proved nothing"

    holder = json.loads((out / LOCK_FILE).read_text())["pid"]  # the killed run's lock, left behind
    resumed = run_train("classify", resume_args(ds, out, "--resume"))
    assert any(e.startswith("resumed from") for e in events(out))
    output = resumed.stdout + resumed.stderr
    assert f"took over the lock of {out}: its holder, PID {holder} on" in output and "no longer runs" in output, \
        output[-3000:]
    assert not (out / LOCK_FILE).exists()
    for key in ("train/loss", "train/accuracy", "test/accuracy", "moe/block_01/expert_02_load"):
        expected, got = train_losses(reference, key), train_losses(out, key)
        assert sorted(got) == sorted(expected), key
        assert got == expected, f"{key} differs after resume (killed at {killed_at})"
