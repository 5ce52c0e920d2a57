"""Issue 16 item 3: SIGTERM to the PID of `launcher.sh pretrain` stops both ranks within 60 s with a
saved checkpoint and exit status 0, and `--resume` continues with losses identical to an uninterrupted
run (2 real CPU ranks under the deepspeed launcher)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from launching import REPO, child_env, free_port  # noqa: E402
from pretrain_support import CPU_CONFIG, events, train_losses, write_model_config  # noqa: E402

pytestmark = pytest.mark.multirank
LAUNCHER_SH = REPO / "launcher.sh"
STEPS = 12


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, shared_data):
    from launch_inputs import prepare_tiny_corpus

    root = tmp_path_factory.mktemp("signal")
    return {"data": prepare_tiny_corpus(shared_data, root / "data"),
            "model": write_model_config(root / "model.json"), "root": root}


def launcher_env() -> dict[str, str]:
    venv = Path(sys.executable).parent.parent
    return child_env(WIDENET_VENV=str(venv), PATH=f"{venv / 'bin'}:{os.environ['PATH']}")


def launch(inputs, out: Path, *extra: str) -> subprocess.Popen:
    args = ["--model-config", str(inputs["model"]), "--deepspeed_config", str(CPU_CONFIG), "--data",
            str(inputs["data"]), "--output-dir", str(out), "--max-steps", str(STEPS), "--log-interval", "1",
            "--save-interval", "3", "--eval-interval", "0", "--no-progress-bar", "--no-tensorboard", *extra]
    return subprocess.Popen([str(LAUNCHER_SH), "pretrain", "--num-gpus", "2", "--master-port", str(free_port()),
                             "--", *args], cwd=REPO, env=launcher_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    output, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, output[-4000:]
    return output


def test_sigterm_to_the_launcher_pid_stops_both_ranks_with_a_checkpoint_and_resumes_exactly(inputs):
    reference = inputs["root"] / "reference"
    finish(launch(inputs, reference))

    out = inputs["root"] / "signalled"
    proc = launch(inputs, out)
    latest = out / "checkpoints" / "latest"
    deadline = time.monotonic() + 240
    while not latest.is_file():
        assert proc.poll() is None, f"run ended before its first checkpoint:\n{proc.stdout.read()[-4000:]}"
        assert time.monotonic() < deadline, "no checkpoint within 240 s"
        time.sleep(0.01)
    import psutil

    ranks = [p for p in psutil.Process(proc.pid).children(recursive=True)
             if any(part.startswith("--local_rank") for part in p.cmdline())]
    assert len(ranks) == 2
    signalled = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)  # the launcher's own PID, as a user or scheduler would
    output, _ = proc.communicate(timeout=60)
    assert time.monotonic() - signalled < 60
    assert proc.returncode == 0, output[-4000:]
    assert not any(r.is_running() and r.status() != psutil.STATUS_ZOMBIE for r in ranks), "a rank outlived the launcher"
    assert "SIGTERM sent to 2 rank(s)" in output
    assert any(e.startswith("stopped by SIGTERM") for e in events(out)), events(out)
    stop_step = max(train_losses(out))
    assert stop_step < STEPS, "the run finished before the signal; the test proved nothing"
    assert latest.read_text() == f"step{stop_step}"

    finish(launch(inputs, out, "--resume"))
    expected, got = train_losses(reference), train_losses(out)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert {s: got[s] for s in expected if got[s] != expected[s]} == {}, "losses differ after the resume"


def test_zero_ranks_is_refused_by_launcher_sh():
    proc = subprocess.run([str(LAUNCHER_SH), "pretrain", "--num-gpus", "0", "--", "--anything"],
                          env=launcher_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--num-gpus '0' must be a whole number >= 1" in proc.stderr
