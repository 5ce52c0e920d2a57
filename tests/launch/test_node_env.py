"""What a multi-node launch hands every node's ranks (launch/node_env.py; the real 2-node runs:
tests/integration/test_two_nodes.py)."""

from __future__ import annotations

from pathlib import Path

from widenet_ds.launch.launcher import plan_launch
from widenet_ds.launch.node_env import ranks_env, runner_env_file
from widenet_ds.launch.options import LaunchOptions, Machine


def test_the_user_s_rank_variables_and_the_launch_s_own_changes_are_forwarded():
    environ = {"OMP_NUM_THREADS": "3", "TORCH_EXTENSIONS_DIR": "/shared/ext", "WIDENET_SHARED_DATA": "/d",
               "HOME": "/root", "PATH": "/usr/bin", "PYTHONPATH": "/x"}
    chosen = ranks_env(environ, {"DS_ACCELERATOR": "cpu", "PYTHONPATH": "/repo:/x"})
    # PYTHONPATH travels by itself (DeepSpeed forwards PYTHON*); HOME and PATH are the node's own
    assert chosen == {"OMP_NUM_THREADS": "3", "TORCH_EXTENSIONS_DIR": "/shared/ext", "WIDENET_SHARED_DATA": "/d",
                      "DS_ACCELERATOR": "cpu"}


def test_a_hostfile_launch_plans_the_node_environment_and_a_local_one_does_not(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    machine = Machine(cores=4, has_gpu=False)
    several = plan_launch(LaunchOptions("pretrain", hostfile=hostfile, ranks_per_node=2), machine, environ={})
    assert several.node_env["OMP_NUM_THREADS"] == "2" and several.node_env["DS_ACCELERATOR"] == "cpu"
    assert plan_launch(LaunchOptions("pretrain", ranks_per_node=2), machine, environ={}).node_env == {}


def test_the_env_file_keeps_the_user_s_deepspeed_env_lines_after_ours(tmp_path, monkeypatch):
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    (home / ".deepspeed_env").write_text("NCCL_SOCKET_IFNAME=eth1\nnot a variable\n")
    (cwd / ".deepspeed_env").write_text("OMP_NUM_THREADS=4")
    change = runner_env_file({"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}, tmp_path, environ={}, cwd=cwd)
    path = Path(change["DS_ENV_FILE"])
    assert path.is_absolute()  # DeepSpeed joins it to ~ and ., which leaves an absolute path as it is
    assert path.read_text().splitlines() == ["OMP_NUM_THREADS=1", "DS_ACCELERATOR=cpu", "NCCL_SOCKET_IFNAME=eth1",
                                             "OMP_NUM_THREADS=4"]
