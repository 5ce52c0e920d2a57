"""One rank of a preflight: `python -m widenet_ds.launch.preflight_rank pretrain OPTIONS`, started where and as the
job's ranks start (`widenet-ds launch --preflight`, launch/preflight.py, in place of `widenet_ds.train`; `srun` under
`PREFLIGHT=1 sbatch slurm/train.sbatch`), with the job's options. Every rank runs every check; rank 0 prints the
table (launch/preflight_table.py), once, and every rank exits 0 when every check passed, else 2.

The checks, in the table's order: the job's own start-up checks for its shape and run folder (training/plan.py's
`check_plan`, the output folder's lock not taken), every node's environment against node 1's
(launch/preflight_env.py), the collectives on the job's groups (launch/preflight_collectives.py), the output and
data folders (launch/preflight_folders.py), the tiny model against a one-rank run and the job's own steps with a
checkpoint round trip (launch/preflight_steps.py), and the clean-up. A check that fails on one rank fails its row,
naming the node; the others still run, but for those that need what failed (the job's steps need the data on every
node, its checkpoint a shared output folder), which are skipped.

`--reference LAYOUT` is the one-rank run of the tiny steps that rank 0 starts beside itself (launch/preflight_steps.py).
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from widenet_ds.engine.quiet import quiet_third_party

quiet_third_party()  # before DeepSpeed is imported

import torch.distributed as torch_dist  # noqa: E402

from widenet_ds.checkpoint.source import CheckpointSource  # noqa: E402
from widenet_ds.distributed.console import report_error, say  # noqa: E402
from widenet_ds.distributed.every_rank import describe_ranks, rank_hosts  # noqa: E402
from widenet_ds.distributed.groups import barrier, exit_rank, init_distributed, rank0_value  # noqa: E402
from widenet_ds.distributed.launch_env import without_local_rank  # noqa: E402
from widenet_ds.engine.build import optimizer_op  # noqa: E402
from widenet_ds.errors import ConfigError, WideNetError, exit_status, mark_same_on_every_rank  # noqa: E402
from widenet_ds.launch.job_shape import JobShape  # noqa: E402
from widenet_ds.launch.preflight import CHECKED_TASKS  # noqa: E402
from widenet_ds.launch.preflight_collectives import collective_rows, job_groups  # noqa: E402
from widenet_ds.launch.preflight_env import (  # noqa: E402
    disk_row,
    environment_rows,
    job_ops,
    memory_row,
    node_facts,
)
from widenet_ds.launch.preflight_folders import (  # noqa: E402
    SCRATCH_PREFIX,
    cleanup_row,
    data_row,
    listing,
    make_scratch,
    output_row,
    scratch_parent,
)
from widenet_ds.launch.preflight_steps import (  # noqa: E402
    TINY_STEPS,
    TinyLayout,
    job_steps,
    reference_losses,
    routing_row,
    start_reference,
    steps_rows,
    tiny_losses,
)
from widenet_ds.launch.preflight_table import Row, failed, passed, skipped, table_lines, verdict  # noqa: E402
from widenet_ds.tasks import TASKS  # noqa: E402
from widenet_ds.tasks.pretrain.task import PretrainTask  # noqa: E402
from widenet_ds.training.command_line import parse  # noqa: E402
from widenet_ds.training.environment import environment_problems  # noqa: E402
from widenet_ds.training.plan import RunPlan, check_plan  # noqa: E402

PROG = "widenet-ds launch --preflight"


def on_every_rank(work: Callable[[], Any]) -> list[tuple[Any, str | None]]:
    """Collective: `work()` here, then every rank's (result, None) or (None, its error), in rank order."""
    try:
        found = (work(), None)
    except WideNetError as err:
        found = (None, str(err))
    except Exception as err:  # a rank's own failure: its row names it
        found = (None, f"{type(err).__name__}: {str(err).strip()[:400]}")
    everyone: list = [None] * torch_dist.get_world_size()
    torch_dist.all_gather_object(everyone, found)
    return everyone


def errors_of(found: list[tuple[Any, str | None]], hosts: list[str]) -> tuple[str, list[str]]:
    """Every rank's distinct error with the ranks that had it, and their nodes."""
    by_error: dict[str, list[int]] = {}
    for rank, (_, error) in enumerate(found):
        if error is not None:
            by_error.setdefault(error, []).append(rank)
    world = len(found)
    text = "; ".join(error if len(ranks) == world else f"{describe_ranks(ranks, hosts)}: {error}"
                     for error, ranks in by_error.items())
    failing = {hosts[r] for ranks in by_error.values() for r in ranks}
    nodes = [] if all(len(ranks) == world for ranks in by_error.values()) else sorted(failing, key=hosts.index)
    return text, nodes


def settings_row(cfg, init_source_of: Callable[[], CheckpointSource | None], hosts: list[str]
                 ) -> tuple[Row, RunPlan | None]:
    """Collective: the job's own start-up checks for its shape, in its run folder, on every rank."""
    world, rank = torch_dist.get_world_size(), torch_dist.get_rank()

    def plan() -> RunPlan:
        problems = environment_problems(cfg, lock_holder=rank == 0, data=False)
        if problems:
            raise ConfigError("; ".join(problems))
        task = PretrainTask(cfg, cfg.folder, init_source_of())
        return check_plan(cfg, task, world, rank, data_here=not cfg.data_problems())

    found = on_every_rank(plan)
    text, nodes = errors_of(found, hosts)
    if text:
        return failed("start-up checks", text, "the message says what to change (the job's own start-up would refuse "
                                               "it the same way)", nodes), None
    plan = found[rank][0]
    return passed("start-up checks", f"passed on {world} ranks (settings, DeepSpeed JSON and batch, parallel layout, "
                                     f"optimizer, step count{', resume' if plan.resume else ''}): "
                                     f"{plan.optimizer.reason}"), plan


def job_shape(hosts: list[str], cfg, plan: RunPlan) -> JobShape:
    nodes: dict[str, int] = {}
    for host in hosts:
        nodes[host] = nodes.get(host, 0) + 1
    model = plan.model_config
    return JobShape(tuple(nodes.items()), cfg.ep_size, cfg.branch_parallel,
                    model.moe.num_experts if model.is_moe else None,
                    bool(plan.ds.config.get("use_data_before_expert_parallelism", False)))


def preflight(argv: list[str]) -> int:
    """The checks, the table on rank 0, the exit status on every rank."""
    argv = without_local_rank(argv)
    if not argv or argv[0] not in CHECKED_TASKS:
        raise ConfigError(f"the preflight checks {', '.join(CHECKED_TASKS)} jobs, not {argv[0] if argv else 'none'!r}: "
                          f"the model, data and steps of a finetuning or image job depend on its dataset and "
                          f"checkpoint (run that job on a few ranks first)")
    cfg = parse(TASKS[argv[0]].config, argv[1:], prog=f"{PROG} {argv[0]}")
    start = time.monotonic()
    init_distributed(say=say, timeouts_s=(cfg.init_timeout, cfg.train_timeout))
    world, rank = torch_dist.get_world_size(), torch_dist.get_rank()
    hosts = rank_hosts()
    say(f"preflight of {cfg.TASK} on {world} ranks ({describe_ranks(list(range(world)), hosts)}): the start-up checks")
    sources: dict[str, CheckpointSource | None] = {}

    def init_source() -> CheckpointSource | None:  # opened once per rank, its files checked
        if "init" not in sources:
            sources["init"] = (CheckpointSource.open(cfg.init_from, "--init-from") if cfg.init_from is not None
                               else None)
        return sources["init"]

    before = rank0_value(listing(cfg.output_dir) if rank == 0 else None)
    settings, plan = settings_row(cfg, init_source, hosts)
    shape = job_shape(hosts, cfg, plan) if plan is not None else None
    layout = TinyLayout(world, shape.ep_size, shape.num_experts or 4) if shape is not None else None
    reference = start_reference(layout) if rank == 0 and layout is not None else None

    say("the environment of every node")
    ops = job_ops(optimizer_op(plan.ds, plan.optimizer) if plan is not None else None)
    facts = [fact for fact, _ in on_every_rank(lambda: node_facts(ops, scratch_parent(cfg.output_dir)))]

    say("the collectives on the job's groups")
    group = job_groups(shape.ep_size if shape is not None else 1, shape.data_before_experts if shape else False)
    collectives = collective_rows(shape, hosts, group) if shape is not None else [
        *collective_rows(JobShape(((hosts[0], world),)), hosts, group)[:1],
        skipped("all-to-all", "needs the job's settings (start-up checks above)")]

    say("the output and data folders")
    scratch, why = make_scratch(cfg.output_dir)
    output = output_row(cfg.output_dir, scratch, why, hosts)
    data, data_everywhere = data_row(cfg.data, hosts)

    say("a tiny model with the job's layout against one rank")
    if layout is None:
        routing = skipped("expert routing", "needs the job's settings (start-up checks above)")
    else:
        tiny = on_every_rank(lambda: tiny_losses(layout, [rank]))
        text, nodes = errors_of(tiny, hosts)
        routing = None
        if rank == 0:
            try:
                one_rank = reference_losses(reference, cfg.init_timeout)
            except Exception as err:
                routing = failed("expert routing", f"{hosts[0]}: {err}", "the one-rank run of the tiny model failed "
                                 "on node 1: its error says why", [hosts[0]])
            if routing is None:
                routing = (failed("expert routing", text, "see the error", nodes) if text else
                           routing_row(layout, [[tiny[r][0][s][0] for r in range(world)] for s in range(TINY_STEPS)],
                                       one_rank, hosts))
        routing = rank0_value(routing)

    say("the job's own model: a few steps and a checkpoint")
    peaks, checkpoint_bytes = None, None
    # (a wrong all-to-all would exchange wrong split sizes in the job's own dispatch: its steps could hang)
    why_not = ("needs the job's settings (start-up checks above)" if plan is None else
               "needs the data on every node (data folder above)" if not data_everywhere else
               "needs collectives that deliver what was sent (above)" if not all(r.passed for r in collectives)
               else None)
    if why_not is not None:
        steps = [skipped("job's steps", why_not), skipped("checkpoint", why_not)]
    else:
        keep = scratch is not None and output.passed
        with contextlib.ExitStack() as stack:  # without a shared scratch folder: one of each rank's own, saving nothing
            run_dir = (scratch if keep else Path(stack.enter_context(
                tempfile.TemporaryDirectory(prefix=SCRATCH_PREFIX)))) / "run"
            found = on_every_rank(lambda: job_steps(cfg, run_dir, init_source(), checkpoint=keep))
        text, nodes = errors_of(found, hosts)
        if text:
            steps = [failed("job's steps", text, "the error says why (the job's own start would fail the same way)",
                            nodes), skipped("checkpoint", "needs the job's steps")]
        else:
            results = [result for result, _ in found]
            peaks = [r.peak_bytes for r in results]
            checkpoint_bytes = results[0].checkpoint_bytes
            steps = steps_rows(results, plan.model_config, cfg, plan.ds, facts[0].device, hosts)
            if not keep:
                steps.append(skipped("checkpoint", "needs an output folder every node shares (above)"))

    rows = [settings, *environment_rows(facts), memory_row(facts, peaks),
            disk_row(facts, checkpoint_bytes, cfg.keep_last, scratch_parent(cfg.output_dir)), *collectives, output,
            data, routing, *steps, cleanup_row(scratch, cfg.output_dir, before, hosts)]
    if rank == 0:
        print("\n".join([f"{PROG}: {cfg.TASK} on {describe_ranks(list(range(world)), hosts)}", *table_lines(rows),
                         verdict(rows, time.monotonic() - start)]), flush=True)
    barrier()  # the table is out before any rank ends (a launcher ends the others when one exits 2)
    return 0 if all(row.passed for row in rows) else 2


def reference(spec: str) -> int:
    """The one-rank run of the tiny steps: its losses as JSON on stdout."""
    layout = TinyLayout(**json.loads(spec))
    init_distributed()
    print(json.dumps(tiny_losses(layout, list(range(layout.world)))), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--reference"]:
        return reference(argv[1])

    def run() -> int:
        try:
            return preflight(argv)
        except WideNetError as err:  # every rank parses and checks the same command line
            raise mark_same_on_every_rank(err)

    return exit_status(PROG, run, report=report_error)


if __name__ == "__main__":
    exit_rank(main())
