"""A real single-node Slurm for tests: munged + slurmctld + slurmd from Debian's packages.

`slurm_cluster(workdir)` writes a munge key and a `slurm.conf` (this host, 2 CPUs, one default
partition, requeue allowed), starts the three daemons as root with their state, spool, logs and
pid files under private folders, waits until `sinfo` reports the node idle, yields a `SlurmCluster`
(environment for `sbatch`/`squeue`/`scontrol`, paths), and always stops the daemons by their pid
files. Install the packages with `scripts/install_slurm.sh` (CI does).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo", "squeue")


def missing_tools() -> list[str]:
    return [tool for tool in DAEMONS if shutil.which(tool) is None]


@dataclass(frozen=True)
class SlurmCluster:
    root: Path  # slurm.conf, state, spool, logs
    conf: Path
    node: str
    env: dict[str, str]  # os.environ + SLURM_CONF: pass to every Slurm client call

    def run(self, *args: str, check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """A Slurm client command; `env` (default: self.env) is also what `sbatch` hands to the job."""
        proc = subprocess.run(args, env=self.env if env is None else env, capture_output=True, text=True,
                              timeout=60)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def sbatch(self, *args: str, env: dict[str, str] | None = None) -> int:
        out = self.run("sbatch", "--parsable", *args, env=env).stdout.strip()
        return int(out.split(";")[0])

    def job_field(self, job_id: int, field: str) -> str:
        """One field of `scontrol show job` (e.g. JobState, Restarts, ExitCode)."""
        out = self.run("scontrol", "-o", "show", "job", str(job_id)).stdout
        for item in out.split():
            key, _, value = item.partition("=")
            if key == field:
                return value
        raise KeyError(f"{field} not in scontrol output: {out}")

    def wait_state(self, job_id: int, states: set[str], timeout: float) -> str:
        """Poll until the job reaches one of `states`; TimeoutError with the job record otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.job_field(job_id, "JobState")
            if state in states:
                return state
            if time.monotonic() > deadline:
                record = self.run("scontrol", "show", "job", str(job_id), check=False).stdout
                raise TimeoutError(f"job {job_id} still {state} after {timeout}s, wanted {states}:\n{record}")
            time.sleep(0.5)

    def logs(self) -> str:
        parts = []
        for name in ("slurmctld.log", f"slurmd-{self.node}.log"):
            path = self.root / name
            if path.exists():
                parts.append(f"--- {name} (tail) ---\n" + "\n".join(path.read_text().splitlines()[-40:]))
        return "\n".join(parts)


def _free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def _write_munge_files(munge_dir: Path) -> Path:
    """Key and folders owned by the munge user: munged refuses files it does not own."""
    munge_user = pwd.getpwnam("munge")
    key = munge_dir / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    for path in (munge_dir, key):
        os.chown(path, munge_user.pw_uid, munge_user.pw_gid)
    munge_dir.chmod(0o711)  # munged insists that every user can reach its socket
    return key


def slurm_conf(root: Path, nodes: list[tuple[str, str]], ctld_port: int, slurmd_port: int, munge_socket: Path,
               cluster_name: str = "widenet-test") -> str:
    """The test clusters' slurm.conf: `nodes` (name, address), the first one also the controller; each slurmd's
    spool, pid file and log named by its node (%n), so nodes sharing a file system keep theirs apart."""
    controller = nodes[0]
    node_lines = "".join(f"NodeName={name} NodeAddr={address} CPUs=2 State=UNKNOWN\n" for name, address in nodes)
    return f"""\
ClusterName={cluster_name}
SlurmctldHost={controller[0]}({controller[1]})
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
# cred_expire also delays a requeued job's restart (120 s by default): 5 s keeps the test short.
AuthInfo=socket={munge_socket},cred_expire=5
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
# Preempted jobs come back: `--requeue` jobs and `scontrol requeue` need this.
JobRequeue=1
# Short timers keep a test's submit -> run -> requeue -> run cycle within seconds.
SchedulerParameters=sched_interval=1,bf_interval=1
MessageTimeout=10
KillWait=10
MinJobAge=300
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
{node_lines}PartitionName=debug Nodes={",".join(name for name, _ in nodes)} Default=YES MaxTime=INFINITE State=UP
"""


def _stop(pid_file: Path, timeout: float = 15.0, host_pid: Callable[[int], int | None] = lambda pid: pid) -> None:
    """SIGTERM the daemon named in `pid_file`, SIGKILL if it does not go within `timeout`. `host_pid`: this
    machine's pid of the one the file names (a daemon in a PID namespace writes its pid there), None if gone."""
    if not pid_file.exists():
        return
    text = pid_file.read_text().strip()
    if not text:
        return
    pid = host_pid(int(text))
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            os.kill(pid, 0)  # raises ProcessLookupError once it has gone
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)


def _start(what: str, cmd: list[str], env: dict[str, str], cluster_logs) -> None:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"Slurm test cluster: {what} failed to start ({proc.returncode}): "
                           f"{proc.stderr.strip()}\n{cluster_logs()}")


def _wait_for(what: str, predicate, timeout: float, cluster_logs) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"Slurm test cluster: {what} not ready after {timeout}s\n{cluster_logs()}")
        time.sleep(0.2)


@contextlib.contextmanager
def slurm_cluster(workdir: Path) -> Iterator[SlurmCluster]:
    """Bring up munged + slurmctld + slurmd for one test; tear them down whatever happens."""
    if os.geteuid() != 0:
        raise RuntimeError("slurm_cluster needs root (the daemons run as SlurmUser=root)")
    missing = missing_tools()
    if missing:
        raise RuntimeError(f"slurm_cluster: {missing} not installed; run scripts/install_slurm.sh")
    root = Path(workdir) / "slurm"
    node = socket.gethostname().split(".")[0]
    for sub in ("state", f"spool-{node}"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    # munged runs as the munge user and cannot enter pytest's 0700 root-owned tmp folders.
    munge_dir = Path(tempfile.mkdtemp(prefix="widenet-munge-"))
    key = _write_munge_files(munge_dir)
    munge_socket = munge_dir / "munge.socket"
    ctld_port, slurmd_port = _free_ports(2)
    conf = root / "slurm.conf"
    conf.write_text(slurm_conf(root, [(node, "127.0.0.1")], ctld_port, slurmd_port, munge_socket))
    # Jobs inherit this environment: leave out the test process's own rank variables (see child_env).
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["SLURM_CONF"] = str(conf)
    cluster = SlurmCluster(root=root, conf=conf, node=node, env=env)
    munge_pid = munge_dir / "munged.pid"
    try:
        munged = ["runuser", "-u", "munge", "--", "munged", f"--socket={munge_socket}", f"--key-file={key}",
                  f"--pid-file={munge_pid}", f"--log-file={munge_dir}/munged.log",
                  f"--seed-file={munge_dir}/munged.seed"]
        _start("munged", munged, env, cluster.logs)
        _wait_for("munged", munge_socket.exists, 10, cluster.logs)
        # -c: ignore any saved state; both daemons fork into the background and write pid files.
        _start("slurmctld", ["slurmctld", "-c", "-f", str(conf)], env, cluster.logs)
        _start("slurmd", ["slurmd", "-c", "-f", str(conf), "-N", node], env, cluster.logs)

        def node_idle() -> bool:
            out = cluster.run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.split()
            return out == ["idle"]

        _wait_for("node idle in sinfo", node_idle, 30, cluster.logs)
        yield cluster
    finally:
        # Jobs first, so slurmd does not leave tasks behind; then the daemons by pid file.
        if (root / "slurmctld.pid").exists():
            cluster.run("scancel", "--user=root", check=False)
        _stop(root / f"slurmd-{node}.pid")
        _stop(root / "slurmctld.pid")
        _stop(munge_pid)
        shutil.rmtree(munge_dir, ignore_errors=True)
