"""Each node's environment against node 1's (launch/preflight_env.py): the versions and where DeepSpeed comes from,
the ops as DeepSpeed's own builders judge them on this machine, free memory and disk against what the job's steps
took. Node 2's other DeepSpeed, read from a real second copy of the package on a node: tests/integration/
test_two_nodes.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import deepspeed
import torch

from widenet_ds.engine.extensions import SHM_OP
from widenet_ds.launch.preflight_env import (
    disk_row,
    environment_rows,
    job_ops,
    memory_row,
    node_facts,
    op_status,
)

GIB = 2**30


def facts_of_two_nodes(tmp_path: Path):
    here = node_facts(job_ops(None), tmp_path)
    return [dataclasses.replace(here, host="node1"), dataclasses.replace(here, host="node2")]


def test_this_machine_is_read_as_deepspeed_and_torch_report_it(tmp_path):
    facts = node_facts(job_ops("fused_adam"), tmp_path)
    assert (facts.torch, facts.deepspeed) == (torch.__version__, deepspeed.__version__)
    assert Path(facts.deepspeed_at) == Path(deepspeed.__file__).parent
    assert facts.free_disk > 0 and facts.free_memory > 0
    if not torch.cuda.is_available():
        assert facts.device == "CPU" and list(facts.ops) == ["fused_adam", SHM_OP]
        assert facts.ops[SHM_OP] in ("JIT-built", "buildable")  # DeepSpeed's CPU builder can build it here
        # DeepSpeed's CPU accelerator has no fused LAMB: its builder table says so
        assert op_status("fused_lamb") == "cannot be built: DeepSpeed's cpu accelerator has no fused_lamb op"


def test_node2_with_another_deepspeed_fails_naming_node2_and_node1s_version_and_folder(tmp_path):
    node1, node2 = facts_of_two_nodes(tmp_path)
    node2 = dataclasses.replace(node2, deepspeed="0.19.7", deepspeed_at="/local/pypath/deepspeed")
    rows = {row.check: row for row in environment_rows([node1, node1, node2, node2])}
    assert all(rows[name].passed for name in ("torch", "CUDA", "GPU driver", "DeepSpeed ops"))
    ds = rows["DeepSpeed"]
    assert not ds.passed and ds.nodes == ("node2",)
    assert ds.found.startswith("DeepSpeed 0.19.7 (/local/pypath/deepspeed) on node2; DeepSpeed "
                               f"{deepspeed.__version__} ({node1.deepspeed_at}) on node1")
    assert f"make node2 import DeepSpeed {deepspeed.__version__} from {node1.deepspeed_at} as node1 does" in ds.fix


def test_an_op_that_cannot_be_built_on_one_node_fails_naming_it(tmp_path):
    node1, node2 = facts_of_two_nodes(tmp_path)
    node1 = dataclasses.replace(node1, ops={"fused_adam": "buildable"})
    node2 = dataclasses.replace(node2, ops={"fused_adam": "cannot be built: nvcc not found"})
    row = environment_rows([node1, node2])[-1]
    assert row.check == "DeepSpeed ops" and row.nodes == ("node2",)
    assert row.found == "fused_adam cannot be built: nvcc not found on node2" and "--prebuild-ops" in row.fix


def test_free_memory_is_held_to_node1s_and_to_what_the_steps_took(tmp_path):
    node1, node2 = facts_of_two_nodes(tmp_path)
    gpu1, gpu2 = (dataclasses.replace(n, device="NVIDIA H100 80GB HBM3", free_memory=79 * GIB) for n in (node1, node2))
    assert memory_row([gpu1, gpu2], [30 * GIB, 30 * GIB]).passed
    busy = dataclasses.replace(gpu2, free_memory=40 * GIB)  # another job holds half of node 2's GPU
    row = memory_row([gpu1, busy], None)
    assert not row.passed and row.nodes == ("node2",) and "40.00 GiB free on node2" in row.found
    short = memory_row([gpu1, gpu2], [30 * GIB, 80 * GIB])
    assert not short.passed and short.nodes == ("node2",) and "the job's steps need 80.00 GiB" in short.found
    # on CPU the ranks of a node share its memory: their peaks add up
    cpu = [dataclasses.replace(node1, free_memory=10 * GIB)] * 2
    assert memory_row(cpu, [4 * GIB, 4 * GIB]).passed and not memory_row(cpu, [6 * GIB, 6 * GIB]).passed


def test_free_disk_is_held_to_the_runs_kept_checkpoints(tmp_path):
    node1, node2 = facts_of_two_nodes(tmp_path)
    node2 = dataclasses.replace(node2, free_disk=3 * GIB)
    assert disk_row([node1, node2], None, 2, tmp_path).passed  # no checkpoint saved: nothing to hold it to
    assert disk_row([node1, node2], GIB // 2, 2, tmp_path).passed
    row = disk_row([node1, node2], GIB, 2, tmp_path)
    assert not row.passed and row.nodes == ("node2",) and "--keep-last" in row.fix
