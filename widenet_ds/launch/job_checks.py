"""What `widenet-ds launch` knows of the job before it starts anything, checked with the start-up's own functions:
the ranks it is about to start against the task's --ep-size and --branch-parallel (distributed/layout_checks.py)
and the DeepSpeed JSON's batch against the data-parallel ranks (engine/ds_config.py, `resolve_batch`), each refused
with the option that fixes it; and a finished run asked to --resume, whose scores are said without a rank.

What the launcher cannot read here the ranks' start-up checks, as it checks everything: the model of a checkpoint
(only a preset, a model-config JSON or the model_config.json of a run folder is read here), a JSON on the nodes only,
the rank count of a GPU machine without --num-ranks; and the batch of a resume, whose fix the checkpoint's own
micro-batches decide (training/new_shape.py)."""

from __future__ import annotations

from pathlib import Path

from widenet_ds.distributed.layout_checks import check_layout
from widenet_ds.engine.ds_config import load_ds_config, resolve_batch
from widenet_ds.errors import ConfigError, LaunchError
from widenet_ds.model.config import EncoderConfig, parse_overrides
from widenet_ds.run_folder import RunFolder
from widenet_ds.training.run_config import LATEST, RunConfig


def check_job(cfg: RunConfig, world_size: int | None) -> None:
    """The layout and the batch on `world_size` ranks (None: not known here), before any rank starts."""
    if world_size is None:
        return
    ranks = f"{world_size} rank{'s' if world_size != 1 else ''}"
    model = model_named(cfg)
    if model is not None:
        try:
            check_layout(world_size, cfg.ep_size, cfg.branch_parallel, model)
        except ConfigError as err:
            raise LaunchError(f"the {cfg.TASK} run on {ranks}: {err} {layout_fix(cfg, world_size, model)}") from None
    if world_size % cfg.branch_parallel or resumes(cfg) or not Path(cfg.deepspeed_config).is_file():
        return
    try:
        resolve_batch(load_ds_config(cfg.deepspeed_config), world_size // cfg.branch_parallel)
    except ConfigError as err:
        raise LaunchError(f"the {cfg.TASK} run on {ranks}: {err}") from None


def model_named(cfg: RunConfig) -> EncoderConfig | None:
    """The run's model where the settings name it readably here: a preset or a model-config JSON, or the
    model_config.json a run folder named by --model-config or --init-from holds; with the --set changes. None: the
    model of another checkpoint, or a file that is not here (the ranks read it)."""
    changes = parse_overrides(cfg.overrides)
    named = cfg.model_config
    if named is not None and (named in cfg.MODEL.presets() or Path(named).is_file()):
        return cfg.MODEL.load(named, **changes)
    folder = Path(named) if named is not None else cfg.init_from
    written = RunFolder(folder).model_config_file() if folder is not None and folder.is_dir() else None
    return cfg.MODEL.from_json(written).replace(**changes) if written is not None else None


def layout_fix(cfg: RunConfig, world_size: int, model: EncoderConfig) -> str:
    """The options after `--` that make the layout work on these ranks: the largest --ep-size, else
    --branch-parallel, the start-up accepts (a resume re-lays its checkpoint out for it)."""
    tries = [(ep, cfg.branch_parallel) for ep in range(cfg.ep_size - 1, 0, -1)] + \
            [(cfg.ep_size, bp) for bp in range(cfg.branch_parallel - 1, 0, -1)] + [(1, 1)]
    for ep, bp in tries:
        try:
            check_layout(world_size, ep, bp, model)
        except ConfigError:
            continue
        flags = " ".join(f"--{name} {value}" for name, value, was in (("ep-size", ep, cfg.ep_size),
                                                                      ("branch-parallel", bp, cfg.branch_parallel))
                         if value != was)
        resumed = " (the resume re-lays its checkpoint out for them)" if resumes(cfg) else ""
        return f"To run on these ranks, add `{flags}` after `--`{resumed}."
    return ""


def resumes(cfg: RunConfig) -> bool:
    """The run continues a checkpoint (a bare --resume with nothing saved yet starts anew)."""
    return cfg.resume is not None and (cfg.resume != LATEST or cfg.folder.resumable() is not None)


def complete_line(cfg: RunConfig) -> str | None:
    """The line that says a --resume of a finished run has nothing to train, with its scores (None: it has)."""
    results = cfg.complete_results()
    if results is None:
        return None
    return (f"the {cfg.TASK} run in {cfg.output_dir} is complete: {cfg.results_line(results)}; its results: "
            f"{cfg.folder.results}. No rank started (to train again, choose a new --output-dir).")
