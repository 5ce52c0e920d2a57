"""Stop signals relayed by `widenet-ds launch` (launch/launcher.py, launch/signals.py), 2 real CPU ranks under
the deepspeed launcher: SIGTERM to the launch process's PID stops both ranks within 60 s with a saved
checkpoint and exit status 0, and `--resume` continues with losses identical to an uninterrupted run; a
terminal's Ctrl-C (SIGINT to the launch process's group) does the same. The console of such a run has one
line per event, progress before step 1, validation lines, an error printed once, and no third-party set-up
chatter."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support.launching import REPO, child_env, free_port
from tests.support.pretrain_support import (
    CPU_CONFIG,
    events,
    train_losses,
    write_model_config,
)

pytestmark = pytest.mark.multirank
WIDENET_DS_LAUNCH = [sys.executable, "-m", "widenet_ds.cli", "launch"]
STEPS = 8


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, shared_data):
    from widenet_ds.data.prepare import cli as prepare_cli

    root = tmp_path_factory.mktemp("signal")
    assert prepare_cli(["--source", str(shared_data / "corpus/books/pg11.txt"), "--tokenizer", "train", "--vocab-size",
                        "1000", "--seq-length", "64", "--valid-fraction", "0.05", "--output", str(root / "data"),
                        "--workers", "1", "--no-progress"]) == 0
    return {"data": root / "data", "model": write_model_config(root / "model.json"), "root": root}


def launch(inputs, out: Path, *extra: str) -> subprocess.Popen:
    args = ["--model-config", str(inputs["model"]), "--deepspeed_config", str(CPU_CONFIG), "--data",
            str(inputs["data"]), "--output-dir", str(out), "--max-steps", str(STEPS), "--log-interval", "1",
            "--save-interval", "2", "--eval-interval", "4", "--eval-batches", "1", "--no-progress-bar",
            "--no-tensorboard", *extra]
    # A session of its own, as a terminal gives a command: its process group is the one Ctrl-C signals. And
    # SIGINT at its default, as a terminal's shell starts a foreground command: a suite started as a
    # background job (`nohup ... &`) ignores SIGINT, its children inherit that, and the launcher leaves an
    # ignored signal ignored (launch/launcher.py), so Ctrl-C would not be tested at all.
    return subprocess.Popen([*WIDENET_DS_LAUNCH, "pretrain", "--num-ranks", "2", "--master-port", str(free_port()),
                             "--", *args], cwd=REPO, env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def wait_for_checkpoint(proc: subprocess.Popen, out: Path) -> list[psutil.Process]:
    """The ranks, once the run has saved its first checkpoint."""
    latest = out / "checkpoints" / "latest"
    deadline = time.monotonic() + 240
    while not latest.is_file():
        assert proc.poll() is None, f"run ended before its first checkpoint:\n{proc.stdout.read()[-4000:]}"
        assert time.monotonic() < deadline, "no checkpoint within 240 s"
        time.sleep(0.01)
    ranks = [p for p in psutil.Process(proc.pid).children(recursive=True)
             if any(part.startswith("--local_rank") for part in p.cmdline())]
    assert len(ranks) == 2
    return ranks


def assert_stopped_and_saved(proc: subprocess.Popen, ranks: list[psutil.Process], out: Path, signalled: float,
                             signal_name: str, said: str) -> str:
    output, _ = proc.communicate(timeout=60)
    assert time.monotonic() - signalled < 60
    assert proc.returncode == 0, output[-4000:]
    assert not any(r.is_running() and r.status() != psutil.STATUS_ZOMBIE for r in ranks), "a rank outlived the launcher"
    assert f"widenet-ds launch: {said}{signal_name} sent to the 2 ranks, which save a checkpoint and exit\n" in output
    assert any(e.startswith(f"stopped by {signal_name}") for e in events(out)), events(out)
    stop_step = max(train_losses(out))
    assert stop_step < STEPS, "the run finished before the signal; the test proved nothing"
    assert (out / "checkpoints" / "latest").read_text() == f"step{stop_step}"
    return output


def finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    output, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, output[-4000:]
    return output


def test_sigterm_to_the_launcher_pid_stops_both_ranks_with_a_checkpoint_and_resumes_exactly(inputs):
    reference = inputs["root"] / "reference"
    console = finish(launch(inputs, reference))
    check_console(console)

    out = inputs["root"] / "signalled"
    proc = launch(inputs, out)
    ranks = wait_for_checkpoint(proc, out)
    signalled = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)  # the launcher's own PID, as a user or scheduler would
    assert_stopped_and_saved(proc, ranks, out, signalled, "SIGTERM", "")

    finish(launch(inputs, out, "--resume"))
    expected, got = train_losses(reference), train_losses(out)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert {s: got[s] for s in expected if got[s] != expected[s]} == {}, "losses differ after the resume"


def test_ctrl_c_in_a_terminal_saves_like_sigterm(inputs):
    """A terminal sends SIGINT to its foreground process group: only `widenet-ds launch` is in it (the runner
    has a group of its own), and it relays a TERM; the ranks never see the INT, which would kill them."""
    out = inputs["root"] / "interrupted"
    proc = launch(inputs, out)
    ranks = wait_for_checkpoint(proc, out)
    signalled = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    output = assert_stopped_and_saved(proc, ranks, out, signalled, "SIGTERM", said="Ctrl-C (SIGINT): ")
    assert "KeyboardInterrupt" not in output and "Traceback" not in output


def check_console(console: str) -> None:
    lines = console.splitlines()
    first_step = next(i for i, line in enumerate(lines) if line.startswith("[step 1]"))
    before = "\n".join(lines[:first_step])
    for phase in ("checking the data", "building the model", "initialising DeepSpeed", "training: steps 1 to"):
        assert phase in before, f"no progress line {phase!r} before step 1:\n{console}"
    assert [line for line in lines if "validation: loss" in line][0].startswith("[step 4] validation: loss")
    for chatter in ("Setting accelerator", "No existing process group", "built successfully", "[INFO]", "[WARNING]",
                    "WORLD INFO", "Warning"):
        assert chatter not in console, f"third-party line {chatter!r} on the console:\n{console}"
    # One line per event: nothing printed once per rank.
    repeated = {line for line in lines if lines.count(line) > 1}
    assert not repeated, f"lines printed more than once: {repeated}"


def test_an_error_of_a_two_rank_run_is_printed_once(inputs):
    bad = inputs["root"] / "bad_ds.json"
    config = json.loads(CPU_CONFIG.read_text())
    config["zero_optimization"] = {"stage": 1, "overlap_com": True}
    bad.write_text(json.dumps(config))
    proc = subprocess.Popen([*WIDENET_DS_LAUNCH, "pretrain", "--num-ranks", "2", "--master-port", str(free_port()),
                             "--",
                             "--model-config", str(inputs["model"]), "--deepspeed_config", str(bad), "--data",
                             str(inputs["data"]), "--output-dir", str(inputs["root"] / "bad"), "--max-steps", "2"],
                            cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 2, output
    errors = [line for line in output.splitlines() if re.search(r"error", line, re.IGNORECASE)]
    assert len(errors) == 1 and "Did you mean 'overlap_comm'" in errors[0], output
    assert "Traceback" not in output and not (inputs["root"] / "bad" / "metrics.jsonl").exists()


def test_a_killed_rank_ends_the_launch_with_its_status_and_one_line_saying_so(inputs):
    proc = launch(inputs, inputs["root"] / "killed")
    deadline = time.monotonic() + 240
    while len(ranks := [p for p in psutil.Process(proc.pid).children(recursive=True)
                        if any(part.startswith("--local_rank") for part in p.cmdline())]) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.05)
    ranks[0].kill()
    output, _ = proc.communicate(timeout=120)
    # deepspeed's launch.py exits with the rank's -9, which reads 247; the other rank is stopped by it
    assert proc.returncode == 256 - signal.SIGKILL, output[-4000:]
    assert output.count("widenet-ds launch: the run ended with exit status 247 (a rank was killed by SIGKILL)") == 1
    assert not any(r.is_running() and r.status() != psutil.STATUS_ZOMBIE for r in ranks), "a rank outlived the launcher"
