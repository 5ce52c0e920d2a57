"""Training checkpoints: save every N steps, keep the last K, resume exactly.

Layout of `<output>/checkpoints/`:

    step120/                      DeepSpeed's files (model, experts, ZeRO optimizer partitions)
        rank_00000_state.pt       per rank: data-loader state and RNG states (python, numpy, torch)
        widenet_checkpoint.json   written last, by rank 0, once every rank has finished: the
                                  checkpoint is complete iff this exists (step, model config, the
                                  size and SHA-256 of every other file of the tag, ...;
                                  checkpoint/marker.py)
    latest                        the newest complete tag, replaced atomically

A tag is written as `step120.partial/` and renamed to `step120/` once complete, so a crash or a full disk
never leaves a folder that looks like a checkpoint (DeepSpeed's `load_checkpoint(dir, tag)` only joins
`dir/tag/`: the files read the same after the rename). Before writing, rank 0 checks the free space against
the last checkpoint's size (or an estimate from the parameter count); a write that fails on any rank
anyway is removed on every rank and stops the run with one error, the last complete checkpoint intact.
DeepSpeed's own `latest` is written by rank 0 before the other ranks are known to be done and not
atomically, so we save with `save_latest=False` and write it ourselves after the rename.
Old tags are deleted only after the new one is complete.
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from widenet_ds.atomic import atomic_write_text
from widenet_ds.checksums import file_problems, record_files, total_size
from widenet_ds.disk_space import DiskFullError, check_free_space, free_bytes, is_disk_full, mib, needed_bytes
from widenet_ds.errors import CheckpointError, ConfigError, mark_same_on_every_rank
from widenet_ds.checkpoint.format import TEXT_DEFAULT, architecture, is_expert_key
from widenet_ds.checkpoint.marker import LATEST_FILE, META_FILE, CheckpointMeta, check_marker
from widenet_ds.model.config import EncoderConfig
from widenet_ds.runtime.distributed import all_values, barrier, rank0_value

_TAG = re.compile(r"^step(\d+)$")
PARTIAL = ".partial"  # a tag being written: step120.partial/, renamed to step120/ when complete
OPTIMIZER_BYTES_PER_PARAM = 12  # fp32 master weight + two moments (Adam, LAMB), saved by every ZeRO stage
MODEL_STATES = "mp_rank_00_model_states.pt"  # the rank-0 file of a DeepSpeed tag folder


@dataclass
class TrainingState:
    """Counters that continue across a resume."""

    step: int = 0  # optimizer steps done
    samples: int = 0  # training samples consumed over all ranks


def tag_for(step: int) -> str:
    return f"step{step}"


def _rank_file(tag_dir: Path, rank: int) -> Path:
    return tag_dir / f"rank_{rank:05d}_state.pt"


# --- finding and checking checkpoints ---------------------------------------------------------------
def _tags(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()
                  if (p / MODEL_STATES).is_file() and not p.name.endswith(PARTIAL)) if folder.is_dir() else []


def is_deepspeed_checkpoint(source: Path) -> bool:
    """Whether `source` is a DeepSpeed checkpoint as `resolve_tag_dir` reads it: a tag folder, a checkpoints
    folder or a run folder."""
    source = Path(source)
    return any((folder / name).is_file() for folder in (source, source / "checkpoints")
               for name in (MODEL_STATES, META_FILE, LATEST_FILE))


def resolve_tag_dir(source: Path, tag: str | None = None, *, require_marker: bool = True) -> Path:
    """The one checkpoint-tag resolver: `source` is a tag folder, a checkpoints folder or a run's output
    folder; `tag` picks a tag, else the one `latest` names.

    require_marker: training (resume, a new phase) needs a complete widenet-ds checkpoint (marker written
    last); conversion also reads DeepSpeed tag folders of other programs (no marker)."""
    source = Path(source)
    if not source.exists():
        beside = _tags(source.parent)  # a mistyped tag: the ones that exist
        raise CheckpointError(f"checkpoint {source} does not exist" + (f"; the tags in {source.parent}: "
                              f"{', '.join(beside)}" if beside else "") + ".")
    parents = [source, source / "checkpoints"]
    found = None
    if tag is not None:
        found = next((parent / tag for parent in parents if (parent / tag).is_dir()), None)
        if found is None:
            available = sorted({t for parent in parents for t in _tags(parent)})
            raise CheckpointError(f"checkpoint tag {tag!r} does not exist in {source}; available tags: "
                                  f"{', '.join(available) or 'none'}.")
    elif (source / MODEL_STATES).is_file() or (source / META_FILE).is_file():
        found = source
    else:
        for parent in parents:
            if (parent / LATEST_FILE).is_file():
                latest = (parent / LATEST_FILE).read_text().strip()
                if not (parent / latest).is_dir():
                    raise CheckpointError(f"{parent / LATEST_FILE} names tag {latest!r}, which does not exist in "
                                          f"{parent}.")
                found = parent / latest
                break
    if found is None:
        raise CheckpointError(f"no widenet-ds checkpoint at {source}: expected a tag folder holding {META_FILE} "
                              f"(e.g. <output>/checkpoints/step1000) or a checkpoints folder with a '{LATEST_FILE}' "
                              f"file (found tags: {', '.join(sorted({t for p in parents for t in _tags(p)})) or 'none'}).")
    if require_marker:
        check_marker(found)
    return found


def latest_checkpoint(checkpoint_dir: Path) -> Path | None:
    """The complete tag folder `latest` names, or None when the folder holds no checkpoint yet."""
    if not (Path(checkpoint_dir) / LATEST_FILE).is_file():
        return None
    return resolve_tag_dir(checkpoint_dir)


def resume_from(tag_dir: Path) -> str:
    return f"--resume {tag_dir}"


def check_checkpoint_files(tag_dir: Path, meta: CheckpointMeta,
                           use_other: Callable[[Path], str] = resume_from) -> None:
    """Every file the marker records is there, whole and unchanged; a damaged one is named before anything
    loads it (a truncated ZeRO file would otherwise fail inside torch.load on one rank, mid-start-up).
    `use_other(tag_dir)`: how the command at hand takes another tag (--resume, --init-from, --tag)."""
    problems = file_problems(tag_dir, meta.files)
    if problems:
        others = [t for t in complete_tags(Path(tag_dir).parent) if t != Path(tag_dir).name]
        fix = (f"use another checkpoint of the run ({use_other(Path(tag_dir).parent / others[-1])}; complete tags: "
               f"{', '.join(others)})" if others else "restore the files from a copy")
        raise CheckpointError(f"checkpoint {tag_dir} is damaged: {len(problems)} of its {len(meta.files)} files "
                              f"differ from what was written:\n  " + "\n  ".join(problems) + f"\nNothing was loaded; "
                              f"{fix}. `widenet-ds verify` checks a checkpoint without training.")


def complete_tags(checkpoint_dir: Path) -> list[str]:
    """The tags of a checkpoints folder with a marker, oldest first."""
    checkpoint_dir = Path(checkpoint_dir)
    steps = [(int(m.group(1)), p.name) for p in checkpoint_dir.iterdir()
             if (m := _TAG.match(p.name)) and (p / META_FILE).is_file()] if checkpoint_dir.is_dir() else []
    return [name for _, name in sorted(steps)]


def check_resumable(tag_dir: Path, meta: CheckpointMeta) -> None:
    """An exact resume needs the optimizer, schedule, loader and RNG states (a resharded checkpoint keeps them as
    its shape-free state, re-laid out on resume); one resharded with `--model-states-only`, or from a checkpoint
    without them, records that it has model states only."""
    if meta.shape_free_state:
        return
    if not meta.optimizer_states or not any(Path(tag_dir).glob("rank_*_state.pt")):
        raise CheckpointError(f"checkpoint {tag_dir} holds model states only (no optimizer state, LR schedule, "
                              f"data-loader or RNG state: it was written by `widenet-ds convert reshard "
                              f"--model-states-only`, resharded from such a checkpoint, or copied partially), so "
                              f"--resume cannot continue it exactly. Start a new run from its weights with "
                              f"--init-from {tag_dir} (a new optimizer and schedule).")


def config_differences(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    """`field: saved -> current` for every differing model-config field (nested ones dotted)."""
    lines = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key, "<absent>"), current.get(key, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            lines += config_differences(a, b, f"{prefix}{key}.")
        elif a != b:
            lines.append(f"{prefix}{key}: {a!r} (checkpoint) vs {b!r} (this run)")
    return lines


def check_explicit_config(recorded: EncoderConfig, explicit: Path, where: str) -> None:
    """An explicit --model-config may only repeat the config a checkpoint records (`where`): a different
    activation or LayerNorm epsilon keeps every shape, so nothing else would notice the weights are misread."""
    given = type(recorded).from_json(explicit)
    diffs = config_differences(recorded.to_dict(), given.to_dict())
    if diffs:
        raise CheckpointError(f"--model-config {explicit} differs from the model config recorded in {where}:\n  "
                              + "\n  ".join(diffs) + "\nThe recorded config is the one the weights were trained "
                              "with; drop --model-config.")


def check_same_model(saved_config: dict[str, Any], model_config: dict[str, Any], where: Path,
                     architecture_name: str | None = None, ignore: tuple[str, ...] = ()) -> None:
    """Refuse a checkpoint of another model config than this run's, naming the differing fields (but the dotted
    fields in `ignore`)."""
    config_type = architecture(architecture_name or TEXT_DEFAULT, str(Path(where) / META_FILE)).config
    try:  # a model config's fields added since it was written take their defaults (formats.py, "model_config")
        saved = config_type.from_dict(saved_config).to_dict()
    except ConfigError:
        saved = saved_config  # no longer a valid config: compared as stored, the differences name what changed
    diffs = [d for d in config_differences(saved, model_config) if not d.startswith(tuple(f"{f}:" for f in ignore))]
    if diffs:
        raise CheckpointError(f"checkpoint {where} is of another model config; differing fields:\n  "
                              + "\n  ".join(diffs)
                              + "\nUse the checkpoint's model config, or another --output-dir for a new model.")


# --- RNG states -------------------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """Every generator the training step draws from on this rank (MoE gate noise and dropout use
    torch's global generator)."""
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"key": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = state["numpy"]
    np.random.set_state(("MT19937", np_state["key"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


# --- save / load ------------------------------------------------------------------------------------
def estimate_checkpoint_bytes(module: torch.nn.Module, ep_size: int) -> int:
    """A checkpoint's size before the first one is written: each weight in its dtype plus the optimizer's
    fp32 master copy and two moments. This rank's module holds 1/ep_size of the experts."""
    total = 0
    for name, param in module.named_parameters():
        copies = ep_size if is_expert_key(name) else 1
        total += copies * param.numel() * (param.element_size() + OPTIMIZER_BYTES_PER_PARAM)
    return total


class CheckpointManager:
    """Saves and loads complete checkpoints of a DeepSpeed engine plus our per-rank state."""

    def __init__(self, checkpoint_dir: Path, keep_last: int, rank: int, world_size: int) -> None:
        self.checkpoint_dir = Path(checkpoint_dir)
        self.keep_last = keep_last
        self.rank = rank
        self.world_size = world_size
        self.expected_bytes: int | None = None  # the last checkpoint's size (else estimated from the model)

    # -- space -----------------------------------------------------------------------------------------
    def expect(self, engine, ep_size: int, meta: CheckpointMeta | None = None) -> None:
        """What the next checkpoint will take: the resumed one's size, else an estimate from the model."""
        self.expected_bytes = (total_size(meta.files) if meta is not None and meta.files
                               else estimate_checkpoint_bytes(engine.module, ep_size))

    def check_space(self, what: str, fix: str) -> None:
        """Collective: stop every rank with one error when rank 0 finds too little space for a checkpoint."""
        problem = None
        if self.rank == 0 and self.expected_bytes is not None:
            try:
                check_free_space(self.checkpoint_dir, self.expected_bytes, what, fix)
            except DiskFullError as err:
                problem = str(err)
        problem = rank0_value(problem)
        if problem:
            raise mark_same_on_every_rank(DiskFullError(problem))

    def _resume_hint(self) -> str:
        latest = latest_checkpoint(self.checkpoint_dir) if (self.checkpoint_dir / LATEST_FILE).is_file() else None
        # Pruning follows a complete save: a lower --keep-last would free nothing for this one.
        older = [tag for tag in complete_tags(self.checkpoint_dir) if latest is None or tag != latest.name]
        deletable = (f" (deleting the older checkpoints {', '.join(older)} frees some; --keep-last removes them only "
                     f"after a new checkpoint is complete)" if older else "")
        return (f"The last complete checkpoint is {latest}: free at least {mib(needed_bytes(self.expected_bytes or 0))} "
                f"in {self.checkpoint_dir}{deletable}, then continue with --resume."
                if latest else f"No checkpoint of this run is saved yet: free at least "
                               f"{mib(needed_bytes(self.expected_bytes or 0))} in {self.checkpoint_dir} (or choose "
                               f"an --output-dir on a disk with more space) and start the run again.")

    # -- save ------------------------------------------------------------------------------------------
    def save(self, engine, state: TrainingState, loader, meta: CheckpointMeta) -> Path:
        """Collective (all ranks). `meta` (its step and samples set here) is the tag's marker, written last."""
        tag = tag_for(state.step)
        final, partial = self.checkpoint_dir / tag, self.checkpoint_dir / f"{tag}{PARTIAL}"
        if self.rank == 0:
            self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(partial, ignore_errors=True)  # left by an attempt that crashed while writing
        self.check_space(f"the checkpoint of step {state.step}", f"The run stopped at step {state.step} without "
                                                                  f"saving it. {self._resume_hint()}")
        failure = None
        try:
            partial.mkdir(parents=True, exist_ok=True)
            torch.save({"loader": loader.state_dict(), "rng": rng_state(), "step": state.step},
                       _rank_file(partial, self.rank))
        except Exception as err:
            failure = err
        self._agree(failure, partial, state.step)
        try:
            # Ends with a barrier: every rank's files are written when it returns. Its writes hold no
            # collective after the tag check, so a rank whose write failed meets the others at that barrier.
            engine.save_checkpoint(str(self.checkpoint_dir), tag=partial.name, save_latest=False)
        except Exception as err:
            failure = err
            barrier()
        self._agree(failure, partial, state.step)
        if self.rank == 0:
            try:
                files = record_files(partial)
                marker = dataclasses.replace(meta, step=state.step, samples=state.samples,
                                             world_size=self.world_size, files=files)
                marker.write(partial)
                self._move_into_place(partial, final)
                atomic_write_text(self.checkpoint_dir / LATEST_FILE, tag)
                self.expected_bytes = total_size(files)
            except Exception as err:
                failure = err
        self._agree(failure, partial, state.step)
        if self.rank == 0:
            self._prune(current_step=state.step)
        barrier()
        return final

    @staticmethod
    def _move_into_place(partial: Path, final: Path) -> None:
        if final.exists():  # the same step saved by an earlier attempt of this run (resumed from before it)
            old = final.with_name(f"{final.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(partial, final)
            shutil.rmtree(old)
        else:
            os.replace(partial, final)

    def _agree(self, failure: BaseException | None, partial: Path, step: int) -> None:
        """Collective: when the write failed on any rank, remove the partial tag and raise one error on all."""
        problem = None
        if failure is not None:
            full = is_disk_full(failure, self.checkpoint_dir)
            problem = (f"rank {self.rank}: {'the disk is full' if full else 'writing failed'} "
                       f"({type(failure).__name__}: {str(failure).strip()[:300]}; {mib(free_bytes(self.checkpoint_dir))} "
                       f"free)", full)
        problems = all_values(problem)
        if not problems:
            return
        if self.rank == 0:
            shutil.rmtree(partial, ignore_errors=True)
        barrier()
        full = any(is_full for _, is_full in problems)
        listed = "; ".join(text for text, _ in problems)
        cause = (f"there is not enough space in {self.checkpoint_dir} (about "
                 f"{mib(needed_bytes(self.expected_bytes or 0))} needed)" if full else "a rank could not write it")
        error = (DiskFullError if full else CheckpointError)(
            f"the checkpoint of step {step} could not be saved: {cause} [{listed}]. Its partial files were "
            f"removed and the run stopped at step {step}. {self._resume_hint()}")
        raise mark_same_on_every_rank(error)

    def _prune(self, current_step: int) -> None:
        """Keep the newest `keep_last` complete tags up to now; drop older ones, partial ones, and tags
        beyond `current_step` left by an interrupted earlier attempt of this run."""
        tags = []
        for child in self.checkpoint_dir.iterdir():
            match = _TAG.match(child.name.removesuffix(PARTIAL).removesuffix(".old"))
            if match and child.is_dir():
                tags.append((int(match.group(1)), child))
        complete = sorted((step, d) for step, d in tags
                          if step <= current_step and _TAG.match(d.name) and (d / META_FILE).is_file())
        keep = {d for _, d in complete[-self.keep_last:]}
        for _, tag_dir in tags:
            if tag_dir not in keep:
                shutil.rmtree(tag_dir)

    def load(self, engine, tag_dir: Path, meta: CheckpointMeta, loader) -> TrainingState:
        """Collective. Restores engine (weights, optimizer, schedule), loader and RNG of this rank."""
        if meta.world_size != self.world_size:
            raise CheckpointError(f"checkpoint {tag_dir} was written by {meta.world_size} ranks, this run has "
                                  f"{self.world_size}; an exact resume needs the same number of ranks (the data "
                                  f"order and ZeRO partitions depend on it).")
        load_path, _ = engine.load_checkpoint(str(tag_dir.parent), tag=tag_dir.name)
        if load_path is None:
            raise CheckpointError(f"DeepSpeed found no checkpoint files in {tag_dir}.")
        rank_state = torch.load(_rank_file(tag_dir, self.rank), weights_only=True)
        loader.load_state_dict(rank_state["loader"])
        set_rng_state(rank_state["rng"])
        if engine.global_steps != meta.step:
            raise CheckpointError(f"checkpoint {tag_dir}: DeepSpeed restored global step {engine.global_steps}, "
                                  f"our marker says {meta.step}; the checkpoint folder is inconsistent.")
        return TrainingState(step=meta.step, samples=meta.samples)


def load_weights_only(engine, tag_dir: Path) -> None:
    """Start a new phase from another run's weights: no optimizer, schedule, loader or RNG state."""
    engine.load_checkpoint(str(tag_dir.parent), tag=tag_dir.name, load_optimizer_states=False,
                           load_lr_scheduler_states=False, load_module_only=True)
