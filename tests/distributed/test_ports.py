"""Rendezvous ports: a port another program listens on is one error naming that program -- from
`widenet-ds launch --master-port` before any rank starts, and from rank 0 failing to bind it (a run started by
hand: deepspeed, srun, mpiexec; or two runs racing for one port, tests/integration/test_world_failures.py)."""

from __future__ import annotations

import os
import socket

import pytest
from torch.distributed import TCPStore

from widenet_ds.distributed.groups import rendezvous_port_errors
from widenet_ds.distributed.launch_env import LaunchEnv
from widenet_ds.distributed.ports import free_port, port_holder, port_is_free
from widenet_ds.errors import LaunchError
from widenet_ds.launch.launcher import plan_launch
from widenet_ds.launch.options import LaunchOptions, Machine


@pytest.fixture
def listener():
    """A port this test process listens on, as another program would."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_listening_port_is_busy_and_its_holder_named(listener):
    assert not port_is_free(listener)
    assert port_holder(listener).startswith(f"PID {os.getpid()} (`")
    assert port_is_free(free_port())


def test_a_port_an_ended_server_left_in_time_wait_is_busy_as_torch_finds_it():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the server side closes first: its end of the connection waits in TIME_WAIT
    client.close()
    server.close()
    assert not port_is_free(port)  # torch's TCPStore fails there with EADDRINUSE too
    assert "TIME_WAIT" in port_holder(port)


@pytest.mark.parametrize("source, fix", [("launcher", r"widenet-ds launch --master-port \d+.*deepspeed --master_port"),
                                         ("slurm", r"set MASTER_PORT=\d+ \(a free port\) in the batch script"),
                                         ("single", r"set by MASTER_PORT: set another")])
def test_rank_0_failing_to_serve_a_busy_rendezvous_port_names_the_holder_and_the_fix(listener, source, fix):
    env = LaunchEnv(rank=0, local_rank=0, world_size=2, master_addr="127.0.0.1", master_port=listener, source=source)
    with pytest.raises(LaunchError, match=rf"rendezvous port {listener} on .* is in use by PID {os.getpid()} .*{fix}"):
        with rendezvous_port_errors(env):
            TCPStore("127.0.0.1", listener, 2, True)  # what rank 0's init_process_group binds


def test_launch_refuses_a_busy_master_port_before_any_rank_starts(listener):
    options = LaunchOptions(task="pretrain", ranks_per_node=2, master_port=listener)
    with pytest.raises(LaunchError, match=rf"--master-port {listener} is in use on this machine by PID {os.getpid()}.*"
                                          rf"leave out --master-port to have a free one picked"):
        plan_launch(options, Machine(cores=2, has_gpu=False), environ={})
    # no --master-port: a free port, whatever holds deepspeed's default 29500
    plan = plan_launch(LaunchOptions(task="pretrain", ranks_per_node=2), Machine(cores=2, has_gpu=False), environ={})
    port = int(plan.command[plan.command.index("--master_port") + 1])
    assert port != listener and port_is_free(port)
