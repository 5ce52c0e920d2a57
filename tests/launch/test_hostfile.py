"""DeepSpeed's hostfile checked before a launch: hosts resolve, lines parse, the ranks fit the slots."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.launching import REPO
from widenet_ds.errors import LaunchError
from widenet_ds.launch.hostfile import check_hostfile, cli

BIN = Path(sys.executable).parent
LAUNCHER_SH = REPO / "launcher.sh"
WIDENET_DS = [sys.executable, "-m", "widenet_ds.cli"]
TRAIN = [sys.executable, "-m", "widenet_ds.train"]
# --- hostfile and world checks -------------------------------------------------------------------
def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_hostfile_with_unresolvable_host_names_host_and_fix(tmp_path):
    hostfile = write(tmp_path / "hosts", "localhost slots=2\n# a comment\nno-such-node.invalid slots=8\n")
    with pytest.raises(LaunchError, match=r"host 'no-such-node.invalid' .* does not resolve.*/etc/hosts"):
        check_hostfile(hostfile)


def test_more_ranks_than_slots_is_refused(tmp_path):
    hostfile = write(tmp_path / "hosts", "localhost slots=2\n127.0.0.1 slots=1\n")
    assert check_hostfile(hostfile, 3) == {"localhost": 2, "127.0.0.1": 1}
    with pytest.raises(LaunchError, match=r"4 ranks requested but hostfile .* offers 3 slots.*request at most 3"):
        check_hostfile(hostfile, 4)
    # --num_gpus G starts G ranks on every chosen host: each needs G slots.
    with pytest.raises(LaunchError, match=r"2 ranks per node .* fewer slots to 127.0.0.1: 1"):
        check_hostfile(hostfile, num_nodes=2, ranks_per_node=2)
    assert check_hostfile(hostfile, num_nodes=1, ranks_per_node=2) == {"localhost": 2}
    with pytest.raises(LaunchError, match=r"3 nodes requested but hostfile .* lists 2 hosts"):
        check_hostfile(hostfile, num_nodes=3)


@pytest.mark.parametrize("text, message", [
    ("localhost 2\n", r"is not `<host> slots=<N>`"),
    ("localhost slots=2\nlocalhost slots=2\n", r"listed twice"),
    ("localhost slots=0\n", r"slots=0"),
    ("# only a comment\n", r"lists no hosts"),
])
def test_malformed_hostfile_names_the_line(tmp_path, text, message):
    with pytest.raises(LaunchError, match=message):
        check_hostfile(write(tmp_path / "hosts", text))


def test_missing_hostfile(tmp_path):
    with pytest.raises(LaunchError, match=r"does not exist.*leave out --hostfile"):
        check_hostfile(tmp_path / "nope")


def test_check_hostfile_cli(tmp_path, capsys):
    hostfile = write(tmp_path / "hosts", "localhost slots=2\n")
    assert cli(["check-hostfile", "--hostfile", str(hostfile), "--num-ranks", "2"]) == 0
    assert capsys.readouterr().out.strip() == "localhost:2"
    assert cli(["check-hostfile", "--hostfile", str(hostfile), "--num-gpus", "3"]) == 2
    assert "request at most 2 GPUs per node" in capsys.readouterr().err
