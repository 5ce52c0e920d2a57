"""`./launcher.sh setup` as a new clone's first command, into a fresh virtual environment: a line per step, then
pip's own progress (not --quiet: what it collects and installs), no setuptools notice a user cannot act on, a
`widenet-ds` that runs; run again, it does nothing (its stamp matches pyproject.toml)."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.support.launching import REPO, child_env

pytestmark = pytest.mark.slow  # a whole set-up: torch and every pinned package installed (~100 s, pip's cache warm)


def test_setup_says_each_step_and_pips_progress_and_no_notice_a_user_cannot_act_on(tmp_path):
    venv = tmp_path / "venv"
    env = child_env(WIDENET_VENV=str(venv))
    proc = subprocess.run([str(REPO / "launcher.sh"), "setup"], env=env, capture_output=True, text=True, timeout=1800)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert re.findall(r"^\[setup\] (\d)/4 ", proc.stderr, re.MULTILINE) == ["1", "2", "3", "4"], proc.stderr[-4000:]
    # pip's own lines, between the steps' (what it installs, as it goes)
    torch_step = proc.stderr.split("[setup] 3/4 ", 1)[1].split("[setup] 4/4 ", 1)[0]
    assert "Installing collected packages:" in torch_step and "torch-2.13.0" in torch_step
    assert "Successfully installed" in proc.stderr.split("[setup] 4/4 ", 1)[1]
    assert "Editable installation" not in output and "Please be careful" not in output, output[-4000:]
    assert subprocess.run([str(venv / "bin" / "widenet-ds"), "--help"], env=env, capture_output=True,
                          timeout=120).returncode == 0
    again = subprocess.run([str(REPO / "launcher.sh"), "setup"], env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and again.stdout == again.stderr == "", again.stderr
