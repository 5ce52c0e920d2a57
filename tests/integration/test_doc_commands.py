"""The README's commands as a new user types them: each names the program it runs by the path the set-up gives it
(`./launcher.sh`, `.venv/bin/...`: a bare `deepspeed` or `widenet-ds` is whatever PATH finds, or nothing), and the
cheap ones run as written from the checkout (the others are timed by hand, the times stated beside them)."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.support.launching import REPO, child_env

README = REPO / "README.md"
CHEAP = [".venv/bin/widenet-ds params"]  # run as written, in the checkout


def commands() -> list[str]:
    """Every command of the README's bash blocks, continuation lines joined, comments left out."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), re.DOTALL):
        for command in re.sub(r"\\\n\s*", " ", block).splitlines():
            if command.strip() and not command.lstrip().startswith("#"):
                found.append(command.strip())
    return found


def test_every_command_names_its_program_by_the_set_ups_path():
    listed = commands()
    assert len(listed) > 20
    bare = [c for c in listed if not c.startswith(("./launcher.sh ", ".venv/bin/"))]
    assert not bare, f"commands that PATH would resolve (or not): {bare}"
    # DeepSpeed's launcher starts one rank on a CPU machine unless told how many: every call says it
    assert not [c for c in listed if c.startswith(".venv/bin/deepspeed ") and "--num_gpus" not in c]


@pytest.mark.parametrize("command", CHEAP)
def test_the_cheap_commands_run_as_written(command):
    assert command in commands()
    if not (REPO / ".venv/bin/widenet-ds").is_file():
        pytest.skip(f"no .venv in {REPO} (WIDENET_VENV elsewhere): the README's paths are the default set-up's")
    proc = subprocess.run(command, shell=True, cwd=REPO, env=child_env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "widenet-base-e8" in proc.stdout  # the preset the Usage commands train


def test_requires_python_caps_only_what_is_known_to_break():
    """`>=3.11,<3.12` refused every newer Python that torch and DeepSpeed support; nothing above 3.11 is known to
    break (the README says where 3.11 is still needed: the package mirror's torch wheel)."""
    import tomllib

    spec = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert spec == ">=3.11"
    assert "tested on 3.11 only" in README.read_text()
