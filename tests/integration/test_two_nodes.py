"""Runs across two nodes for real: the 2-node cluster of tests/support/netns_cluster.py (network namespaces, sshd per
node), one rank per node, a text run with ep_size 2 so that the MoE all-to-all crosses the nodes.

- `widenet-ds launch pretrain --hostfile` (DeepSpeed's pdsh runner over ssh), started on node 1: rank 0 serves
  the rendezvous on node 1's address, the ranks get the launch's environment, and the losses equal the same run
  with 2 ranks on one node (within the golden curves' tolerance);
- `mpiexec -hosts node1,node2` (MPICH's hydra over the same ssh): the same losses;
- faults that end the whole run within a bounded time with one line naming the node (issue 49): node 2 vanishing
  mid-run (its link cut, then its processes killed; the run continues on node 1 alone), node 2's own start-up
  problems (--data on node 1 only, --output-dir read-only on node 2) under pdsh and mpiexec, a SIGTERM to a rank
  waiting for a stopped (SIGSTOP) peer, and a loopback --master-addr for two nodes;
- `sbatch --nodes=2 slurm/train.sbatch pretrain ...` on slurmctld + one slurmd per node (tests/support/netns_slurm.py): the same
  losses;
- the rendezvous port busy on node 1 (rank 0's): refused there before training, naming node and holder, and
  node 2's rank, which would wait for that rendezvous for 30 minutes, is stopped by `widenet-ds launch`;
- a second run into the same folder started on node 2 while the first runs from node 1: refused, naming node 1;
- node 2's rank SIGKILLed mid-run: node 1's rank ends within a bounded time with one clear error, and the last
  checkpoint is untouched (same file hashes) and passes `widenet-ds verify`;
- the preflight of a pretraining job (`widenet-ds launch --preflight` over pdsh, `PREFLIGHT=1 sbatch`): every check
  passes; with node 2's own problems (its run folder on its own disk, no data, another DeepSpeed and an all-to-all
  that swaps what it sends, both first on its PYTHONPATH) each is a failed row naming node 2 and its fix, all four
  at once and (pdsh) each alone, its row failing and no other but those that need what it broke.
The cluster is brought up once for the file; its teardown asserts that nothing of it is left, also when the test
using it fails (checked by a cluster of its own).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.golden_curves import beyond_tolerance
from tests.support.launch_inputs import (
    DS_CONFIG,
    prepare_tiny_corpus,
    pretrain_args,
    tiny_model_config,
)
from tests.support.launching import REPO, child_env, clear_stale_build_locks
from tests.support.netns_cluster import leftovers, netns_cluster, unavailable_reason
from tests.support.netns_slurm import slurm_on
from tests.support.preflight_output import ROWS as PREFLIGHT_ROWS
from tests.support.preflight_output import read_table
from tests.support.pretrain_support import events, train_losses, write_ds_config
from tests.support.slurm_cluster import missing_tools

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
# node 2 vanished: the launcher's ssh keep-alives (20-25 s), its grace before stopping the run (10 s), DeepSpeed's
# kill on every node (node 2's ssh: its 15 s connect timeout); node 1's rank ends on that kill's SIGTERM
VANISH_BOUND_S = 120
STOP_BOUND_S = 60  # a SIGTERM while waiting for a stopped peer: the watch's 5 s suspicion + 20 s silence, + margin
# node 2 vanished under mpiexec: node 1's rank ends by itself, its peer silent for the watch's 5 s + 60 s
# (distributed/peer_watch.py, LOST_S), and its MPI_Abort ends mpiexec at once
MPI_VANISH_BOUND_S = 120
# node 2 vanished under sbatch: Slurm declares it DOWN after SlurmdTimeout (30 s here, tests/support/slurm_cluster.py)
# and requeues the job, which starts again once the credential of the last run expires (cred_expire, 5 s here); then
# the start-up of 2 ranks, the resume and one step
REQUEUE_BOUND_S = 240
RANGE_STEPS = 6  # the node-range job: saves at 2, loses node 2 at once, finishes on node 1
PROBLEMS_BOUND_S = 180  # start-up on both nodes, then one error from the rendezvous


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


def mpiexec_on_both(cluster) -> list[str]:
    """`mpiexec` with one rank on each node: MPICH's hydra starts its proxy on each host over ssh (the cluster's) and
    hands every rank this environment."""
    mpiexec = BIN / "mpiexec"
    if not mpiexec.exists():
        pytest.skip("mpiexec not in the environment (`pip install mpi4py mpich`)")
    return [str(mpiexec), "-n", "2", "-ppn", "1", "-hosts", ",".join(n.name for n in cluster.nodes), "-launcher", "ssh",
            "-launcher-exec", str(cluster.ssh_bin / "ssh")]


def test_mpiexec_with_two_hosts_equals_one_node(cluster, inputs, one_node, tmp_path):
    out = tmp_path / "mpi"
    command = [*mpiexec_on_both(cluster), sys.executable, "-m", "widenet_ds.train", "pretrain", *run_args(inputs, out)]
    # The nodes share this machine's kernel, so UCX (MPICH's transport) takes them for one host and would reach
    # the other rank through shared memory and its pid, which the other node's PID namespace hides: its network
    # transport, the one it picks between real nodes.
    proc = on_node1(cluster, command, child_env(UCX_TLS="self,tcp"))
    output, ranks = watch_ranks(cluster, proc, timeout=300, rank_var="PMI_RANK")
    assert proc.returncode == 0, output[-6000:]
    # MPI rank 0 ran on node 1 and rank 1 on node 2, so rank 0's rendezvous address (its `hostname -I`, shared over
    # MPI: widenet_ds/distributed/launch_env.py) was node 1's, the only one node 2 can reach.
    node1, node2 = cluster.nodes
    assert {node: env["PMI_RANK"] for node, env in ranks.items()} == {node1.name: "0", node2.name: "1"}, ranks
    assert ranks[node2.name]["OMP_NUM_THREADS"] == "1"  # hydra hands the whole environment to every host
    assert_losses_equal_one_node(one_node, out)


# --- faults that must end the whole run within a bounded time, with one line naming the node (issue 49) ------------
def launch_on_two_nodes(cluster, inputs, out: Path, steps: int, *launch: str, **settings) -> subprocess.Popen:
    """`widenet-ds launch pretrain` over pdsh from node 1, one rank per node."""
    return on_node1(cluster, [*WIDENET_DS, "launch", "pretrain", "--hostfile", str(cluster.hostfile(slots=1)),
                              "--num-nodes", "2", "--num-ranks", "1", *launch, "--",
                              *run_args(inputs, out, steps, **settings)], child_env())


def give_up(cluster, proc: subprocess.Popen) -> str:
    """A launch that outlived its bound: what it started on both nodes killed (a kill of nsenter would leave its child,
    the launcher, holding the output pipe), then its output so far."""
    for node in cluster.nodes:
        for pid in {*node.processes("widenet_ds"), *node.processes("deepspeed"), *node.processes("pdsh")}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    proc.kill()
    try:
        return proc.communicate(timeout=30)[0]
    except subprocess.TimeoutExpired:
        return "(no output: a process still holds the pipe)"


def wait_for_checkpoint(proc: subprocess.Popen, out: Path, timeout: float = 240) -> Path:
    latest = out / "checkpoints" / "latest"
    deadline = time.monotonic() + timeout
    while not latest.exists():
        assert proc.poll() is None, proc.communicate()[0][-6000:]
        assert time.monotonic() < deadline, f"no checkpoint within {timeout} s"
        time.sleep(0.1)
    return out / "checkpoints" / latest.read_text().strip()


def wait_gone(node, pattern: str, since: float, bound: float) -> float:
    """Seconds from `since` until no process of `node` matches `pattern` (fails past `bound`)."""
    while node.processes(pattern):
        assert time.monotonic() - since < bound, f"{node.name} still runs {pattern!r} {bound} s later"
        time.sleep(0.2)
    return time.monotonic() - since


def lines_of(output: str, node) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(f"{node.name}: ")]


@contextlib.contextmanager
def link_cut(cluster, node):
    """`node`'s end of the veth pair down, as a pulled cable or a powered-off machine: no packet in or out, no
    connection closed; back up afterwards for the module's other tests."""
    end = f"{cluster.prefix}v{cluster.nodes.index(node)}"
    subprocess.run(["ip", "-n", node.netns, "link", "set", end, "down"], check=True, timeout=30)
    try:
        yield
    finally:
        subprocess.run(["ip", "-n", node.netns, "link", "set", end, "up"], check=True, timeout=30)
        deadline = time.monotonic() + 30
        while cluster.ssh(node, "true").returncode != 0:
            assert time.monotonic() < deadline, f"{node.name} unreachable after its link came back"
            time.sleep(0.5)


def test_node2_vanishing_mid_run_ends_node1_and_the_launcher_naming_node2_and_node1_alone_resumes(
        cluster, inputs, tmp_path):
    """Node 2's link cut, then every process there killed (a power loss): no connection reset reaches node 1.
    Before: node 1's rank and the launcher printed nothing for minutes (the 30-minute collective timeout; pdsh's ssh
    without keep-alives). Now the launcher's ssh sees node 2 gone within SSH_SILENCE_S, stops the run, and node 1's
    rank, asked to stop while it waits for node 2's silent rank, ends with one line naming node 2 and the
    checkpoint to resume from."""
    out = tmp_path / "vanished"
    proc = launch_on_two_nodes(cluster, inputs, out, KILLED_RUN_STEPS, save_interval=3, keep_last=100)
    saved = wait_for_checkpoint(proc, out)
    before = file_hashes(saved)
    node1, node2 = cluster.nodes
    with link_cut(cluster, node2):
        for pid in node2.processes(""):  # every process of node 2 but its first, the sshd (a node that boots again)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        cut = time.monotonic()
        rank_s = launcher_s = None
        while launcher_s is None:  # its output is a few lines: the pipe is read once it has ended
            elapsed = time.monotonic() - cut
            if rank_s is None and not node1.processes(RANK):
                rank_s = elapsed
            if proc.poll() is not None:
                launcher_s = elapsed
            elif elapsed > VANISH_BOUND_S + 60:
                pytest.fail(f"the launcher still ran {elapsed:.0f} s after node 2 vanished:\n"
                            f"{give_up(cluster, proc)[-6000:]}")
            time.sleep(0.2)
        output, _ = proc.communicate(timeout=30)
    print(f"node 2 vanished: node 1's rank ended after {rank_s} s, the launcher after {launcher_s:.0f} s")
    assert rank_s is not None and rank_s < VANISH_BOUND_S and launcher_s < VANISH_BOUND_S, output[-6000:]
    said = [line for line in lines_of(output, node1) if " error: " in line]
    assert len(said) == 1, output[-6000:]
    print(said[0])
    assert f"for rank 1 on {node2.name}" in said[0] and f"{saved}, is kept" in said[0] and "--resume" in said[0]
    assert not any("Traceback" in line for line in lines_of(output, node1)), output[-6000:]
    assert ("widenet-ds launch: the run ended with exit status 255 (ssh's own failure: a node was down, unreachable "
            "or refused the login, or its connection was lost mid-run" in output), output[-6000:]
    assert max(train_losses(out)) < KILLED_RUN_STEPS, "the run finished before node 2 vanished"
    assert file_hashes(saved) == before

    # The run goes on on node 1 alone (2 ranks there, the same ep_size): from the last complete checkpoint.
    step = int(saved.name.removeprefix("step"))
    resumed = on_node1(cluster, [*WIDENET_DS, "launch", "pretrain", "--num-ranks", "2", "--",
                                 *run_args(inputs, out, step + 2, save_interval=3, keep_last=100), "--resume"],
                       child_env())
    output, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, output[-6000:]
    assert f"resumed from {saved}" in events(out)
    assert max(train_losses(out)) == step + 2


def ranks_on(node, executable: str = sys.executable) -> list[int]:
    """`node`'s ranks: the processes started as `<python> -m widenet_ds.train`, not the launcher whose command line
    names them (mpiexec's)."""
    found = []
    for pid in node.processes(RANK):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode() == executable:
                found.append(pid)
    return found


def test_node2_vanishing_mid_run_under_mpiexec_ends_node1s_rank_and_mpiexec_naming_node2(cluster, inputs, tmp_path):
    """Before: node 1's rank said so only at --train-timeout (300 s), and mpiexec then waited for its proxy on
    node 2 for minutes more (MPICH's hydra waits for every proxy; one on a vanished node never reports). Now the
    rank ends by itself once node 2's rank has not answered for the watch's bound, with one line naming node 2 and
    the checkpoint, and its MPI_Abort ends mpiexec at once, exit status 1."""
    out = tmp_path / "mpi_vanished"
    command = [*mpiexec_on_both(cluster), sys.executable, "-m", "widenet_ds.train", "pretrain",
               *run_args(inputs, out, KILLED_RUN_STEPS, save_interval=3, keep_last=100)]
    proc = on_node1(cluster, command, child_env(UCX_TLS="self,tcp"))
    saved = wait_for_checkpoint(proc, out)
    before = file_hashes(saved)
    node1, node2 = cluster.nodes
    assert ranks_on(node1) and ranks_on(node2), "a rank is missing"
    with link_cut(cluster, node2):
        for pid in node2.processes(""):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        cut = time.monotonic()
        rank_s = launcher_s = None
        while launcher_s is None:
            elapsed = time.monotonic() - cut
            if rank_s is None and not ranks_on(node1):
                rank_s = elapsed
            if proc.poll() is not None:
                launcher_s = elapsed
            elif elapsed > MPI_VANISH_BOUND_S + 60:
                pytest.fail(f"mpiexec still ran {elapsed:.0f} s after node 2 vanished:\n"
                            f"{give_up(cluster, proc)[-6000:]}")
            time.sleep(0.2)
        output, _ = proc.communicate(timeout=30)
    rank_s = launcher_s if rank_s is None else rank_s  # (both seen gone at one look)
    print(f"node 2 vanished under mpiexec: node 1's rank ended after {rank_s:.0f} s, mpiexec after {launcher_s:.0f} s")
    assert rank_s < MPI_VANISH_BOUND_S and launcher_s < MPI_VANISH_BOUND_S, output[-6000:]
    assert launcher_s - rank_s < 10, output[-6000:]  # mpiexec ends with the rank, not minutes later
    assert proc.returncode == 1, output[-6000:]
    said = [line for line in output.splitlines() if " error: " in line]
    assert len(said) == 1, output[-6000:]
    print(said[0])
    assert (f"rank 0 on {node1.name} waited " in said[0] and f"for rank 1 on {node2.name}, which has not answered for "
            f"60 s or more" in said[0] and f"{saved}, is kept" in said[0] and "--resume" in said[0]), said[0]
    assert "Traceback" not in output and "frame #" not in output, output[-6000:]
    assert max(train_losses(out)) < KILLED_RUN_STEPS, "the run finished before node 2 vanished"
    assert file_hashes(saved) == before


def test_node2s_own_problems_are_one_error_naming_node2_before_training_under_pdsh_mpiexec_and_srun(
        cluster, inputs, tmp_path, request):
    """--data on node 1's disk only, --output-dir read-only on node 2 only. Before: node 2's rank exited 2 without a
    line (only rank 0 prints an error every rank shares, and rank 0 had none); under mpiexec and srun rank 0 then
    waited for ever. Now every rank's problems are gathered after the rendezvous: one error, naming node 2 and both
    paths, printed once by rank 0."""
    node1, node2 = cluster.nodes
    corpus, _ = inputs
    shutil.copytree(corpus, node1.local_dir / "corpus")  # node-local: cluster.local/corpus exists on node 1 only
    data = cluster.local / "corpus"
    shared = tmp_path / "ro"
    shared.mkdir()
    subprocess.run(node2.command(["sh", "-c", f"mount --bind {shared} {shared} && mount -o remount,bind,ro {shared}"]),
                   check=True, timeout=30)
    try:
        for path in ("pdsh", "mpiexec", "srun"):
            out = shared / path
            train = [*run_args(inputs, out), "--data", str(data)]  # the later --data wins
            output = start_with_problems(path, cluster, train, out, tmp_path, request)
            print(f"{path}: {output[output.index('error: '):][:700]}" if "error: " in output else output[-3000:])
            for problem in (f"rank 1 on {node2.name}: --data {data} does not exist",
                            f"rank 1 on {node2.name}: --output-dir {out} is not writable"):
                assert output.count(problem) == 1, f"{path}:\n{output[-6000:]}"
            assert f"rank 0 on {node1.name}" not in output and "training: steps" not in output, output[-6000:]
            assert not out.exists()
    finally:
        subprocess.run(node2.command(["umount", str(shared)]), timeout=30)


def start_with_problems(path: str, cluster, train: list[str], out: Path, tmp_path: Path, request) -> str:
    """Start `train` across both nodes by `path` (pdsh, mpiexec, srun) and return its output, once it has ended with
    exit status 2 within PROBLEMS_BOUND_S."""
    if path == "srun":
        slurm = request.getfixturevalue("slurm")
        at = train.index("--output-dir")  # the batch script passes OUTPUT_DIR as --output-dir
        log = tmp_path / "srun.log"
        job = slurm.sbatch("--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=1", "--time=10", f"--output={log}",
                           str(REPO / "slurm" / "train.sbatch"), "pretrain", *train[:at], *train[at + 2:],
                           env=dict(slurm.env, OUTPUT_DIR=str(out)))
        assert slurm.wait_done(job, PROBLEMS_BOUND_S) == "FAILED", log.read_text()
        output = log.read_text()
        assert "exit code 2" in output, output[-6000:]
        return output
    if path == "pdsh":
        command = [*WIDENET_DS, "launch", "pretrain", "--hostfile", str(cluster.hostfile(slots=1)), "--num-nodes", "2",
                   "--num-ranks", "1", "--", *train]
    else:
        command = [*mpiexec_on_both(cluster), sys.executable, "-m", "widenet_ds.train", "pretrain", *train]
    proc = on_node1(cluster, command, child_env(UCX_TLS="self,tcp"))
    try:
        output, _ = proc.communicate(timeout=PROBLEMS_BOUND_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{path}: still running {PROBLEMS_BOUND_S} s after start; node 2's problems unsaid:\n"
                    f"{give_up(cluster, proc)[-6000:]}")
    assert proc.returncode == 2, f"{path}:\n{output[-6000:]}"
    return output


def test_a_rank_waiting_for_a_stopped_peer_ends_on_sigterm_within_the_bound(cluster, inputs, tmp_path):
    """Node 2's rank stopped (SIGSTOP: a frozen process or VM), node 1's rank waits for it in a collective; a SIGTERM
    there (a scheduler's, a user's) ran no handler until the collective returned. Now it ends the rank within
    STOP_BOUND_S, with one line naming node 2 and the checkpoint."""
    out = tmp_path / "stopped"
    proc = launch_on_two_nodes(cluster, inputs, out, KILLED_RUN_STEPS, save_interval=3, keep_last=100)
    saved = wait_for_checkpoint(proc, out)
    node1, node2 = cluster.nodes
    stopped, waiting = node2.processes(RANK), node1.processes(RANK)
    assert stopped and waiting, "a rank is missing"
    try:
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(2)  # node 1's rank is in its next all-to-all by now
        for pid in waiting:
            os.kill(pid, signal.SIGTERM)
        signalled = time.monotonic()
        took = wait_gone(node1, RANK, signalled, STOP_BOUND_S)
    except BaseException:
        give_up(cluster, proc)
        raise
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    output, _ = proc.communicate(timeout=120)
    said = [line for line in lines_of(output, node1) if " error: " in line]
    print(f"node 1's rank ended {took:.0f} s after its SIGTERM:", *said, sep="\n")
    assert len(said) == 1 and " got SIGTERM while waiting " in said[0], output[-6000:]
    assert f"for rank 1 on {node2.name}, which has not answered" in said[0] and f"{saved}, is kept" in said[0]


def test_a_loopback_master_addr_with_two_nodes_is_refused_before_any_rank_starts(cluster, inputs, tmp_path):
    """A one-machine habit: before, "initialising the process group" and then nothing (node 2's rank waited for a
    rendezvous on its own loopback)."""
    node1, node2 = cluster.nodes
    out = tmp_path / "loopback"
    proc = launch_on_two_nodes(cluster, inputs, out, STEPS, "--master-addr", "127.0.0.1")
    try:
        output, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the launch still ran 120 s later:\n{give_up(cluster, proc)[-4000:]}")
    assert proc.returncode == 2, output[-4000:]
    assert ("--master-addr 127.0.0.1 is a loopback address, and the ranks run on 2 nodes" in output
            and f"Use {node1.name} ({node1.address}), the address the other nodes reach rank 0's node by" in output)
    assert "--module widenet_ds.train" not in output and not out.exists()  # no runner started
    assert not node1.processes(RANK) and not node2.processes(RANK)


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
    latest, ranks, node2_rank_pids = out / "checkpoints" / "latest", {}, []
    node1, node2 = cluster.nodes
    deadline, next_state_check = time.monotonic() + 300, 0.0
    # Node 2 must be lost before the checkpoint after STEPS (two saves later, a few seconds on a busy machine; a CI
    # run saw step 6 saved first): once both tasks are found the loop only watches for the checkpoint, and node 2's
    # rank is killed by the pid found then.
    while not latest.exists():
        if (now := time.monotonic()) >= next_state_check:  # squeue, once a second
            assert slurm.job_state(job) in ("PENDING", "CONFIGURING", "RUNNING"), \
                (tmp_path / "two_nodes.log").read_text()
            assert now < deadline, "no checkpoint within 300 s"
            next_state_check = now + 1
        if len(ranks) < 2:  # which task runs where (srun's own command line holds RANK too: no PROCID)
            for node in cluster.nodes:
                for pid in node.processes(RANK):
                    with contextlib.suppress(OSError):
                        if "SLURM_PROCID" in (found := environment_of(pid)):
                            ranks.setdefault(node.name, found)
                            if node is node2:
                                node2_rank_pids.append(pid)
        time.sleep(0.01)
    for pid in [*node2_rank_pids, *node2.processes(RANK)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert slurm.wait_done(job, 120) != "COMPLETED"
    # Slurm does not requeue a job whose step failed; the script's last line says so, naming the job
    last = (tmp_path / "two_nodes.log").read_text().strip().splitlines()[-1]
    assert last.startswith("run_preemptible: the step failed (exit ") and \
        f"job {job} ends without a requeue" in last, last
    assert slurm.field(job, "Restarts") == "0"
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


def test_sbatch_with_a_node_range_loses_node2_and_continues_on_node1_alone_as_a_resume_there_would(
        slurm, cluster, inputs, tmp_path):
    """`sbatch --nodes=1-2 --ntasks-per-node=2 --requeue`: Slurm starts it on both nodes (4 ranks). Node 2
    vanishes after the first checkpoint (its link cut, every process there killed, its slurmd too): Slurm declares
    it DOWN, ends the job and requeues it; the script's last line of that run says so; the requeued job starts on
    node 1 alone (2 ranks: the script let the requeued job take fewer nodes), resumes from the last checkpoint on
    the new shape and finishes, no command typed. Its steps after the loss are those of a --resume on 1 node from
    that checkpoint, to the bit. Before: the script said "not requeueing" while Slurm requeued, and the requeued
    job waited for 2 nodes (Slurm keeps the task count of its first start)."""
    corpus, model = inputs
    out, log = tmp_path / "range", tmp_path / "range.log"
    # 16 samples a step: 4 ranks x 4, or 2 ranks x 4 x 2 accumulated; no random draws (routing noise, SOP dropout)
    ds = write_ds_config(tmp_path / "ds.json", train_micro_batch_size_per_gpu=4)
    train = ["--data", str(corpus), "--deepspeed_config", str(ds), "--model-config", str(model), "--ep-size", "2",
             "--set", "moe.noise=none", "--set", "classifier_dropout=0", "--max-steps", str(RANGE_STEPS),
             "--log-interval", "1", "--save-interval", "2", "--keep-last", "100", "--eval-interval", "0",
             "--no-tensorboard", "--seed", "7"]
    job = slurm.sbatch("--nodes=1-2", "--ntasks-per-node=2", "--requeue", "--cpus-per-task=1", "--time=10",
                       f"--output={log}", str(REPO / "slurm" / "train.sbatch"), "pretrain", *train,
                       env=dict(slurm.env, OUTPUT_DIR=str(out)))
    latest = out / "checkpoints" / "latest"
    node1, node2 = cluster.nodes
    deadline = time.monotonic() + 300
    while not latest.exists():
        assert slurm.job_state(job) in ("PENDING", "CONFIGURING", "RUNNING"), log.read_text()
        assert time.monotonic() < deadline, f"no checkpoint within 300 s\n{log.read_text()}"
        time.sleep(0.2)
    assert "4 ranks on node[1-2]" in log.read_text()
    try:
        with link_cut(cluster, node2):
            for pid in node2.processes(""):  # the ranks, slurmstepd, slurmd: every process but the sshd
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            cut = time.monotonic()
            tag = out / "checkpoints" / latest.read_text().strip()  # no checkpoint completes without node 2's ranks
            saved = int(tag.name.removeprefix("step"))
            assert saved < RANGE_STEPS, "the job got past its steps before node 2 was lost"
            shutil.copytree(tag, tmp_path / "at_loss" / tag.name)
            logged = len((out / "metrics.jsonl").read_text().splitlines())
            first_step_s = None
            while (state := slurm.job_state(job)) != "COMPLETED":
                assert state in ("RUNNING", "COMPLETING", "PENDING", "CONFIGURING"), \
                    f"job {job} {state}\n{log.read_text()}\n{slurm.logs()}"
                assert time.monotonic() - cut < REQUEUE_BOUND_S + 120, f"job {job} still {state}\n{log.read_text()}"
                if first_step_s is None and any('"train/loss"' in line for line in (
                        out / "metrics.jsonl").read_text().splitlines()[logged:]):
                    first_step_s = time.monotonic() - cut
                time.sleep(0.5)
    finally:  # node 2 back for the file's other tests
        slurm.start_slurmd(node2)
        slurm.wait_idle()
    print(f"node 2 vanished: the first step after it {first_step_s:.0f} s later, on node 1 alone")
    assert first_step_s is not None and first_step_s < REQUEUE_BOUND_S
    assert slurm.field(job, "Restarts") == "1"
    runs = log.read_text().split("pretrain: job ")  # one part per run (the log is appended to)
    assert len(runs) == 3 and "run 2, 2 ranks on node1 -> " in runs[2], log.read_text()
    assert runs[1].strip().splitlines()[-1].startswith(
        f"run_preemptible: Slurm requeued job {job} after {node2.name} (down") and "nothing to do" in runs[1], runs[1]
    resumed = [e for e in events(out) if e.startswith(f"resumed from {tag}")]
    assert len(resumed) == 1 and "on another shape (4 ranks, ep 2, ZeRO 1 -> 2 ranks, ep 2, ZeRO 1)" in resumed[0] \
        and "continues step for step" in resumed[0], resumed

    # The same continuation by hand: 2 ranks on one node, --resume of the checkpoint the job resumed from.
    manual = tmp_path / "manual"
    proc = subprocess.run([*WIDENET_DS, "launch", "pretrain", "--num-ranks", "2", "--", *train, "--output-dir",
                           str(manual), "--resume", str(tmp_path / "at_loss" / tag.name), "--no-progress-bar"],
                          cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    requeued, by_hand = train_losses(out), train_losses(manual)
    after = list(range(saved + 1, RANGE_STEPS + 1))
    assert sorted(by_hand) == after and all(step in requeued for step in after)
    assert {step: requeued[step] for step in after} == by_hand  # to the bit: the same arithmetic


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


# --- the preflight (issue 56): the job's ranks check the cluster, one table from rank 0 ------------------------------
PREFLIGHT_BOUND_S = 300  # start-up on both nodes, the checks (a few tens of seconds), the table
OTHER_DEEPSPEED = "0.19.7"
# Node 2's own DeepSpeed, first on its PYTHONPATH: the installed package's code (its folder on this package's path: the
# op builders read the same sources, so no op is built again) reporting another version, as a second DeepSpeed would.
OTHER_DEEPSPEED_INIT = """import os
__path__ = [{real!r}]
_init = os.path.join(__path__[0], "__init__.py")
exec(compile(open(_init).read(), _init, "exec"))
__version__ = {version!r}
"""
# Test-only, on node 2: every all_to_all_single of equal splits sends each peer's chunk to the next peer (a collective
# library or link that swaps what peers send). It patches torch.distributed as that module is first imported.
SWAPPING_SITECUSTOMIZE = """import importlib.abc, importlib.machinery, sys


def _swap(dist):
    original = dist.all_to_all_single

    def swapped(output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
        if output_split_sizes is None and input_split_sizes is None:
            import torch
            chunks = list(input.chunk(dist.get_world_size(group)))
            input = torch.cat(chunks[1:] + chunks[:1])
        return original(output, input, output_split_sizes, input_split_sizes, group, async_op)

    dist.all_to_all_single = swapped


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torch.distributed":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        load = spec.loader.exec_module
        spec.loader.exec_module = lambda module: (load(module), _swap(module))
        return spec


sys.meta_path.insert(0, _PatchOnImport())
"""


def node_pythonpath(cluster) -> str:
    """PYTHONPATH for both nodes: the checkout, then the node-local folder (each node's own packages there)."""
    return f"{REPO}{os.pathsep}{cluster.local / 'pypath'}"


NODE2_FAULTS = ("output folder", "data folder", "DeepSpeed", "all-to-all")  # each named by the row that finds it
NODE_LOCAL_DATA, NODE_LOCAL_RUN = "preflight-corpus", "preflight-run"  # in the node-local folder (other tests use theirs)


def give_node2_its_own_problems(cluster, inputs, shared_run: Path, faults=NODE2_FAULTS) -> tuple[Path, Path]:
    """Node 2 alone, for each of `faults`: the run folder on its own disk, no data (node 1 has it on its own disk),
    another DeepSpeed or the swapping all-to-all first on its PYTHONPATH. Returns (--data, --output-dir): the same
    paths on both nodes (the shared data and `shared_run` for what is not a fault)."""
    import deepspeed

    node1, node2 = cluster.nodes
    corpus, _ = inputs
    pypath = node2.local_dir / "pypath"
    pypath.mkdir()
    if "DeepSpeed" in faults:
        (pypath / "deepspeed").mkdir()
        (pypath / "deepspeed" / "__init__.py").write_text(OTHER_DEEPSPEED_INIT.format(
            real=str(Path(deepspeed.__file__).parent), version=OTHER_DEEPSPEED))
    if "all-to-all" in faults:
        (pypath / "sitecustomize.py").write_text(SWAPPING_SITECUSTOMIZE)
    data, out = corpus, shared_run
    if "data folder" in faults:
        shutil.copytree(corpus, node1.local_dir / NODE_LOCAL_DATA)
        data = cluster.local / NODE_LOCAL_DATA
    if "output folder" in faults:
        (node2.local_dir / NODE_LOCAL_RUN).mkdir()
        out = cluster.local / NODE_LOCAL_RUN
    return data, out


def without_node2s_problems(cluster) -> None:
    node1, node2 = cluster.nodes
    for path in (node2.local_dir / "pypath", node1.local_dir / NODE_LOCAL_DATA, node2.local_dir / NODE_LOCAL_RUN):
        shutil.rmtree(path, ignore_errors=True)


def assert_names_node2_and_the_fix(fault: str, rows, cluster, data: Path) -> None:
    """`fault`'s row fails on node 2 alone with what it found there and its fix."""
    node1, node2 = cluster.nodes
    row = rows[fault]
    assert row.result == "FAIL" and row.nodes == (node2.name,), row
    if fault == "DeepSpeed":
        assert row.found.startswith(f"DeepSpeed {OTHER_DEEPSPEED} ({cluster.local / 'pypath' / 'deepspeed'}) on "
                                    f"{node2.name}"), row
        assert "remove the other DeepSpeed there, or the folder holding it from PYTHONPATH" in row.fix, row
    elif fault == "all-to-all":
        assert "rank 1 sent rank 0 the data meant for rank 1 (itself)" in row.found, row
        assert "host name must resolve" in row.fix, row  # gloo's network, not NCCL's settings
    elif fault == "output folder":
        assert (f"is not one folder for all ranks: rank 1 on {node2.name} does not see the file rank 0 on "
                f"{node1.name} wrote there") in row.found, row
        assert row.fix.startswith("put --output-dir on storage every node mounts at the same path"), row
    else:
        assert f"rank 1 on {node2.name}: --data {data} does not exist" in row.found, row
        assert row.fix.startswith(f"copy the data folder to {data} on {node2.name}"), row


def preflight_by(launcher: str, cluster, request, train: list[str], out: Path, log: Path) -> tuple[int, str]:
    """(exit status, output) of the preflight of `train` into `out` on both nodes, by `widenet-ds launch` (pdsh) or
    `PREFLIGHT=1 sbatch slurm/train.sbatch`, one rank per node, PYTHONPATH node_pythonpath."""
    if launcher == "sbatch":
        slurm = request.getfixturevalue("slurm")
        env = dict(slurm.env, OUTPUT_DIR=str(out), PREFLIGHT="1", PYTHONPATH=node_pythonpath(cluster))
        job = slurm.sbatch("--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=1", "--time=10", f"--output={log}",
                           str(REPO / "slurm" / "train.sbatch"), "pretrain", *train, env=env)
        state = slurm.wait_done(job, PREFLIGHT_BOUND_S)
        output = log.read_text()
        status = int(slurm.field(job, "ExitCode").split(":")[0])
        assert (state == "COMPLETED") == (status == 0), f"{state}, exit {status}:\n{output[-6000:]}"
        return status, output
    proc = on_node1(cluster, [*WIDENET_DS, "launch", "--preflight", "pretrain", "--hostfile",
                              str(cluster.hostfile(slots=1)), "--num-nodes", "2", "--num-ranks", "1", "--", *train,
                              "--output-dir", str(out)], child_env(PYTHONPATH=node_pythonpath(cluster)))
    try:
        output, _ = proc.communicate(timeout=PREFLIGHT_BOUND_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the preflight still ran {PREFLIGHT_BOUND_S} s after start:\n{give_up(cluster, proc)[-6000:]}")
    return proc.returncode, output


def preflight_options(inputs, data: Path) -> list[str]:
    """The job's options with `data`, but --output-dir (slurm/train.sbatch adds OUTPUT_DIR's)."""
    train = run_args((data, inputs[1]), Path("unused"))
    at = train.index("--output-dir")
    return train[:at] + train[at + 2:]


@pytest.mark.parametrize("launcher", ["pdsh", "sbatch"])
def test_the_preflight_of_a_pretraining_job_passes_on_both_nodes(launcher, cluster, inputs, tmp_path, request):
    corpus, _ = inputs
    status, output = preflight_by(launcher, cluster, request, preflight_options(inputs, corpus), tmp_path / "run",
                                  tmp_path / "preflight.log")
    rows, verdict = read_table(output)
    print(f"{launcher}:\n{output[output.index('widenet-ds launch --preflight: pretrain on'):]}")
    assert status == 0 and tuple(rows) == PREFLIGHT_ROWS, output[-6000:]
    assert all(row.result == "ok" for row in rows.values()), output[-6000:]
    assert verdict.startswith(f"preflight: all {len(PREFLIGHT_ROWS)} checks passed in "), verdict
    node1, node2 = cluster.nodes
    assert rows["DeepSpeed"].found.endswith(" on every node") and "rank 0 on node1 and rank 1 on node2" in \
        rows["all-reduce"].found
    assert rows["all-to-all"].found.startswith("1 expert-parallel group of 2: every value right")
    assert not (tmp_path / "run").exists() and not list(tmp_path.glob(".widenet-preflight-*"))


@pytest.mark.parametrize("launcher", ["pdsh", "sbatch"])
def test_the_preflight_names_node2_and_the_fix_for_its_own_folder_data_deepspeed_and_all_to_all(
        launcher, cluster, inputs, tmp_path, request):
    """Each of node 2's problems is its own row naming node 2 and the fix; the job's steps, which would need the data
    and the all-to-all right, are not run (the swapped all-to-all would give the job's own dispatch wrong split
    sizes)."""
    node1, node2 = cluster.nodes
    try:
        data, out = give_node2_its_own_problems(cluster, inputs, tmp_path / "run")
        status, output = preflight_by(launcher, cluster, request, preflight_options(inputs, data), out,
                                      tmp_path / "preflight.log")
    finally:
        without_node2s_problems(cluster)
    rows, verdict = read_table(output)
    print(f"{launcher}:\n{output[output.index('widenet-ds launch --preflight: pretrain on'):]}")
    assert status == 2 and tuple(rows) == PREFLIGHT_ROWS, output[-6000:]
    failed = {name for name, row in rows.items() if row.result == "FAIL"}
    assert failed == {*NODE2_FAULTS, "expert routing"}, output[-6000:]
    for fault in NODE2_FAULTS:
        assert_names_node2_and_the_fix(fault, rows, cluster, data)
    assert "differ from a one-rank run's from step 1 on" in rows["expert routing"].found
    assert [rows[name].result for name in ("job's steps", "checkpoint")] == ["skipped", "skipped"]
    assert rows["clean-up"].result == "ok" and not list(node1.local_dir.glob(".widenet-preflight-*"))
    assert verdict.startswith("preflight: 5 of 16 checks failed (DeepSpeed on node2; all-to-all on node2; ")
    assert "Traceback" not in output


# What else each of node 2's problems alone leaves failed or unrun: a wrong all-to-all fails the tiny model's losses
# and holds back the job's steps; no data holds them back; an unshared output folder holds back the checkpoint.
ALSO_FAILED = {"all-to-all": {"expert routing"}}
NOT_RUN = {"all-to-all": {"job's steps", "checkpoint"}, "data folder": {"job's steps", "checkpoint"},
           "output folder": {"checkpoint"}}


@pytest.mark.parametrize("fault", NODE2_FAULTS)
def test_each_of_node2s_problems_alone_fails_its_row_and_no_other(fault, cluster, inputs, tmp_path, request):
    """One problem on node 2 at a time, under pdsh (the sbatch case of all four at once is above): its row fails
    naming node 2 and the fix, the others pass, or are skipped where they need what failed."""
    node1, node2 = cluster.nodes
    try:
        data, out = give_node2_its_own_problems(cluster, inputs, tmp_path / "run", faults=(fault,))
        status, output = preflight_by("pdsh", cluster, request, preflight_options(inputs, data), out,
                                      tmp_path / "preflight.log")
    finally:
        without_node2s_problems(cluster)
    rows, verdict = read_table(output)
    print(f"{fault}:\n{output[output.index('widenet-ds launch --preflight: pretrain on'):]}")
    assert status == 2 and tuple(rows) == PREFLIGHT_ROWS, output[-6000:]
    assert_names_node2_and_the_fix(fault, rows, cluster, data)
    by_result = {result: {name for name, row in rows.items() if row.result == result} for result in
                 ("FAIL", "skipped")}
    assert by_result == {"FAIL": {fault, *ALSO_FAILED.get(fault, ())}, "skipped": NOT_RUN.get(fault, set())}, \
        output[-6000:]
    assert not list(node1.local_dir.glob(".widenet-preflight-*")) and not list(node2.local_dir.glob(".widenet-*"))
    assert not list(tmp_path.glob(".widenet-preflight-*")) and "Traceback" not in output


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
