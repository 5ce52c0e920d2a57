"""Training checkpoints on disk: the tags of a run's `checkpoints/` folder, which of them are complete, the one
resolver from a path (a tag, a checkpoints folder, a run folder) to a tag folder, and the checks a tag must pass
before a resume loads any of its files.

Layout of `<output>/checkpoints/`:

    step120/                      DeepSpeed's files (model, experts, ZeRO optimizer partitions)
        rank_00000_state.pt       per rank: data-loader state and RNG states (python, numpy, torch)
        widenet_checkpoint.json   written last, by rank 0, once every rank has finished: the
                                  checkpoint is complete iff this exists (step, model config, the
                                  size and SHA-256 of every other file of the tag, ...;
                                  checkpoint/marker.py)
    latest                        the newest complete tag, replaced atomically

A tag is written as `step120.partial/` and renamed to `step120/` once complete (checkpoint/manager.py), so a
crash or a full disk never leaves a folder that looks like a checkpoint.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from widenet_ds.checkpoint.marker import LATEST_FILE, META_FILE, CheckpointMeta, check_marker
from widenet_ds.errors import CheckpointError
from widenet_ds.fs.checksums import file_problems

TAG = re.compile(r"^step(\d+)$")

PARTIAL = ".partial"  # a tag being written: step120.partial/, renamed to step120/ when complete

MODEL_STATES = "mp_rank_00_model_states.pt"  # the rank-0 file of a DeepSpeed tag folder


def tag_for(step: int) -> str:
    return f"step{step}"


def rank_file(tag_dir: Path, rank: int) -> Path:
    return tag_dir / f"rank_{rank:05d}_state.pt"


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
             if (m := TAG.match(p.name)) and (p / META_FILE).is_file()] if checkpoint_dir.is_dir() else []
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
