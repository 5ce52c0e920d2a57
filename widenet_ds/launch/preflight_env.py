"""What each rank of a preflight finds on its node, and the rows that hold every node to node 1 (rank 0's): torch, its
CUDA, the GPU driver, DeepSpeed (the version it reports and where it is imported from), the DeepSpeed ops the job
loads (pre-built, JIT-built, or buildable as DeepSpeed's own builder judges: `is_compatible()`), the free memory of
each device (on CPU: the host's) and the free disk where the run writes."""

from __future__ import annotations

import contextlib
import io
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch

from widenet_ds.engine.extensions import SHM_OP, use_environment_extensions_dir
from widenet_ds.fs.disk_space import free_bytes, mib, needed_bytes
from widenet_ds.launch.preflight_collectives import rank_device
from widenet_ds.launch.preflight_table import Row, failed, passed

NO_GPU = "none (no GPU)"
CPU_BUILD = "none (a CPU build)"
# A node whose devices have less free memory than this share of node 1's holds something else there (another job).
FREE_MEMORY_SHARE = 0.8
SAME_EVERYWHERE_FIX = ("every node must run the same Python environment: the checkout and its venv at the same "
                       "path on a shared file system (docs/cluster.md), nothing else first on PYTHONPATH")


@dataclass(frozen=True)
class NodeFacts:
    """One rank's findings (its node's, for what a node has once)."""

    host: str
    torch: str
    cuda: str
    driver: str
    deepspeed: str
    deepspeed_at: str                 # the folder DeepSpeed is imported from
    ops: dict[str, str]               # op -> "pre-built" | "JIT-built" | "buildable" | "cannot be built: ..."
    device: str                       # "CPU" or the GPU's name
    free_memory: int                  # bytes free on this rank's device (CPU: the host's available memory)
    free_disk: int                    # bytes free where the run writes


def gpu_driver() -> str:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return NO_GPU
    out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True)
    return out.stdout.splitlines()[0].strip() if out.returncode == 0 and out.stdout.strip() else NO_GPU


def host_available_memory() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def op_status(op: str) -> str:
    """Whether DeepSpeed can load `op` here: built into the install, JIT-built in this environment's folder, or
    buildable at first use as its builder judges (the builder's own reason when it cannot)."""
    import deepspeed.git_version_info as installed
    from deepspeed.ops.op_builder.all_ops import ALL_OPS

    if installed.installed_ops.get(op):
        return "pre-built"
    if any((use_environment_extensions_dir() / op).glob(f"{op}*.so")):
        return "JIT-built"
    builder = ALL_OPS.get(op)
    if builder is None:
        from deepspeed.accelerator import get_accelerator

        return f"cannot be built: DeepSpeed's {get_accelerator()._name} accelerator has no {op} op"
    with contextlib.redirect_stdout(io.StringIO()):  # the builders print their warnings
        compatible = builder.is_compatible(verbose=False)
    if compatible:
        return "buildable"
    return f"cannot be built: {getattr(builder, 'error_log', None) or 'its builder says it is not compatible here'}"


def node_facts(ops: list[str], run_folder: Path) -> NodeFacts:
    import deepspeed

    if torch.cuda.is_available():
        gpu = rank_device()
        device, free_memory = torch.cuda.get_device_name(gpu), torch.cuda.mem_get_info(gpu)[0]
    else:
        device, free_memory = "CPU", host_available_memory()
    return NodeFacts(socket.gethostname(), torch.__version__, torch.version.cuda or CPU_BUILD, gpu_driver(),
                     deepspeed.__version__, str(Path(deepspeed.__file__).parent), {op: op_status(op) for op in ops},
                     device, free_memory, free_bytes(run_folder))


def job_ops(optimizer_op: str | None) -> list[str]:
    """The ops the job loads: its optimizer's (engine/build.py's `optimizer_op`), and on CPU DeepSpeed's shared-memory
    all-reduce, which the rendezvous loads."""
    return [op for op in (optimizer_op, None if torch.cuda.is_available() else SHM_OP) if op]


def by_node(facts: list[NodeFacts]) -> dict[str, NodeFacts]:
    """Each node's first rank's findings, in node order."""
    found: dict[str, NodeFacts] = {}
    for fact in facts:
        found.setdefault(fact.host, fact)
    return found


def _same_as_node1(facts: list[NodeFacts], check: str, value, words, fix: str) -> Row:
    nodes = by_node(facts)
    first = next(iter(nodes.values()))
    other = [host for host, fact in nodes.items() if value(fact) != value(first)]
    if not other:
        return passed(check, f"{words(first)} on {'every node' if len(nodes) > 1 else first.host}")
    found = "; ".join(f"{words(nodes[host])} on {host}" for host in other) + f"; {words(first)} on {first.host}"
    return failed(check, found, fix.format(nodes=", ".join(other), node1=first.host), other)


def environment_rows(facts: list[NodeFacts]) -> list[Row]:
    """torch, CUDA, the driver and DeepSpeed on every node against node 1's; the ops every node can load."""
    first = facts[0]
    rows = [
        _same_as_node1(facts, "torch", lambda f: f.torch, lambda f: f"torch {f.torch}",
                       f"install torch {first.torch} on {{nodes}}: {SAME_EVERYWHERE_FIX}"),
        _same_as_node1(facts, "CUDA", lambda f: f.cuda,
                       lambda f: "no CUDA (a CPU build of torch)" if f.cuda == CPU_BUILD else f"CUDA {f.cuda}",
                       f"install the build of torch {{node1}} has (CUDA {first.cuda}) on {{nodes}} (docs/gpu.md, "
                       f"\"Install on a GPU node\")"),
        _same_as_node1(facts, "GPU driver", lambda f: f.driver, lambda f: "no GPU" if f.driver == NO_GPU
                       else f"NVIDIA driver {f.driver}",
                       f"install NVIDIA driver {first.driver} on {{nodes}} as on {{node1}} (nvidia-smi shows it; "
                       f"docs/gpu.md, \"The driver\")"),
        _same_as_node1(facts, "DeepSpeed", lambda f: f.deepspeed,
                       lambda f: f"DeepSpeed {f.deepspeed} ({f.deepspeed_at})",
                       f"make {{nodes}} import DeepSpeed {first.deepspeed} from {first.deepspeed_at} as {{node1}} "
                       f"does: remove the other DeepSpeed there, or the folder holding it from PYTHONPATH; "
                       f"{SAME_EVERYWHERE_FIX}"),
    ]
    return rows + [ops_row(facts)]


def ops_row(facts: list[NodeFacts]) -> Row:
    nodes = by_node(facts)
    ops = list(facts[0].ops)
    if not ops:
        return passed("DeepSpeed ops", "none needed (the optimizer is torch's or ours)")
    broken = {host: {op: status for op, status in fact.ops.items() if status.startswith("cannot")}
              for host, fact in nodes.items()}
    broken = {host: found for host, found in broken.items() if found}
    if not broken:
        statuses = {op: sorted({fact.ops[op] for fact in nodes.values()}) for op in ops}
        return passed("DeepSpeed ops", "; ".join(f"{op} {' or '.join(found)} on every node"
                                                 for op, found in statuses.items()))
    found = "; ".join(f"{op} {status} on {host}" for host, ops_ in broken.items() for op, status in ops_.items())
    return failed("DeepSpeed ops", found, "give those nodes what the op's build needs (nvcc of torch's CUDA, "
                  "CUDA_HOME, ninja: `scripts/gpu_toolkit.py` names what is missing), or pre-build the ops at install "
                  "(./launcher.sh setup --gpu --prebuild-ops; docs/gpu.md, \"The DeepSpeed ops a job builds\")",
                  list(broken))


def memory_row(facts: list[NodeFacts], peaks: list[int] | None) -> Row:
    """Each device's free memory against node 1's and, where the job's steps ran, against their peak on it (on CPU
    the ranks of a node share its memory: their peaks add up)."""
    first = facts[0]
    low_share = {f.host for f in facts if f.free_memory < FREE_MEMORY_SHARE * first.free_memory}
    need: dict[str, int] = {}
    if peaks is not None:
        for fact, peak in zip(facts, peaks):
            need[fact.host] = need.get(fact.host, 0) + peak if fact.device == "CPU" else max(need.get(fact.host, 0),
                                                                                            peak)
    short = {host for host, fact in by_node(facts).items() if peaks is not None and
             min(f.free_memory for f in facts if f.host == host) < need[host]}
    least = min(facts, key=lambda f: f.free_memory)
    what = "the host's available memory" if first.device == "CPU" else f"free on each {first.device}"
    if not low_share and not short:
        peak = f"; the job's steps peaked at {mib(max(need.values()))} per node" if need and first.device == "CPU" \
            else f"; the job's steps peaked at {mib(max(peaks))} per device" if peaks else ""
        return passed("free memory", f"{what}: at least {mib(least.free_memory)} ({least.host}){peak}")
    bad = sorted(low_share | short, key=lambda h: list(by_node(facts)).index(h))
    found = "; ".join(f"{mib(min(f.free_memory for f in facts if f.host == h))} free on {h}"
                      + (f", the job's steps need {mib(need[h])}" if h in short else "") for h in bad)
    return failed("free memory", f"{what}: {found}; {mib(first.free_memory)} on {first.host}",
                  "end what else holds the memory on those nodes (nvidia-smi lists a GPU's processes), or leave them "
                  "out of the job", bad)


def disk_row(facts: list[NodeFacts], checkpoint_bytes: int | None, keep_last: int, where: Path) -> Row:
    """The free disk where the run writes, against what its checkpoints take (the preflight's own checkpoint's size
    times --keep-last, and one more being written), where one was saved."""
    nodes = by_node(facts)
    need = needed_bytes(checkpoint_bytes * (keep_last + 1)) if checkpoint_bytes else None
    least = min(nodes.values(), key=lambda f: f.free_disk)
    if need is None or least.free_disk >= need:
        also = (f"; the run's {keep_last + 1} checkpoints take about {mib(need)}" if need else "")
        return passed("free disk", f"{mib(least.free_disk)} free in {where} ({least.host}){also}")
    short = [host for host, fact in nodes.items() if fact.free_disk < need]
    return failed("free disk", "; ".join(f"{mib(nodes[h].free_disk)} free in {where} on {h}" for h in short)
                  + f", the run's {keep_last} kept checkpoints and the one being written take about {mib(need)}",
                  "free space there, lower --keep-last, or choose an --output-dir with more space", short)
