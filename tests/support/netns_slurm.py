"""A real multi-node Slurm on the 2-node test cluster (tests/support/netns_cluster.py): slurmctld on node 1, one slurmd per
node, each inside its node's namespaces and reaching the others by the nodes' addresses; one munged (outside the
namespaces: its socket is a file on the shared file system, as a cluster's is on every node's local disk).

`slurm_on(cluster, root)` starts them, waits until `sinfo` reports every node idle, yields a `ClusterSlurm` whose
client commands (`sbatch`, `scontrol`) run on node 1, and stops every daemon by its pid file, then asserts none
is left. Debian's packages: scripts/install_slurm.sh.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.netns_cluster import NetnsCluster
from tests.support.slurm_cluster import _stop, _wait_for, _write_munge_files, missing_tools, slurm_conf

CTLD_PORT, SLURMD_PORT = 6817, 6818  # each node's own network: nothing else listens there


@dataclass(frozen=True)
class ClusterSlurm:
    cluster: NetnsCluster
    root: Path
    env: dict[str, str]  # SLURM_CONF and PATH: pass to every client command (sbatch hands it to the job)

    def run(self, *args: str, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
        """A Slurm client command on node 1."""
        proc = subprocess.run(self.cluster.nodes[0].command(list(args)), env=env or self.env, capture_output=True,
                              text=True, timeout=60)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}\n{self.logs()}")
        return proc

    def sbatch(self, *args: str, env: dict[str, str]) -> int:
        return int(self.run("sbatch", "--parsable", *args, env=env).stdout.strip().split(";")[0])

    def field(self, job_id: int, name: str) -> str:
        """One field of `scontrol show job` (JobState, Restarts, NodeList, ...)."""
        out = self.run("scontrol", "-o", "show", "job", str(job_id)).stdout
        return next(item.partition("=")[2] for item in out.split() if item.startswith(f"{name}="))

    def job_state(self, job_id: int) -> str:
        return self.field(job_id, "JobState")

    def wait_done(self, job_id: int, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while (state := self.job_state(job_id)) in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {state} after {timeout}s\n{self.logs()}")
            time.sleep(0.5)
        return state

    def start_slurmd(self, node) -> None:
        """`node`'s slurmd (again, after a test took the node down with it): it forks into the background inside the
        node's namespaces and writes its pid file; ReturnToService=2 puts a DOWN node back once it registers."""
        conf = self.root / "slurm.conf"
        subprocess.run(node.command(["slurmd", "-c", "-f", str(conf), "-N", node.name]), env=self.env, check=True,
                       capture_output=True, timeout=30)

    def wait_idle(self, timeout: float = 60) -> None:
        """Until `sinfo` reports every node idle."""
        names = sorted(node.name for node in self.cluster.nodes)

        def all_idle() -> bool:
            out = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False).stdout.split("\n")
            return sorted(line.strip() for line in out if line.strip()) == [f"{name} idle" for name in names]

        _wait_for("every node idle in sinfo", all_idle, timeout, self.logs)

    def logs(self) -> str:
        parts = []
        for path in sorted(self.root.glob("*.log")):
            parts.append(f"--- {path.name} (tail) ---\n" + "\n".join(path.read_text().splitlines()[-30:]))
        return "\n".join(parts)


def _daemons_left(conf: Path) -> list[str]:
    left = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            text = cmdline.read_bytes().replace(b"\0", b" ").decode()
            if str(conf) in text and text.split()[0].rsplit("/", 1)[-1] in ("slurmctld", "slurmd", "slurmstepd"):
                left.append(f"{cmdline.parent.name}: {text}")
    return left


@contextlib.contextmanager
def slurm_on(cluster: NetnsCluster, root: Path, base_env: dict[str, str]) -> Iterator[ClusterSlurm]:
    missing = missing_tools()
    if missing:
        raise RuntimeError(f"multi-node Slurm: {missing} not installed; run scripts/install_slurm.sh")
    root.mkdir(parents=True)
    for sub in ("state", *(f"spool-{node.name}" for node in cluster.nodes)):
        (root / sub).mkdir()
    munge_dir = Path(tempfile.mkdtemp(prefix="widenet-munge-"))  # munged (its own user) cannot enter pytest's folders
    key = _write_munge_files(munge_dir)
    munge_socket, munge_pid = munge_dir / "munge.socket", munge_dir / "munged.pid"
    conf = root / "slurm.conf"
    conf.write_text(slurm_conf(root, [(node.name, node.address) for node in cluster.nodes], CTLD_PORT, SLURMD_PORT,
                               munge_socket, cluster_name="widenet-netns"))
    env = {**cluster.env(base_env), "SLURM_CONF": str(conf)}
    slurm = ClusterSlurm(cluster, root, env)
    try:
        subprocess.run(["runuser", "-u", "munge", "--", "munged", f"--socket={munge_socket}", f"--key-file={key}",
                        f"--pid-file={munge_pid}", f"--log-file={munge_dir}/munged.log",
                        f"--seed-file={munge_dir}/munged.seed"], check=True, capture_output=True, timeout=30)
        _wait_for("munged", munge_socket.exists, 10, slurm.logs)
        # Both daemons fork into the background inside the node's namespaces and write their pid files.
        subprocess.run(cluster.nodes[0].command(["slurmctld", "-c", "-f", str(conf)]), env=env, check=True,
                       capture_output=True, timeout=30)
        for node in cluster.nodes:
            slurm.start_slurmd(node)
        slurm.wait_idle()
        yield slurm
    finally:
        if (root / "slurmctld.pid").exists():
            slurm.run("scancel", "--user=root", check=False)
        for node in cluster.nodes:  # pid files written inside the nodes: their pids there
            _stop(root / f"slurmd-{node.name}.pid", host_pid=node.host_pid)
        _stop(root / "slurmctld.pid", host_pid=cluster.nodes[0].host_pid)
        _stop(munge_pid)
        shutil.rmtree(munge_dir, ignore_errors=True)
        deadline = time.monotonic() + 15  # job steps end after their slurmd
        while _daemons_left(conf) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = _daemons_left(conf)
        assert not left, f"multi-node Slurm left these running: {left}"
