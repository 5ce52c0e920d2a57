"""`widenet-ds launch --dry-run [launch options] pretrain -- ARGS`: the job planned in this one process, on any machine
(no GPU, no cluster), with the checks its start-up makes for that shape, and each device's memory; no rank starts and
nothing is written.

The same code as the start-up (training/run.py): the launch options and hostfile (its hosts not resolved: they are
the cluster's), the task's options, the settings and what they name on this machine (`check_run`'s problems), then
`check_plan` for rank 0 of the job's world, which every rank makes alike: the parallel layout (`--ep-size` against
the world), the DeepSpeed JSON and its batch arithmetic for the job's data-parallel ranks, the optimizer on the job's
devices, the step count, the resume. A problem is refused with the start-up's own message.

The task's data may be on the cluster only: a --data folder that is not here is one line of the plan, the model sized
from its settings (the preset's vocabulary) for sequences of --seq-length tokens (default: the model's longest); a
folder that is here is read and checked as the start-up reads it.

Memory, per device (launch/job_memory.py): the weights, gradients, fp32 master weights and optimizer states the
rank's DeepSpeed engine holds, and the activations of a micro-batch's forward and backward, with and without
--activation-checkpointing. The peak is what the engine holds plus the larger of the backward (activations
and DeepSpeed's reduce buckets) and the optimizer step (its fp32 gradient partition); a plan over --device-memory (or
the GPU's, --gpu) is refused with the changes that fit.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, replace

from widenet_ds.checkpoint.source import CheckpointSource
from widenet_ds.engine.ds_config import (
    load_ds_config,
    resolve_batch,
    validate_ds_config,
)
from widenet_ds.engine.memory import Unmodelled
from widenet_ds.errors import ConfigError, LaunchError, raise_config_problems
from widenet_ds.launch.hostfile import check_hostfile
from widenet_ds.launch.job_memory import (
    DeviceMemory,
    device_memory,
    init_fake_world,
    model_states,
    pretraining_activations,
)
from widenet_ds.launch.job_shape import JobShape
from widenet_ds.launch.launcher import MAX_CPU_RANKS
from widenet_ds.launch.options import (
    GPU_MEMORY_GIB,
    PROG,
    LaunchOptions,
    parse_launch_args,
    this_machine,
)
from widenet_ds.launch.task_options import check_task_options, with_saved_settings
from widenet_ds.tasks import TASKS
from widenet_ds.tasks.pretrain.task import PretrainTask
from widenet_ds.training.command_line import parse
from widenet_ds.training.environment import environment_problems
from widenet_ds.training.new_shape import micro_batches_that_fit
from widenet_ds.training.plan import RunPlan, check_plan
from widenet_ds.training.run_config import RunConfig

GIB = 2**30


@dataclass(frozen=True)
class Target:
    """The devices the job's ranks run on."""

    gpus: bool
    name: str | None = None
    memory_gib: float | None = None  # None: not known (no --gpu, no --device-memory)

    def words(self) -> str:
        if not self.gpus:
            return "CPU ranks"
        memory = f" of {self.memory_gib:g} GiB" if self.memory_gib is not None else ""
        return f"{self.name or 'GPU'}s{memory}"


@dataclass(frozen=True)
class JobPlan:
    """What a dry run found: the start-up's plan for rank 0 of the job's world, the job's shape, its devices'
    memory."""

    cfg: RunConfig
    shape: JobShape
    run: RunPlan
    target: Target
    seq_length: int
    data: str                        # the data's line of the plan
    devices: tuple[DeviceMemory, ...] | None  # None: memory not counted for this JSON (`unmodelled` says why)
    activations: dict[bool, int]     # with / without activation checkpointing, at the micro batch
    unmodelled: str | None = None

    @property
    def worst(self) -> DeviceMemory:
        return max(self.devices, key=lambda d: d.peak)


# --- the command line -------------------------------------------------------------------------------------------
def cli(argv: list[str]) -> int:
    """`widenet-ds launch --dry-run ...` (its options: launch/options.py's "dry run" group)."""
    options = parse_launch_args(argv)
    if options.run_config is not None:
        options = with_saved_settings(options)
    dry = options.dry_run
    target = job_target(dry.gpus, dry.gpu, dry.device_memory_gib)
    plan = plan_job(options, target, dry.seq_length)
    print("\n".join(plan_lines(plan)), flush=True)
    check_fits(plan)
    return 0


def job_target(gpus: bool, name: str | None, memory_gib: float | None) -> Target:
    """The job's devices: GPUs when asked for or when this machine has them (named and sized by nvidia-smi)."""
    found_name, found_memory = this_gpu()
    gpus = gpus or found_name is not None
    if name is not None:
        return Target(True, name, memory_gib if memory_gib is not None else GPU_MEMORY_GIB[name])
    return Target(gpus, found_name if gpus else None, memory_gib if memory_gib is not None else found_memory)


def this_gpu() -> tuple[str | None, float | None]:
    """(name, GiB) of this machine's first GPU, from nvidia-smi; (None, None) without one."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None, None
    out = subprocess.run([smi, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True)
    if out.returncode != 0 or not out.stdout.strip():
        return None, None
    name, mib = out.stdout.splitlines()[0].rsplit(",", 1)
    return name.strip(), float(mib) / 1024


# --- the plan ---------------------------------------------------------------------------------------------------
def job_shape(options: LaunchOptions, target: Target) -> tuple[tuple[str, int], ...]:
    """(host, ranks) of each node, as the launcher would start them (a hostfile's hosts are not resolved here)."""
    if options.hostfile is not None:
        slots = check_hostfile(options.hostfile, num_nodes=options.num_nodes, ranks_per_node=options.ranks_per_node,
                               resolve=False)
        return tuple((host, options.ranks_per_node or count) for host, count in slots.items())
    ranks = options.ranks_per_node
    if ranks is None:
        if target.gpus:
            raise LaunchError("give the GPUs of each node: --gpus-per-node G")
        ranks = min(this_machine().cores, MAX_CPU_RANKS)  # as `widenet-ds launch` on this machine
    return JobShape.even(options.num_nodes or 1, ranks).nodes


def plan_job(options: LaunchOptions, target: Target, seq_length: int | None = None) -> JobPlan:
    """Every check of the job's start-up for its shape, then each device's memory; a problem raises its error."""
    nodes = job_shape(options, target)
    world = sum(ranks for _, ranks in nodes)
    check_task_options(options)
    cfg = parse(TASKS[options.task].config, list(options.train_args))
    if cfg.TASK != "pretrain":
        raise LaunchError(f"--dry-run plans pretrain jobs; a {cfg.TASK} run checks its data and model when it starts "
                          f"(its model is sized by its dataset and checkpoint). Run it on a few ranks first.")
    raise_config_problems(cfg.problems() + environment_problems(cfg, data=False), f"the {cfg.TASK} settings")
    missing_data = cfg.data_problems()
    init_source = CheckpointSource.open(cfg.init_from, "--init-from") if cfg.init_from is not None else None
    task = PretrainTask(cfg, cfg.folder, init_source)
    try:
        run = check_plan(cfg, task, world, 0, cuda=target.gpus, data_here=not missing_data)
    except ConfigError as err:
        raise with_batch_fix(err, cfg, world) from None
    model_config = run.model_config
    shape = JobShape(nodes, cfg.ep_size, cfg.branch_parallel, model_config.moe.num_experts if model_config.is_moe
                     else None, bool(run.ds.config.get("use_data_before_expert_parallelism", False)))
    if missing_data:
        seq = seq_length or model_config.max_position_embeddings
        data = (f"--data {cfg.data} is not on this machine (the job's start-up checks it where it runs); sized for "
                f"the model's own vocabulary ({model_config.vocab_size}) and sequences of {seq} tokens "
                + ("(--seq-length)" if seq_length else "(the model's longest: --seq-length N for the data's)"))
    else:
        seq = task.manifest.seq_length
        data = f"--data {cfg.data}: checked ({task.manifest.seq_length}-token sequences, vocabulary " \
               f"{task.manifest.vocab_size})"
    init_fake_world(world)
    try:
        activations = {ac: pretraining_activations(model_config, run.ds, shape, run.ds.batch.micro_batch_size, seq,
                                                   ac, target.gpus) for ac in (False, True)}
        states = model_states(model_config, shape, run.ds, run.optimizer.implementation, target.gpus)
    except Unmodelled as why:
        return JobPlan(cfg, shape, run, target, seq, data, None, {}, str(why))
    plan = JobPlan(cfg, shape, run, target, seq, data, None, activations)
    held = activations[cfg.activation_checkpointing]
    return replace(plan, devices=tuple(device_memory(rank, rank_states, held, target.gpus)
                                       for rank, rank_states in enumerate(states)))


def with_batch_fix(err: ConfigError, cfg: RunConfig, world: int) -> ConfigError:
    """The start-up's refusal, plus the micro batches that fit when the JSON's batch arithmetic is what failed."""
    config = load_ds_config(cfg.deepspeed_config)
    ranks = world // cfg.branch_parallel if world % cfg.branch_parallel == 0 else world
    try:
        resolve_batch(config, ranks)
        return err
    except ConfigError as batch:
        if str(batch) != str(err):  # another check failed (a resume's micro-batches, say, with its own fix)
            return err
    train = config.get("train_batch_size")
    if not isinstance(train, int):
        return err
    fits = micro_batches_that_fit(train, ranks)
    if fits:
        fix = (f" On {ranks} data-parallel ranks train_batch_size {train} takes train_micro_batch_size_per_gpu "
               f"{' or '.join(map(str, fits))} (without gradient_accumulation_steps: DeepSpeed derives it).")
    else:
        fix = (f" train_batch_size {train} does not split over {ranks} ranks: set a multiple of {ranks} (e.g. "
               f"{max(ranks, train - train % ranks)}), or plan a job on a number of ranks that divides {train}.")
    return ConfigError(f"{err}{fix}")


# --- what a user reads ------------------------------------------------------------------------------------------
def gib(size: int) -> str:
    return f"{size / GIB:.2f} GiB" if size >= GIB else f"{size / 2**20:.1f} MiB"


def plural(count: int, word: str) -> str:
    return f"{count} {word}{'s' if count != 1 else ''}"


def span(ranks) -> str:
    ranks = list(ranks)
    if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))


def plan_lines(plan: JobPlan) -> list[str]:
    cfg, shape, run, ds = plan.cfg, plan.shape, plan.run, plan.run.ds
    model, batch = run.model_config, ds.batch
    world = shape.world_size
    sizes = {ranks for _, ranks in shape.nodes}
    per_node = (f"{plural(len(shape.nodes), 'node')} x {plural(sizes.pop(), 'rank')}" if len(sizes) == 1
                else plural(len(shape.nodes), "node"))
    lines = [f"{PROG} --dry-run: {cfg.TASK} on {per_node} = {plural(world, 'rank')}, {plan.target.words()} (no rank "
             f"started, nothing written)",
             f"checks of the job's start-up on {plural(world, 'rank')}: passed (settings, DeepSpeed JSON and batch, "
             f"parallel layout, optimizer, step count{', resume' if run.resume else ''})",
             f"data: {plan.data}",
             "ranks: " + "; ".join(f"{host}: ranks {span(shape.ranks_of(i))}"
                                   for i, (host, _) in enumerate(shape.nodes))]
    if model.is_moe:
        local = len(shape.experts_of(0))
        if shape.ep_size == 1:
            lines.append(f"experts: {model.moe.num_experts} (top-{model.moe.top_k}); --ep-size 1: every rank holds "
                         f"all of them")
        else:
            lines.append(f"experts: {model.moe.num_experts} (top-{model.moe.top_k}); --ep-size {shape.ep_size}: groups "
                         f"of {shape.ep_size} ranks share one copy, each rank holds {local}")
        for group in shape.expert_parallel_groups if shape.ep_size > 1 else ():
            nodes = sorted({shape.node_of(r) for r in group}, key=lambda h: [n for n, _ in shape.nodes].index(h))
            held = ", ".join(f"rank {r}: {span(shape.experts_of(r))}" for r in group)
            lines.append(f"  expert-parallel ranks {span(group)} ({', '.join(nodes)}): {held}")
        if shape.ep_size > 1:
            lines.append("  the same experts on ranks (their gradients averaged, ZeRO partitioned over them): "
                         + " ".join(f"[{span(g)}]" for g in shape.expert_data_parallel_groups))
    if shape.branch_parallel > 1:
        lines.append(f"branch groups (--branch-parallel {shape.branch_parallel}): "
                     + " ".join(f"[{span(g)}]" for g in shape.branch_groups))
    tokens = batch.train_batch_size * plan.seq_length
    lines += [f"batch: train_batch_size {batch.train_batch_size} = micro batch {batch.micro_batch_size} x gradient "
              f"accumulation {batch.gradient_accumulation_steps} x {batch.data_parallel_size} data-parallel ranks; "
              f"{tokens:,} tokens per step ({plan.seq_length} per sequence)",
              f"run: {run.max_steps} steps, ZeRO stage {ds.zero_stage}, {ds.precision}; {run.optimizer.reason}"]
    if run.resume is not None:
        lines.append(f"resume: {run.resume.tag_dir} (step {run.resume.meta.step}) "
                     + (f"{run.new_shape.words()}: {run.new_shape.continuation()}" if run.new_shape
                        else "on its own shape: continues step for step"))
        lines += [f"  changed since the checkpoint (--accept-changed-settings): {c}" for c in run.changes]
    lines += [f"note: {note}" for note in run.notes]
    lines += memory_lines(plan)
    return lines


def memory_lines(plan: JobPlan) -> list[str]:
    if plan.devices is None:
        return [f"memory: not counted: {plan.unmodelled}"]
    ds, worst = plan.run.ds, plan.worst
    states = worst.states
    least = min(d.peak for d in plan.devices)
    spread = ("the same on every rank" if least == worst.peak
              else f"rank {worst.rank} the largest, every rank within {worst.peak - least:,} bytes of it")
    ac = plan.cfg.activation_checkpointing
    micro, seq = ds.batch.micro_batch_size, plan.seq_length
    rows = [("weights", states.weights, f"{ds.precision}" + (", the whole model on each rank" if ds.zero_stage
                                                                  else "")),
            ("gradients", states.gradients, f"{ds.precision}" + (", of the parameters in this rank's ZeRO partition"
                                                                    if ds.zero_stage else "")),
            ("fp32 master weights", states.master_weights, "this rank's partition" if ds.zero_stage else
             ("none: the optimizer updates the weights" if not states.master_weights else "a copy of each weight")),
            ("optimizer states", states.optimizer_states, f"{ds.optimizer_type}'s, in fp32"
             + (", of this rank's partition" if ds.zero_stage else "")),
            ("activations", worst.activations, f"a micro-batch of {micro} x {seq} tokens, "
             + (f"--activation-checkpointing (without: {gib(plan.activations[False])})" if ac
                else f"with --activation-checkpointing: {gib(plan.activations[True])}")),
            ("reduce buckets", worst.reduce_buckets, "DeepSpeed's, during each backward"
             + ("" if worst.reduce_buckets == states.reduce_buckets else
                f" (of {gib(states.reduce_buckets)} reserved, as far as the gradients fill it)")),
            ("step gradients", states.step_gradients, "the optimizer step's fp32 gradient partition")]
    lines = [f"memory per device ({spread}; rank {worst.rank} on {plan.shape.node_of(worst.rank)}):"]
    lines += [f"  {name:<20} {gib(size):>11}  {why}" for name, size, why in rows]
    memory = plan.target.memory_gib
    verdict = ("pass --gpu NAME or --device-memory GIB to check it fits" if memory is None else
               f"of {memory:g} GiB: fits, {gib(int(memory * GIB) - worst.peak)} to spare" if worst.peak <= memory * GIB
               else f"of {memory:g} GiB: does not fit")
    lines.append(f"  {'peak':<20} {gib(worst.peak):>11}  {verdict} (held + the larger of backward and step)")
    return lines


def check_fits(plan: JobPlan) -> None:
    """Refuse a plan whose peak exceeds the device's memory, with each single change that fits."""
    if plan.devices is None or plan.target.memory_gib is None:
        return
    limit = int(plan.target.memory_gib * GIB)
    worst = plan.worst
    if worst.peak <= limit:
        return
    ds, fixes = plan.run.ds, []
    if not plan.cfg.activation_checkpointing:
        peak = replace(worst, activations=plan.activations[True]).peak
        if peak <= limit:
            fixes.append(f"--activation-checkpointing (peak {gib(peak)})")
    dp = ds.batch.data_parallel_size
    for micro in sorted(micro_batches_that_fit(ds.batch.train_batch_size, dp), reverse=True):
        if micro >= ds.batch.micro_batch_size:
            continue
        activations = pretraining_activations(plan.run.model_config, ds, plan.shape, micro, plan.seq_length,
                                              plan.cfg.activation_checkpointing, plan.target.gpus)
        peak = replace(worst, activations=activations).peak
        if peak <= limit:
            fixes.append(f"train_micro_batch_size_per_gpu {micro} in the DeepSpeed JSON (gradient accumulation "
                         f"{ds.batch.train_batch_size // (micro * dp)}; peak {gib(peak)})")
            break
    if ds.zero_stage < 2:
        zero = {**(ds.config.get("zero_optimization") or {}), "stage": 2}
        stage2 = validate_ds_config({**ds.config, "zero_optimization": zero}, world_size=dp,
                                    has_moe=plan.run.model_config.is_moe, cuda_available=plan.target.gpus)
        peak = max(device_memory(d.rank, states, d.activations, plan.target.gpus).peak
                   for d, states in zip(plan.devices, model_states(plan.run.model_config, plan.shape, stage2,
                                                                plan.run.optimizer.implementation, plan.target.gpus)))
        if peak <= limit:
            fixes.append(f"zero_optimization.stage 2 in the DeepSpeed JSON (peak {gib(peak)})")
    fix = ("It fits with " + "; or ".join(fixes) + "." if fixes else
           "No single change fits (activation checkpointing, a smaller micro batch, ZeRO stage 2): combine them, or "
           "plan more ranks (a larger --ep-size holds fewer experts on each).")
    raise ConfigError(f"the job needs {gib(worst.peak)} on the device of rank {worst.rank} "
                      f"({plan.shape.node_of(worst.rank)}), more than its {plan.target.memory_gib:g} GiB. {fix}")
