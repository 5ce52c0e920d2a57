"""Runs across two nodes for real: the 2-node cluster of tests/support/netns_cluster.py (network namespaces, sshd per
node), one rank per node, a text run with ep_size 2 so that the MoE all-to-all crosses the nodes.

- `widenet-ds launch pretrain --hostfile` (DeepSpeed's pdsh runner over ssh), started on node 1: rank 0 serves
  the rendezvous on node 1's address, the ranks get the launch's environment, and the losses equal the same run
  with 2 ranks on one node (within the golden curves' tolerance);
- `mpiexec -hosts node1,node2` (MPICH's hydra over the same ssh): the same losses;
- `sbatch --nodes=2 slurm/train.sbatch pretrain ...` on slurmctld + one slurmd per node (tests/support/netns_slurm.py): the same
  losses;
- the rendezvous port busy on node 1 (rank 0's): refused there before training, naming node and holder, and
  node 2's rank, which would wait for that rendezvous for 30 minutes, is stopped by `widenet-ds launch`;
- a second run into the same folder started on node 2 while the first runs from node 1: refused, naming node 1;
- node 2's rank SIGKILLed mid-run: node 1's rank ends within a bounded time with one clear error, and the last
  checkpoint is untouched (same file hashes) and passes `widenet-ds verify`.
The cluster is brought up once for the file; its teardown asserts that nothing of it is left, also when the test
using it fails (checked by a cluster of its own).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.golden_curves import beyond_tolerance
from tests.support.launch_inputs import DS_CONFIG, prepare_tiny_corpus, pretrain_args, tiny_model_config
from tests.support.launching import REPO, child_env, clear_stale_build_locks
from tests.support.netns_cluster import leftovers, netns_cluster, unavailable_reason
from tests.support.netns_slurm import slurm_on
from tests.support.slurm_cluster import missing_tools
from tests.support.pretrain_support import events, train_losses

pytestmark = [pytest.mark.multirank, pytest.mark.cluster, pytest.mark.slow]

WIDENET_DS = [sys.executable, "-m", "widenet_ds.cli"]
BIN = Path(sys.executable).parent
STEPS = 5
RANK = "-m widenet_ds.train"  # a rank's command line (its launcher's says `--module ... widenet_ds.train`)
# What every rank must find in its environment however it was started on its node.
RANK_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "OMP_NUM_THREADS", "DS_ACCELERATOR", "TORCH_EXTENSIONS_DIR")
KILL_BOUND_S = 60  # node 1's rank must end this soon after node 2's died (not a 30-minute collective timeout)
# start-up, rank 0's refusal, launch's 10 s grace before it stops node 2, whose launcher TERMs its rank
BUSY_PORT_BOUND_S = 120
KILLED_RUN_STEPS = 200  # far more than run before the kill (cpu_small.json schedules 300)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    with netns_cluster(tmp_path_factory.mktemp("cluster")) as started:
        yield started


@pytest.fixture(scope="module")
def inputs(shared_data, tmp_path_factory):
    """The tiny corpus and model, made once: a re-trained tokenizer is not bit-identical, so every run of this
    file reads the same prepared folder."""
    root = tmp_path_factory.mktemp("inputs")
    return prepare_tiny_corpus(shared_data, root / "alice"), tiny_model_config(root / "tiny.json")


def run_args(inputs, out: Path, steps: int = STEPS, **settings) -> list[str]:
    corpus, model = inputs
    return pretrain_args(corpus, model, out, steps, **{"ep_size": 2, **settings})


@pytest.fixture(scope="module")
def one_node(inputs, tmp_path_factory) -> dict[int, float]:
    """The reference: the same run with 2 ranks on one node (this machine, the loopback)."""
    out = tmp_path_factory.mktemp("one_node") / "run"
    proc = subprocess.run([*WIDENET_DS, "launch", "pretrain", "--num-ranks", "2", "--", *run_args(inputs, out)],
                          cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    losses = train_losses(out)
    assert sorted(losses) == list(range(1, STEPS + 1))
    return losses


def environment_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def rank_environments(cluster, running, timeout: float, rank_var: str = "RANK") -> dict[str, dict[str, str]]:
    """While `running()`, read the environment each node's rank was started with (`rank_var` names the launcher's
    rank variable): node -> its RANK_VARS and `rank_var`."""
    seen: dict[str, dict[str, str]] = {}
    deadline = time.monotonic() + timeout
    while running() and time.monotonic() < deadline:
        for node in cluster.nodes:
            for pid in node.processes(RANK):
                try:
                    env = environment_of(pid)
                except OSError:  # gone already
                    continue
                if rank_var in env:
                    seen.setdefault(node.name, {name: env[name] for name in (rank_var, *RANK_VARS) if name in env})
        time.sleep(0.2)
    return seen


def watch_ranks(cluster, proc: subprocess.Popen, timeout: float,
                rank_var: str = "RANK") -> tuple[str, dict[str, dict[str, str]]]:
    """Wait for `proc` (its output merged) while reading its ranks' environments (rank_environments)."""
    seen = rank_environments(cluster, lambda: proc.poll() is None, timeout, rank_var)
    output, _ = proc.communicate(timeout=30)
    return output, seen


def on_node1(cluster, command: list[str], env: dict[str, str]) -> subprocess.Popen:
    """`command` started on node 1, in the checkout (the shared file system), as a user logged in there."""
    clear_stale_build_locks()
    return subprocess.Popen(cluster.nodes[0].command(command, cwd=REPO), env=cluster.env(env),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def assert_losses_equal_one_node(one_node: dict[int, float], out: Path) -> None:
    two_nodes = train_losses(out)
    assert sorted(two_nodes) == sorted(one_node)
    far = beyond_tolerance(one_node, two_nodes)
    assert not far, f"steps beyond the golden tolerance (one node, two nodes, ulps): {far}"
    final = out / "checkpoints" / f"step{STEPS}"
    assert json.loads((final / "widenet_checkpoint.json").read_text())["world_size"] == 2


def test_pdsh_hostfile_launch_across_two_nodes_equals_one_node(cluster, inputs, one_node, tmp_path):
    out = tmp_path / "pdsh"
    # info: the runner prints the rendezvous address it chose
    env = child_env(WIDENET_DEEPSPEED_LOG_LEVEL="info")
    proc = on_node1(cluster, [*WIDENET_DS, "launch", "pretrain", "--hostfile", str(cluster.hostfile(slots=1)),
                              "--num-nodes", "2", "--num-ranks", "1", "--", *run_args(inputs, out)], env)
    output, ranks = watch_ranks(cluster, proc, timeout=300)
    assert proc.returncode == 0, output[-6000:]

    node1, node2 = cluster.nodes
    # deepspeed asked node 1 over ssh for its address: the namespace's, not the loopback
    assert f"Using IP address of {node1.address} for node {node1.name}" in output, output[-6000:]
    assert any(line.startswith(f"{node2.name}: ") for line in output.splitlines()), "nothing ran on node 2"
    # Each node's rank, started over ssh in a fresh login environment, got the launch's environment.
    expected = {"WORLD_SIZE": "2", "MASTER_ADDR": node1.address, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu",
                "TORCH_EXTENSIONS_DIR": os.environ["TORCH_EXTENSIONS_DIR"]}
    assert ranks == {node1.name: {"RANK": "0", **expected}, node2.name: {"RANK": "1", **expected}}
    assert_losses_equal_one_node(one_node, out)


def test_an_output_dir_on_node_local_storage_is_refused_before_training(cluster, inputs, tmp_path):
    """The same path on both nodes, another folder on each (cluster.local): before this check, rank 1's checkpoint
    files stayed in `step3.partial` on node 2, rank 0 called the checkpoint complete, and a --resume hung."""
    node1, node2 = cluster.nodes
    proc = on_node1(cluster, [*WIDENET_DS, "launch", "pretrain", "--hostfile", str(cluster.hostfile(slots=1)),
                              "--num-nodes", "2", "--num-ranks", "1", "--",
                              *run_args(inputs, cluster.local / "run")], child_env())
    output, _ = proc.communicate(timeout=180)
    assert proc.returncode != 0, output[-4000:]
    message = (f"is not one folder for all ranks: rank 1 on {node2.name} does not see the file rank 0 on {node1.name} "
               f"wrote there")
    assert output.count(message) == 1, output[-4000:]
    assert "training: steps" not in output
    assert not (node1.local_dir / "run" / "checkpoints").exists() and not list(node1.local_dir.glob("run/.widenet-ds-shared-*"))


def test_mpiexec_with_two_hosts_equals_one_node(cluster, inputs, one_node, tmp_path):
    mpiexec = BIN / "mpiexec"
    if not mpiexec.exists():
        pytest.skip("mpiexec not in the environment (`pip install mpi4py mpich`)")
    out = tmp_path / "mpi"
    # MPICH's hydra starts its proxy on each host over ssh (the cluster's) and hands every rank this environment.
    command = [str(mpiexec), "-n", "2", "-ppn", "1", "-hosts", ",".join(n.name for n in cluster.nodes),
               "-launcher", "ssh", "-launcher-exec", str(cluster.ssh_bin / "ssh"),
               sys.executable, "-m", "widenet_ds.train", "pretrain", *run_args(inputs, out)]
    # The nodes share this machine's kernel, so UCX (MPICH's transport) takes them for one host and would reach
    # the other rank through shared memory and its pid, which the other node's PID namespace hides: its network
    # transport, the one it picks between real nodes.
    proc = on_node1(cluster, command, child_env(UCX_TLS="self,tcp"))
    output, ranks = watch_ranks(cluster, proc, timeout=300, rank_var="PMI_RANK")
    assert proc.returncode == 0, output[-6000:]
    # MPI rank 0 ran on node 1 and rank 1 on node 2, so rank 0's rendezvous address (its `hostname -I`, shared over
    # MPI: widenet_ds/runtime/launch_env.py) was node 1's, the only one node 2 can reach.
    node1, node2 = cluster.nodes
    assert {node: env["PMI_RANK"] for node, env in ranks.items()} == {node1.name: "0", node2.name: "1"}, ranks
    assert ranks[node2.name]["OMP_NUM_THREADS"] == "1"  # hydra hands the whole environment to every host
    assert_losses_equal_one_node(one_node, out)


@pytest.fixture(scope="module")
def slurm(cluster, tmp_path_factory):
    if missing_tools():
        pytest.skip(f"Slurm/munge not installed (missing {', '.join(missing_tools())}); run scripts/install_slurm.sh")
    with slurm_on(cluster, tmp_path_factory.mktemp("slurm") / "slurm",
                  child_env(WIDENET_HOME=str(REPO), PYTHON=sys.executable)) as started:
        yield started


def test_sbatch_on_two_nodes_then_node2_lost_continues_on_node1_and_equals_one_node(slurm, cluster, inputs, one_node,
                                                                                   tmp_path):
    """`sbatch --nodes=2` runs task 0 on node 1 and task 1 on node 2 (rendezvous at the node list's first host);
    node 2's rank is SIGKILLed after the first checkpoint (srun's --kill-on-bad-exit ends the job), and the run
    goes on in a job on node 1 alone (2 tasks there, the same OUTPUT_DIR): every step's loss equals one node's."""
    out = tmp_path / "slurm"
    env = dict(slurm.env, OUTPUT_DIR=str(out))
    corpus, model = inputs

    def submit(log: Path, *placement: str, steps: int) -> int:
        return slurm.sbatch(*placement, "--cpus-per-task=1", "--time=10", f"--output={log}",
                            str(REPO / "slurm" / "train.sbatch"), "pretrain", "--data", str(corpus),
                            "--deepspeed_config", str(DS_CONFIG), "--model-config", str(model), "--ep-size", "2",
                            "--max-steps", str(steps), "--log-interval", "1", "--save-interval", "2", "--keep-last",
                            "100", "--eval-interval", "0", "--no-tensorboard", "--seed", "7", env=env)

    job = submit(tmp_path / "two_nodes.log", "--nodes=2", "--ntasks-per-node=1", steps=KILLED_RUN_STEPS)
    latest, ranks = out / "checkpoints" / "latest", {}
    deadline = time.monotonic() + 300
    while not latest.exists():
        assert slurm.job_state(job) in ("PENDING", "CONFIGURING", "RUNNING"), (tmp_path / "two_nodes.log").read_text()
        assert time.monotonic() < deadline, "no checkpoint within 300 s"
        for node in cluster.nodes:  # which task runs where (srun's own command line holds RANK too: no PROCID)
            for pid in node.processes(RANK):
                with contextlib.suppress(OSError):
                    if "SLURM_PROCID" in (found := environment_of(pid)):
                        ranks.setdefault(node.name, found)
        time.sleep(0.05)
    node1, node2 = cluster.nodes
    for pid in node2.processes(RANK):
        os.kill(pid, signal.SIGKILL)
    assert slurm.wait_done(job, 120) != "COMPLETED"
    saved = int(latest.read_text().strip().removeprefix("step"))
    assert saved < STEPS, "the job got past the compared steps before node 2 was lost"
    assert "2 ranks on node[1-2]" in (tmp_path / "two_nodes.log").read_text()
    assert {node: env.get("SLURM_PROCID") for node, env in ranks.items()} == {node1.name: "0", node2.name: "1"}

    log = tmp_path / "node1.log"
    job = submit(log, "--nodes=1", "--ntasks-per-node=2", f"--nodelist={node1.name}", steps=STEPS)
    assert slurm.wait_done(job, 300) == "COMPLETED", log.read_text() + slurm.logs()
    assert "2 ranks on node1" in log.read_text()
    assert f"resumed from {out / 'checkpoints' / f'step{saved}'}" in events(out)
    assert_losses_equal_one_node(one_node, out)


def test_a_busy_rendezvous_port_on_node1_is_refused_naming_node_and_holder_and_node2_is_stopped(
        cluster, inputs, tmp_path):
    node1, node2 = cluster.nodes
    port = 29611
    holder = subprocess.Popen(node1.command([sys.executable, "-c", (
        f"import socket, time; s = socket.socket(); s.bind(('0.0.0.0', {port})); s.listen(); time.sleep(600)")]))
    try:
        deadline = time.monotonic() + 30
        while not any(f":{port:04X} " in line for line in subprocess.run(
                node1.command(["cat", "/proc/net/tcp"]), capture_output=True, text=True).stdout.splitlines()):
            assert time.monotonic() < deadline, "the port holder never listened"
            time.sleep(0.1)
        out = tmp_path / "busy"
        start = time.monotonic()
        proc = on_node1(cluster, [*WIDENET_DS, "launch", "pretrain", "--hostfile", str(cluster.hostfile(slots=1)),
                                  "--num-nodes", "2", "--num-ranks", "1", "--master-port", str(port), "--",
                                  *run_args(inputs, out)], child_env())
        try:
            output, _ = proc.communicate(timeout=BUSY_PORT_BOUND_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"the launch still ran {BUSY_PORT_BOUND_S} s after start, port {port} busy on node 1")
        took = time.monotonic() - start
    finally:
        for pid in node1.processes("s.listen(); time.sleep(600)"):  # the holder, nsenter's child
            holder_pid = node1.pid_inside(pid)
            os.kill(pid, signal.SIGKILL)
        holder.wait()
    assert proc.returncode == 2, output[-6000:]  # rank 0's user error, printed once
    # the pid node 1 knows it by
    assert f"the rendezvous port {port} on {node1.name} is in use by PID {holder_pid} " in output, output[-6000:]
    assert f"widenet-ds launch: node {node1.name} ended with exit status 2 and the other nodes still run" in output
    # node 2's launcher got the runner's kill and takes its rank with it (a TERM, which ends a rank in the rendezvous)
    while node2.processes(RANK) and time.monotonic() - start < BUSY_PORT_BOUND_S:
        time.sleep(0.2)
    took = time.monotonic() - start
    assert not node2.processes(RANK), "node 2's rank still waits for the rendezvous"
    assert not (out / "checkpoints").exists()
    assert took < BUSY_PORT_BOUND_S


def file_hashes(folder: Path) -> dict[str, str]:
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file()}


def test_a_second_writer_on_node2_is_refused_then_node2_killed_ends_node1_with_one_error_checkpoint_intact(
        cluster, inputs, tmp_path):
    out = tmp_path / "killed"
    # --keep-last: the checkpoint hashed below stays, however many saves follow before the kill
    train = run_args(inputs, out, KILLED_RUN_STEPS, save_interval=3, keep_last=100)
    proc = on_node1(cluster, [*WIDENET_DS, "launch", "pretrain", "--hostfile", str(cluster.hostfile(slots=1)),
                              "--num-nodes", "2", "--num-ranks", "1", "--", *train], child_env())
    latest = out / "checkpoints" / "latest"
    deadline = time.monotonic() + 240
    while not latest.exists():
        assert proc.poll() is None, proc.communicate()[0][-6000:]
        assert time.monotonic() < deadline, "no checkpoint within 240 s"
        time.sleep(0.1)
    tag = latest.read_text().strip()
    saved = out / "checkpoints" / tag
    before = file_hashes(saved)
    node1, node2 = cluster.nodes

    # A second run into the same folder, started on node 2 while this one runs from node 1: refused by the lock,
    # which names node 1 and says that it cannot check a run on another host.
    corpus, model = inputs
    second = subprocess.run(node2.command([sys.executable, "-m", "widenet_ds.train", "pretrain", *pretrain_args(
        corpus, model, out, KILLED_RUN_STEPS, ep_size=1)], cwd=REPO), env=cluster.env(child_env()),
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert second.returncode == 2, second.stdout[-3000:] + second.stderr[-3000:]
    assert f"on {node1.name}, started" in second.stderr and f"It runs on another host ({node1.name})" in second.stderr
    assert proc.poll() is None, "the first run did not survive the second one's attempt"

    victims = node2.processes(RANK)
    assert victims, "no rank on node 2 to kill"
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    try:
        output, _ = proc.communicate(timeout=KILL_BOUND_S + 60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"node 1 still running {KILL_BOUND_S + 60} s after node 2's rank was killed")
    ended_after = time.monotonic() - killed
    assert ended_after < KILL_BOUND_S, f"node 1 ended {ended_after:.0f} s after the kill:\n{output[-6000:]}"
    assert proc.returncode != 0
    # Node 1's rank says in one line what happened and where to continue (not a collective's traceback), the
    # launcher names the kill; no rank still runs on node 1.
    node1_lines = [line for line in output.splitlines() if line.startswith(f"{cluster.nodes[0].name}: ")]
    lost = [line for line in node1_lines if "lost its connection to another rank" in line]
    assert len(lost) == 1 and f"another rank at {node2.address} " in lost[0] and "--resume" in lost[0], output[-6000:]
    assert not any("Traceback" in line for line in node1_lines), output[-6000:]
    assert "widenet-ds launch: the run ended with exit status 247 (a rank was killed by SIGKILL)" in output
    assert not cluster.nodes[0].processes(RANK)
    assert max(train_losses(out)) < KILLED_RUN_STEPS, "the run finished before the kill; the test proved nothing"

    assert file_hashes(saved) == before
    verify = subprocess.run([*WIDENET_DS, "verify", str(saved)], cwd=REPO, env=child_env(), capture_output=True,
                            text=True, timeout=120)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_deepspeeds_multi_node_kill_reaches_the_named_nodes_processes_and_no_other(cluster):
    """DeepSpeed's pdsh runner, stopped (as `widenet-ds launch` stops it when a node failed), runs `pdsh -w NODES
    pkill -f "<python> -u -m deepspeed.launcher.launch"`. Each node has its own PID namespace: the pkill ends the
    node's processes only, not the launchers of other runs on this machine (CI saw one of another test, which ran
    side by side, killed by it before the nodes had their own)."""
    node1, node2 = cluster.nodes
    marker = f"widenet-pkill-probe-{os.getpid()}"
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)", marker]
    here = subprocess.Popen(sleeper)
    there = subprocess.Popen(node2.command(sleeper))
    try:
        deadline = time.monotonic() + 30
        while not node2.processes(marker):
            assert time.monotonic() < deadline, "the probe never started on node 2"
            time.sleep(0.05)
        pattern = f"[{marker[0]}]{marker[1:]}"  # a regex the remote shell's own command line does not match
        kill = subprocess.run(node1.command(["pdsh", "-S", "-w", f"{node1.name},{node2.name}", "pkill", "-f",
                                             pattern]), env=cluster.env({**child_env(), "PDSH_RCMD_TYPE": "ssh"}),
                              capture_output=True, text=True, timeout=60)
        assert there.wait(timeout=30) == -signal.SIGTERM, kill.stdout + kill.stderr  # nsenter ends as its child did
        assert here.poll() is None, "a pkill on the nodes ended a process of this machine outside them"
    finally:
        for proc in (here, there):
            proc.kill()
            proc.wait()


def test_a_failing_test_leaves_no_namespace_link_sshd_or_mount_of_its_cluster_behind(tmp_path):
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    with pytest.raises(RuntimeError, match="the test failed"):
        with netns_cluster(tmp_path / "c") as failing:
            assert len(leftovers(failing.prefix, failing.root)) > 0  # the check sees a running cluster
            raise RuntimeError("the test failed")
    # the teardown's own assertion would have replaced the RuntimeError; checked again here all the same
    assert leftovers(failing.prefix, failing.root) == []
