"""The folders of a preflight: the run's output folder, tested through a scratch folder of the preflight's own on the
same file system, and the data folder, read from every node.

The run folder itself is never created, written or locked: the scratch folder goes into it when it exists (the disk
the run writes), else into the nearest existing folder above it, and is removed at the end. Rank 0 writes a file
there that every rank must see (run/run_task.py's `check_shared_output`, the run's own start-up check), and every
rank writes one that rank 0, on node 1, must read back: an `--output-dir` on node-local storage fails here, naming
the nodes that do not share node 1's folder. The data: every rank checks the folder exists and reads its manifest,
its tokenizer's SHA-256 and every shard's size, and the SHA-256 of the shards that fall to it (each shard's once,
spread over the ranks: data/verify.py's checks)."""

from __future__ import annotations

import shutil
import socket
import tempfile
import time
from pathlib import Path

import torch.distributed as torch_dist

from widenet_ds.data.verify import REBUILD, data_folder_problems
from widenet_ds.distributed.every_rank import raise_problems_of_every_rank
from widenet_ds.distributed.groups import all_values, barrier, rank0_value
from widenet_ds.errors import ConfigError, WideNetError
from widenet_ds.launch.preflight_table import Row, failed, passed, skipped
from widenet_ds.run.run_task import check_shared_output

SCRATCH_PREFIX = ".widenet-preflight-"
VISIBLE_WAIT_S = 5.0  # a shared file system may show another node's new file a moment later
SHARED_FIX = ("put --output-dir on storage every node mounts at the same path (a shared file system, e.g. the "
              "checkout's runs/ on a shared home): every rank writes its part of each checkpoint there")


def scratch_parent(output_dir: Path) -> Path:
    """Where the scratch folder goes: the run folder when it exists, else the nearest existing folder above it."""
    path = Path(output_dir).absolute()
    while not path.is_dir():
        path = path.parent
    return path


def make_scratch(output_dir: Path) -> tuple[Path | None, str | None]:
    """Collective: rank 0 creates the scratch folder; on every rank (its path, None) or (None, why not)."""
    made = None
    if torch_dist.get_rank() == 0:
        parent = scratch_parent(output_dir)
        try:
            made = (tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{socket.gethostname()}-", dir=parent), None)
        except OSError as err:
            made = (None, f"{parent} is not writable ({err.strerror})")
    path, why = rank0_value(made)
    return (Path(path) if path else None), why


def listing(folder: Path) -> dict[str, tuple[int, int]] | None:
    """Every file of `folder` but the preflight's (size, modification time); None when there is no folder."""
    if not folder.is_dir():
        return None
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.relative_to(folder).parts[0].startswith(SCRATCH_PREFIX)}


def output_row(output_dir: Path, scratch: Path | None, why: str | None, hosts: list[str]) -> Row:
    """Collective: node 1's file seen by every rank, every rank's file read back on node 1."""
    named = f"--output-dir {output_dir}"
    if scratch is None:
        return failed("output folder", f"{named}: the preflight cannot write near it: {why}",
                      "choose an --output-dir on a disk you can write to")
    rank, world = torch_dist.get_rank(), torch_dist.get_world_size()
    try:
        check_shared_output(scratch, VISIBLE_WAIT_S, named=f"{named} (tested in {scratch})")
        blind = None
    except ConfigError as err:
        blind = str(err).split(". Every rank")[0]
    try:
        (scratch / f"rank-{rank}").write_text(hosts[rank])
        unwritten = None
    except OSError as err:
        unwritten = (rank, f"rank {rank} on {hosts[rank]} cannot write there ({err.strerror})")
    unwritten = all_values(unwritten)
    barrier()
    unread = []
    if rank == 0:
        deadline = time.monotonic() + VISIBLE_WAIT_S
        expected = {r: scratch / f"rank-{r}" for r in range(world) if r not in {u for u, _ in unwritten}}
        while (unseen := [r for r, p in expected.items() if not p.is_file() or p.read_text() != hosts[r]]) and \
                time.monotonic() < deadline:
            time.sleep(0.2)
        unread = unseen
    unread = rank0_value(unread)
    if blind is None and not unwritten and not unread:
        return passed("output folder", f"{named}: node 1's file seen by every rank, every rank's file read back on "
                                       f"{hosts[0]} (in {scratch.parent})")
    bad = sorted({hosts[r] for r, _ in unwritten} | {hosts[r] for r in unread}, key=hosts.index)
    found = [blind] if blind else []
    found += [text for _, text in unwritten]
    found += [f"{hosts[0]} does not see the file of rank {r} on {hosts[r]}" for r in unread]
    return failed("output folder", "; ".join(found), SHARED_FIX, bad)


def data_row(data: Path, hosts: list[str]) -> tuple[Row, bool]:
    """Collective: the data folder on every rank; (its row, whether every rank can read it)."""
    rank, world = torch_dist.get_rank(), torch_dist.get_world_size()
    problems, counts = [], None
    if not data.is_dir():
        problems.append(f"--data {data} does not exist")
    else:
        try:
            listed, counts = data_folder_problems(data, hashes=lambda index: index % world == rank)
            problems += listed
        except WideNetError as err:
            problems.append(str(err))
    missing = [hosts[r] for r in all_values(rank if any("does not exist" in p for p in problems) else None)]
    bad = sorted({hosts[r] for r in all_values(rank if problems else None)}, key=hosts.index)
    try:
        raise_problems_of_every_rank(problems, f"--data {data}")
    except ConfigError as err:
        fix = (f"copy the data folder to {data} on {', '.join(sorted(set(missing), key=hosts.index))}, or put it on "
               f"storage every node mounts at the same path" if missing else REBUILD)
        return failed("data folder", str(err).replace("\n", " "), fix, bad), False
    return passed("data folder", f"--data {data}: {counts['shards']} shards and the tokenizer match the manifest on "
                                 f"every node (each shard's SHA-256 once, over the {world} ranks)"), True


def cleanup_row(scratch: Path | None, output_dir: Path, before: dict | None, hosts: list[str]) -> Row:
    """Collective: the scratch folder removed on node 1 and gone on every node; the run folder as it was."""
    if scratch is None:
        return skipped("clean-up", "no scratch folder was made")
    if torch_dist.get_rank() == 0:
        shutil.rmtree(scratch, ignore_errors=True)
    barrier()
    left = all_values(torch_dist.get_rank() if scratch.exists() else None)
    after = rank0_value(listing(output_dir) if torch_dist.get_rank() == 0 else None)
    changed = after != before
    if not left and not changed:
        state = "as it was" if before is not None else "still not created"
        return passed("clean-up", f"{scratch} removed; --output-dir {output_dir} {state}")
    found = ([f"{scratch} still there on {', '.join(sorted({hosts[r] for r in left}, key=hosts.index))}"] if left
             else []) + ([f"--output-dir {output_dir} changed"] if changed else [])
    return failed("clean-up", "; ".join(found), f"remove {scratch} by hand; report this table",
                  sorted({hosts[r] for r in left}, key=hosts.index))
