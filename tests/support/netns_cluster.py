"""A real 2-node cluster on one machine for tests: network namespaces joined by a veth pair, sshd per node.

`netns_cluster(root)` builds, as root:
  - per node a network namespace (`ip netns add`) holding one end of a veth pair, with an address that exists
    only inside these namespaces (10.77.0.1/24, 10.77.0.2/24), and its own /etc/hosts naming both nodes
    (`/etc/netns/<ns>/hosts`, which `ip netns exec` mounts over /etc/hosts);
  - per node a UTS and mount namespace (`unshare --uts --mount`): its own hostname, and its own node-local
    folder mounted on `root/local` (each node sees a different folder there; the test reads them under
    `root/nodes/<name>/local`);
  - per node a PID namespace with its own /proc (`--pid --mount-proc`; the node's sshd is its PID 1): a node sees
    only its own processes, as a real one does. Without it, DeepSpeed's multi-node kill (`pdsh ... pkill -f
    "python -u -m deepspeed.launcher.launch"`, sent when a node failed) ended every launcher on this machine,
    those of tests running side by side included;
  - per node an sshd listening on the node's address only, with a host key, a user key, a known_hosts and an
    ssh config made for the test (`root/ssh`). `cluster.env()` puts an `ssh` first on PATH that reads that
    config, as a user's ~/.ssh/config would, so DeepSpeed's pdsh runner and its own ssh calls work unchanged;
  - the shared file system is this machine's: the checkout, its venv and `root` are seen by both nodes, as a
    shared home is on a cluster.
A node runs a command in all of its namespaces through `nsenter` into its sshd (`node.command(...)`), the way a
user logged in on it would; the command is then a child of `nsenter` (entering a PID namespace takes a fork), and
its pid inside the node is `node.pid_inside(host_pid)`. Teardown kills whatever still runs in the namespaces, stops the sshds, deletes the
namespaces (which takes the veth pair with them) and /etc/netns entries, and then asserts that no namespace, veth,
sshd, mount or /etc/netns entry of this cluster is left: also after a failing test.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "10.77.0"  # exists only inside the namespaces made here
SSHD = "/usr/sbin/sshd"
_CLUSTERS = itertools.count()
TOOLS = ("ip", "unshare", "nsenter", "ssh", "ssh-keygen", SSHD, "pdsh")


def unavailable_reason() -> str | None:
    """Why this machine cannot hold the cluster (the tests skip with it), or None."""
    if os.geteuid() != 0:
        return "the 2-node test cluster needs root (ip netns, unshare --mount, sshd)"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"the 2-node test cluster needs {', '.join(missing)} (apt-get install -y iproute2 openssh-server pdsh)"
    probe = f"wnprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    if made.returncode != 0:
        return f"`ip netns add` is refused here ({made.stderr.strip()})"
    return None


@dataclass(frozen=True)
class Node:
    name: str  # its hostname, resolvable on every node
    address: str
    netns: str
    local_dir: Path  # what this node sees at cluster.local, read from outside
    sshd: subprocess.Popen = field(repr=False)  # `unshare`, the parent of the node's first process
    init_pid: int  # the host's pid of the node's first process, its sshd (PID 1 inside)

    def command(self, args: list[str], cwd: Path | None = None) -> list[str]:
        """`args` run inside this node: its network, hostname, mounts and processes (those of its sshd), in `cwd`
        (entering a mount namespace otherwise starts in its /)."""
        return ["nsenter", "--target", str(self.init_pid), "--net", "--uts", "--mount", "--pid",
                f"--wdns={cwd or '/'}", "--", *args]

    def pids(self) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True).stdout
        return [int(pid) for pid in out.split()]

    def processes(self, contains: str) -> list[int]:
        """Host pids of this node's processes whose command line contains `contains`: those in its PID namespace
        (not the nsenter that started one), the sshd left out."""
        found = []
        for pid in self.pids():
            with contextlib.suppress(OSError):
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                if contains in cmdline and pid != self.init_pid and len(_namespace_pids(pid)) > 1:
                    found.append(pid)
        return found

    def pid_inside(self, host_pid: int) -> int:
        """The pid a process of this node has there (what its own messages name)."""
        return _namespace_pids(host_pid)[-1]

    def host_pid(self, pid_inside: int) -> int | None:
        """The host's pid of this node's process `pid_inside` (a pid file written on the node names that), or
        None when it has gone."""
        for pid in self.pids():
            with contextlib.suppress(OSError):
                pids = _namespace_pids(pid)
                if len(pids) > 1 and pids[-1] == pid_inside:  # in the node's PID namespace (not an nsenter)
                    return pid
        return None


def _namespace_pids(host_pid: int) -> list[int]:
    """A process's pid in each PID namespace it is in, the host's first (/proc/PID/status, NSpid)."""
    for line in Path(f"/proc/{host_pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return [int(pid) for pid in line.split()[1:]]
    raise OSError(f"no NSpid line for process {host_pid}")


@dataclass(frozen=True)
class NetnsCluster:
    prefix: str  # of its namespaces' and links' names
    root: Path  # on the shared file system
    nodes: tuple[Node, ...]
    local: Path  # the node-local folder's path, the same on every node
    ssh_bin: Path  # holds the `ssh` that reads the test's config

    def hostfile(self, slots: int = 1) -> Path:
        path = self.root / f"hostfile-{slots}"
        path.write_text("".join(f"{node.name} slots={slots}\n" for node in self.nodes))
        return path

    def env(self, base: dict[str, str]) -> dict[str, str]:
        return {**base, "PATH": f"{self.ssh_bin}:{base.get('PATH', os.defpath)}"}

    def ssh(self, node: Node, remote: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """`ssh <node> remote` from node 1, as a user there would."""
        return subprocess.run(self.nodes[0].command([str(self.ssh_bin / "ssh"), node.name, remote]),
                              capture_output=True, text=True, timeout=timeout)


def _run(*args: str) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"2-node test cluster: `{' '.join(args)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def _write_ssh_files(ssh_dir: Path, names: list[str], addresses: list[str]) -> None:
    """A user key authorised on every node, a host key per node recorded in a private known_hosts, and the ssh
    config that uses them."""
    ssh_dir.mkdir(mode=0o700)
    _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "widenet-test", "-f", str(ssh_dir / "id_ed25519"))
    (ssh_dir / "authorized_keys").write_text((ssh_dir / "id_ed25519.pub").read_text())
    known = []
    for name, address in zip(names, addresses):
        key = ssh_dir / f"host_{name}"
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(key))
        known.append(f"{name},{address} {' '.join(Path(f'{key}.pub').read_text().split()[:2])}\n")
    (ssh_dir / "known_hosts").write_text("".join(known))
    (ssh_dir / "config").write_text(f"""\
Host *
    User root
    IdentityFile {ssh_dir}/id_ed25519
    IdentitiesOnly yes
    UserKnownHostsFile {ssh_dir}/known_hosts
    GlobalKnownHostsFile /dev/null
    StrictHostKeyChecking yes
    BatchMode yes
    ConnectTimeout 10
    LogLevel ERROR
""")


def _sshd_config(ssh_dir: Path, node_dir: Path, name: str, address: str) -> Path:
    config = node_dir / "sshd_config"
    config.write_text(f"""\
ListenAddress {address}
Port 22
HostKey {ssh_dir}/host_{name}
PidFile {node_dir}/sshd.pid
AuthorizedKeysFile {ssh_dir}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
MaxStartups 64
""")
    return config


def _wait_for_sshd(node: Node, ssh_bin: Path, log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if node.sshd.poll() is not None:
            raise RuntimeError(f"2-node test cluster: sshd of {node.name} exited ({node.sshd.returncode}):\n"
                               f"{log.read_text()[-2000:]}")
        probe = subprocess.run(node.command([str(ssh_bin / "ssh"), node.name, "hostname"]), capture_output=True,
                               text=True, timeout=30)
        if probe.returncode == 0 and probe.stdout.strip() == node.name:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"2-node test cluster: ssh to {node.name} fails: {probe.stderr.strip()}\n"
                               f"{log.read_text()[-2000:]}")
        time.sleep(0.3)


def _cgroup_mounts() -> str:
    """Shell commands that mount this machine's cgroup hierarchies again inside a node: `ip netns exec` mounts a
    fresh /sys for the namespace, without /sys/fs/cgroup, and slurmd refuses to start without it."""
    commands = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        point, kind = fields[4], fields[fields.index("-") + 1]
        options = ",".join(o for o in fields[fields.index("-") + 3].split(",") if o not in ("rw", "ro"))
        if point == "/sys/fs/cgroup":
            commands.append(f"mount -t {kind} -o {options or 'defaults'} {kind} {point}")
        elif point.startswith("/sys/fs/cgroup/") and kind == "cgroup":
            commands.append(f"mkdir -p {point} && mount -t cgroup -o {options} cgroup {point}")
    return "".join(f"{{ {command}; }} 2>/dev/null; " for command in commands)


def leftovers(prefix: str, root: Path) -> list[str]:
    """What of a cluster named `prefix` still exists: namespaces, links, sshd processes, mounts, /etc/netns."""
    found = [f"namespace {ns}" for ns in _run("ip", "netns", "list").split() if ns.startswith(prefix)]
    found += [f"link {line.split(':')[1].strip()}" for line in _run("ip", "-o", "link", "show").splitlines()
              if line.split(":")[1].strip().startswith(prefix)]
    for proc in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            cmdline = proc.read_bytes().replace(b"\0", b" ").decode()
            if cmdline.startswith(SSHD) and str(root) in cmdline:
                found.append(f"sshd process {proc.parent.name}: {cmdline}")
    found += [f"mount {line.split()[4]}" for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if str(root) in line.split()[4] or f"/run/netns/{prefix}" in line.split()[4]]
    found += [f"/etc/netns/{path.name}" for path in Path("/etc/netns").glob(f"{prefix}*")]
    return found


@contextlib.contextmanager
def netns_cluster(root: Path, num_nodes: int = 2) -> Iterator[NetnsCluster]:
    """Bring up the cluster under `root` (see the module docstring); tear it down and check it is gone."""
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(reason)
    # Names of this cluster only: test processes side by side, and clusters one after another in one, differ.
    prefix = f"wn{os.getpid()}x{next(_CLUSTERS)}-"
    names = [f"node{i}" for i in range(1, num_nodes + 1)]
    addresses = [f"{SUBNET}.{i}" for i in range(1, num_nodes + 1)]
    namespaces = [f"{prefix}{name}" for name in names]
    ssh_dir, ssh_bin, local = root / "ssh", root / "bin", root / "local"
    ssh_bin.mkdir(parents=True)
    local.mkdir()
    (ssh_bin / "ssh").write_text(f"#!/bin/sh\nexec /usr/bin/ssh -F {ssh_dir}/config \"$@\"\n")
    (ssh_bin / "ssh").chmod(0o755)
    _write_ssh_files(ssh_dir, names, addresses)
    hosts = "127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for a, n in zip(addresses, names))
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation folder (Debian's package)
    nodes: list[Node] = []
    try:
        for ns in namespaces:
            _run("ip", "netns", "add", ns)
            Path(f"/etc/netns/{ns}").mkdir(parents=True)
            Path(f"/etc/netns/{ns}/hosts").write_text(hosts)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        # A veth pair for two nodes; more nodes would need a bridge.
        ends = [f"{prefix}v{i}" for i in range(num_nodes)]
        assert num_nodes == 2, "a veth pair joins two nodes"
        _run("ip", "link", "add", ends[0], "type", "veth", "peer", "name", ends[1])
        for end, ns, address in zip(ends, namespaces, addresses):
            _run("ip", "link", "set", end, "netns", ns)
            _run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", end)
            _run("ip", "-n", ns, "link", "set", end, "up")
        for name, address, ns in zip(names, addresses, namespaces):
            node_dir = root / "nodes" / name
            (node_dir / "local").mkdir(parents=True)
            config = _sshd_config(ssh_dir, node_dir, name, address)
            log = node_dir / "sshd.log"
            # The hostname and the node-local mount live in the sshd's own namespaces; every session inherits them.
            setup = (f"hostname {name} && mount --bind {node_dir / 'local'} {local} && {_cgroup_mounts()}"
                     f"exec {SSHD} -D -e -f {config}")
            with open(log, "wb") as out:
                # --kill-child: the node's processes end with unshare, should a test kill that.
                sshd = subprocess.Popen(["ip", "netns", "exec", ns, "unshare", "--uts", "--mount", "--pid", "--fork",
                                         "--kill-child", "--mount-proc", "--propagation", "private", "sh", "-c",
                                         setup], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                init_pid = _first_child(sshd)
            except RuntimeError:
                sshd.kill()  # and, through --kill-child, its child
                sshd.wait(timeout=10)
                raise
            node = Node(name, address, ns, node_dir / "local", sshd, init_pid)
            nodes.append(node)
            _wait_for_sshd(node, ssh_bin, log)
        yield NetnsCluster(prefix, root, tuple(nodes), local, ssh_bin)
    finally:
        _tear_down(nodes, namespaces)
        left = leftovers(prefix, root)
        assert not left, f"the 2-node test cluster left these behind: {left}"


def _first_child(proc: subprocess.Popen, timeout: float = 10) -> int:
    """The pid of `proc`'s child (unshare forks the node's first process at once)."""
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError):
            if found := children.read_text().split():
                return int(found[0])
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"2-node test cluster: `unshare` (pid {proc.pid}) started no node process")
        time.sleep(0.01)


def _tear_down(nodes: list[Node], namespaces: list[str]) -> None:
    # Whatever a test started on a node (ranks, launchers, ssh sessions) and the sshd, the node's PID 1, whose end
    # ends whatever is left in its PID namespace; then unshare, which exits once its child has.
    for node in nodes:
        for pid in node.pids():
            if pid != node.sshd.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    for node in nodes:
        node.sshd.terminate()
        try:
            node.sshd.wait(timeout=10)
        except subprocess.TimeoutExpired:
            node.sshd.kill()
            node.sshd.wait(timeout=10)
    deadline = time.monotonic() + 10
    for node in nodes:  # killed processes leave the namespace once the kernel has reaped them
        while node.pids() and time.monotonic() < deadline:
            time.sleep(0.1)
    for ns in namespaces:
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True)  # its veth end goes with it
        shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
    with contextlib.suppress(OSError):
        Path("/etc/netns").rmdir()  # only when no other namespace keeps an entry there
