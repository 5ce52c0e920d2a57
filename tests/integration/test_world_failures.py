"""Runs that fail safely when the world, not the flags, goes wrong -- real runs, real files, real ports:

- two runs into one folder: the second is refused naming the first (fresh or with --resume), the first
  trains to its end unharmed;
- a full disk: a checkpoint that cannot fit is refused before anything of it is written; a disk filling up
  while one rank of two writes (real ENOSPC on a small tmpfs, or simulated where none can be mounted) is one
  error on every rank, printed once, with no partial tag; the last complete checkpoint stays whole and
  --resume continues once space is freed;
- a busy rendezvous port: `widenet-ds launch` without --master-port runs beside a listener on deepspeed's
  default port; `deepspeed --master_port P` with P taken stops at rank 0, naming the holder; of two 1-rank runs
  started together with one MASTER_PORT one trains, the other stops naming it (10 times in a row);
- a truncated checkpoint file is named before training starts, on every rank of a 2-rank --resume.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.launch_inputs import (
    prepare_tiny_corpus,
    pretrain_args,
    tiny_model_config,
)
from tests.support.launching import (
    REPO,
    child_env,
    deepspeed_launcher,
    python_train_command,
    run_deepspeed,
    run_train,
)
from tests.support.pretrain_support import train_losses
from widenet_ds.checkpoint.source import CONVERT, CheckpointSource
from widenet_ds.distributed.ports import free_port, port_is_free
from widenet_ds.fs.run_lock import LOCK_FILE

pytestmark = pytest.mark.multirank
FULL_DISK = REPO / "tests" / "scripts" / "train_disk_fills.py"
DEEPSPEED_DEFAULT_PORT = 29500


@pytest.fixture(scope="module")
def inputs(shared_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("world")
    return prepare_tiny_corpus(shared_data, root / "data"), tiny_model_config(root / "model.json")


def error_lines(output: str) -> list[str]:
    """Our error lines (`PROG: error: ...`); the deepspeed launcher's own "[ERROR] ... exits with return code"
    bookkeeping (silenced by `widenet-ds launch`) is not one."""
    return [line for line in output.splitlines() if re.search(r": error( \(rank \d+\))?: ", line)]


def no_traceback(output: str) -> str:
    """The output around a traceback, for the assertion message."""
    at = output.find("Traceback")
    return "" if at < 0 else output[max(0, at - 2000): at + 4000]


def tags(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir() if p.is_dir())


def digits_args(tmp_path: Path, out: Path, steps: int, *extra: str) -> list[str]:
    config = json.loads((REPO / "ds_configs" / "vision_cpu_small.json").read_text())
    config["scheduler"]["params"].update(total_num_steps=steps, warmup_num_steps=1)
    (tmp_path / "ds.json").write_text(json.dumps(config))
    return ["--model-config", "widenet-vit-digits", "--dataset", "digits", "--deepspeed_config", str(tmp_path / "ds.json"),
            "--output-dir", str(out), "--max-steps", str(steps), "--log-interval", "1", "--save-interval", "20",
            "--eval-interval", "0", "--workers", "0", "--no-progress-bar", "--no-tensorboard", *extra]


# --- one writer per run folder ----------------------------------------------------------------------
def test_a_second_run_into_the_same_folder_is_refused_and_the_first_is_unharmed(tmp_path):
    out, steps = tmp_path / "digits", 200
    first = subprocess.Popen(python_train_command("classify", digits_args(tmp_path, out, steps)), cwd=REPO,
                             env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not (out / LOCK_FILE).is_file():
        assert first.poll() is None, f"the first run ended before taking its lock:\n{first.stdout.read()[-3000:]}"
        assert time.monotonic() < deadline, "the first run took no lock"
        time.sleep(0.05)
    for extra in ((), ("--resume",)):  # started beside it, and a --resume of it while it trains
        second = subprocess.run(python_train_command("classify", digits_args(tmp_path, out, steps, *extra)), cwd=REPO,
                                env=child_env(), capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stderr[-3000:]
        assert "Traceback" not in second.stderr and len(error_lines(second.stderr)) == 1, second.stderr[-3000:]
        assert re.search(rf"{out} is being written by another process: PID {first.pid} on {socket.gethostname()}, "
                         rf"started .*python -m widenet_ds.train classify.*wait for that one to end", second.stderr), \
            second.stderr[-3000:]
        assert first.poll() is None, "the first run finished before the second was refused; the test proved nothing"
    output, _ = first.communicate(timeout=600)
    assert first.returncode == 0, output[-3000:]
    # the first run's records are its own, each step once; its checkpoint is whole; the lock is given back
    steps_logged = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()
                    if "train/loss" in line]
    assert steps_logged == list(range(1, steps + 1))
    assert CheckpointSource.open(out, "checkpoint", purpose=CONVERT).verified.path.name == f"step{steps}"
    assert json.loads((out / "results.json").read_text())["test/accuracy"] > 0
    assert not (out / LOCK_FILE).exists()


# --- a full disk ------------------------------------------------------------------------------------
def test_a_checkpoint_that_cannot_fit_is_refused_before_writing_and_resume_continues_after_freeing(
        inputs, small_disk):
    """A 20 MiB disk holds one checkpoint of this model (11 MiB), not two: the run saves step 1, refuses step 2
    before writing any of it, and stops; with more space (the disk grown, as after deleting files) --resume
    continues from step 1 to the end."""
    data, model = inputs
    disk = small_disk("20m")
    run = disk / "run"
    args = pretrain_args(data, model, run, 3, save_interval=1)
    proc = subprocess.run(python_train_command("pretrain", args), cwd=REPO, env=child_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and len(error_lines(proc.stderr)) == 1, proc.stderr[-3000:]
    assert re.search(rf"error: not enough space in {run}/checkpoints for the checkpoint of step 2: about 1\d\.\d MiB "
                     rf"needed, \d\.\d MiB free; nothing was written\. The run stopped at step 2 without saving it\. "
                     rf"The last complete checkpoint is {run}/checkpoints/step1: free at least 1\d\.\d MiB in "
                     rf"{run}/checkpoints, then continue with --resume\.", proc.stderr), \
        proc.stderr[-3000:]
    assert tags(run) == ["step1"] and (run / "checkpoints" / "latest").read_text() == "step1"
    assert CheckpointSource.open(run, "checkpoint", purpose=CONVERT).verified.files > 0 and not (run / LOCK_FILE).exists()

    small_disk.resize(disk, "40m")
    proc = subprocess.run(python_train_command("pretrain", [*args, "--resume"]), cwd=REPO, env=child_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(train_losses(run)) == [1, 2, 3] and (run / "checkpoints" / "latest").read_text() == "step3"


@pytest.fixture
def filling_disk(tmp_path, small_disk):
    """Where the run writes, and how its disk fills: a real small tmpfs that a file fills up (real ENOSPC from
    torch's writer), or -- where none can be mounted -- any disk with the write raising ENOSPC. One of the
    two, not both: they take the same path through the trainer, and each costs a minute of 2-rank runs."""
    disk = small_disk("40m", skip=False)
    return (disk, "fill") if disk is not None else (tmp_path, "raise")


def test_a_disk_filling_up_during_a_save_on_one_rank_is_one_error_and_leaves_no_partial_checkpoint(
        inputs, filling_disk):
    data, model = inputs
    where, mode = filling_disk
    run = where / "run"
    args = pretrain_args(data, model, run, 3, save_interval=1)
    env = {"WIDENET_TEST_FULL_RANK": "1", "WIDENET_TEST_FULL_TAG": "step2", "WIDENET_TEST_FULL_MODE": mode}
    proc = run_deepspeed(FULL_DISK, ["pretrain", *args], num_ranks=2, env=env, check=False, timeout=400)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-4000:]
    assert not no_traceback(output), no_traceback(output)
    assert len(error_lines(output)) == 1, output[-4000:]
    assert re.search(rf"error: the checkpoint of step 2 could not be saved: there is not enough space in "
                     rf"{run}/checkpoints \(about 1\d\.\d MiB needed\) \[(rank 0: .*; )?rank 1: the disk is full .*\]\. Its partial "
                     rf"files were removed and the run stopped at step 2\. The last complete checkpoint is "
                     rf"{run}/checkpoints/step1: free at least", output), output[-4000:]
    assert tags(run) == ["step1"] and (run / "checkpoints" / "latest").read_text() == "step1"
    assert CheckpointSource.open(run, "checkpoint", purpose=CONVERT).verified.files > 0

    (run / "filler.bin").unlink(missing_ok=True)  # space freed
    run_train("pretrain", [*args, "--resume"], num_ranks=2, timeout=400)
    assert sorted(train_losses(run)) == [1, 2, 3] and tags(run) == ["step1", "step2", "step3"]


# --- a busy rendezvous port -------------------------------------------------------------------------
def test_launch_without_a_port_runs_beside_a_listener_on_the_default_port(tmp_path):
    listener = socket.socket()
    try:
        listener.bind(("", DEEPSPEED_DEFAULT_PORT))
        listener.listen()
    except OSError:  # another program holds it already: the condition under test
        assert not port_is_free(DEEPSPEED_DEFAULT_PORT)
    try:
        proc = subprocess.run([sys.executable, "-m", "widenet_ds.cli", "launch", "classify", "--num-ranks", "2", "--",
                               *digits_args(tmp_path, tmp_path / "out", 2)], cwd=REPO, env=child_env(),
                              capture_output=True, text=True, timeout=400)
    finally:
        listener.close()
    assert proc.returncode == 0, proc.stderr[-4000:]
    port = int(re.search(r"--master_port (\d+)", proc.stdout).group(1))
    assert port != DEEPSPEED_DEFAULT_PORT and (tmp_path / "out" / "results.json").is_file()


def test_deepspeed_started_by_hand_on_a_busy_port_stops_at_rank_0_naming_the_holder(tmp_path):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        start = time.monotonic()
        proc = subprocess.run([deepspeed_launcher(), "--num_gpus", "2", "--master_port", str(port), "--module",
                               "widenet_ds.train", "classify", *digits_args(tmp_path, tmp_path / "out", 2)],
                              cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-4000:]
    assert not no_traceback(output), no_traceback(output)
    assert len(error_lines(output)) == 1, output[-4000:]
    assert re.search(rf"error: the rendezvous port {port} on .* is in use by PID {os.getpid()} .*start again with "
                     rf"another port, e.g. `widenet-ds launch --master-port \d+", output), output[-4000:]
    # Rank 1 waits in the rendezvous rank 0 never served: deepspeed's launch.py TERMs it as rank 0 exits, and it
    # ends then (its TERM handler comes after the rendezvous), not at launch.py's SIGKILL 30 s later.
    assert time.monotonic() - start < 30 and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_two_runs_started_together_on_one_master_port_one_trains_the_other_names_it(tmp_path):
    """A job array or script that hard-codes MASTER_PORT: both runs find the port free before either binds it.
    The bind is the check: the second is one error naming the first, never torch's EADDRINUSE traceback. Three
    pairs: either run may win, and each pair races anew."""
    for attempt in range(3):
        port, outs = free_port(), [tmp_path / f"{attempt}-a", tmp_path / f"{attempt}-b"]
        runs = [subprocess.Popen(python_train_command("classify", digits_args(tmp_path, out, 1, "--max-eval-examples",
                                                                              "8")),
                                 cwd=REPO, env=child_env(MASTER_PORT=str(port)), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True) for out in outs]
        outputs = [run.communicate(timeout=300)[0] for run in runs]
        codes = [run.returncode for run in runs]
        assert sorted(codes) == [0, 2], f"attempt {attempt}: exit statuses {codes}\n" + "\n".join(o[-3000:] for o in outputs)
        winner, loser = codes.index(0), codes.index(2)
        assert (outs[winner] / "results.json").is_file() and not outs[loser].exists()
        assert not no_traceback(outputs[loser]), no_traceback(outputs[loser])
        assert len(error_lines(outputs[loser])) == 1, outputs[loser][-3000:]
        assert re.search(rf"error: the rendezvous port {port} on .* is in use by PID {runs[winner].pid} .*it was set by "
                         rf"MASTER_PORT: set another \(e\.g\. MASTER_PORT=\d+\)", outputs[loser]), outputs[loser][-3000:]


# --- a damaged checkpoint ---------------------------------------------------------------------------
def test_a_truncated_file_of_rank_1_is_named_before_any_rank_trains(inputs, tmp_path):
    data, model = inputs
    run = tmp_path / "run"
    run_train("pretrain", pretrain_args(data, model, run, 2), num_ranks=2, timeout=400)
    zero = run / "checkpoints" / "step2" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    size = zero.stat().st_size
    zero.write_bytes(zero.read_bytes()[: size // 3])
    proc = run_train("pretrain", pretrain_args(data, model, run, 4, resume="latest"), num_ranks=2, timeout=400, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-4000:]
    assert not no_traceback(output), no_traceback(output)
    assert len(error_lines(output)) == 1, output[-4000:]
    assert f"zero_pp_rank_1_mp_rank_00_optim_states.pt: {size // 3:,} bytes, written with {size:,} (truncated)" \
        in output, output[-4000:]
    # no rank loaded or trained: nothing resumed, no step started, nothing of the run changed
    assert "resumed from" not in output and "training: steps" not in output and "initialising DeepSpeed" not in output
    assert sorted(train_losses(run)) == [1, 2]
