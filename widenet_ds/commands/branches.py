"""`widenet-ds branches`: compress a checkpoint folder to its first K branches, or expand it to M.

    widenet-ds branches compress runs/pf/model runs/pf/model-k2 --branches 2
    widenet-ds branches expand runs/pf/model runs/pf/model-m4 --branches 4 --seed 0

Both read a portable folder (`widenet-ds convert to-folder`) of any architecture, text or image, and write a
complete one, atomically, with the source's dtype and tokenizer files. A compressed folder computes what the
source computes with `forward(branches=K)`; an expanded one computes the source's outputs with
`forward(branches=N)` (N the old count), and its new branches are a fresh initialisation (seeded). Both load
wherever a folder loads (`load_pretrained`, the trainers' --init-from).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import Tensor

from widenet_ds.data.tokenizer import TokenizerFiles
from widenet_ds.errors import CheckpointError
from widenet_ds.fs.writable import check_output_folder
from widenet_ds.model.config import EncoderConfig
from widenet_ds.portable.branches import check_keep, compress, expand, expanded_config, layout_of
from widenet_ds.portable.format import (
    CONFIG_FILE,
    PortableCheckpoint,
    architecture,
    read_folder,
    read_folder_config,
    save_folder,
    stored_model_config,
)


def fresh_state(architecture_name: str, cfg: EncoderConfig, num_labels: int | None, seed: int) -> dict[str, Tensor]:
    """The global state dict (ep_size 1: experts by global index) of a newly initialised model, seeded
    without touching the caller's random streams."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = architecture(architecture_name).build(cfg, num_labels)
    return model.state_dict()


def _write(source: Path, target: Path, stored: dict, checkpoint: PortableCheckpoint, overwrite: bool) -> Path:
    return save_folder(checkpoint, target, dtype=stored["dtype"], tokenizer=TokenizerFiles.in_folder(source),
                       overwrite=overwrite)


def compress_folder(source: Path, target: Path, k: int, overwrite: bool = False) -> tuple[Path, PortableCheckpoint]:
    stored = read_folder_config(source)  # (read_folder checks it fully, with the weights)
    check_keep(stored_model_config(stored, Path(source) / CONFIG_FILE), k)  # before reading the weights
    checkpoint = read_folder(source)
    old = layout_of(checkpoint.config.to_dict())
    config, state = compress(checkpoint.config.to_dict(), checkpoint.state, k)
    provenance = {**checkpoint.provenance, "compressed_from": str(Path(source).resolve()),
                  "branches": f"the first {k} of {old.num_branches} branches"}
    out = PortableCheckpoint(type(checkpoint.config).from_dict(config), checkpoint.architecture, state,
                             checkpoint.num_labels, provenance)
    return _write(source, target, stored, out, overwrite), out


def expand_folder(source: Path, target: Path, m: int, seed: int = 0,
                  overwrite: bool = False) -> tuple[Path, PortableCheckpoint, list[str]]:
    stored = read_folder_config(source)
    expanded_config(stored_model_config(stored, Path(source) / CONFIG_FILE), m)  # checks m before the weights
    checkpoint = read_folder(source)
    config_type = type(checkpoint.config)
    old = layout_of(checkpoint.config.to_dict())
    new_cfg = config_type.from_dict(expanded_config(checkpoint.config.to_dict(), m))
    fresh = fresh_state(checkpoint.architecture, new_cfg, checkpoint.num_labels, seed)
    expansion = expand(checkpoint.config.to_dict(), checkpoint.state, m, fresh)
    provenance = {**checkpoint.provenance, "expanded_from": str(Path(source).resolve()),
                  "branches": f"{old.num_branches} trained + {m - old.num_branches} new (seed {seed})"}
    out = PortableCheckpoint(config_type.from_dict(expansion.config), checkpoint.architecture, expansion.state,
                             checkpoint.num_labels, provenance)
    return _write(source, target, stored, out, overwrite), out, expansion.new_keys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="widenet-ds branches", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help_, what in (("compress", "keep the first K branches", "K: branches to keep (1..N)"),
                              ("expand", "add fresh branches up to M", "M: the new number of branches (> N)")):
        sub = commands.add_parser(name, help=help_)
        sub.add_argument("source", type=Path, help="a checkpoint folder (widenet-ds convert to-folder)")
        sub.add_argument("output", type=Path, help="the folder to write (written under a temporary name, moved "
                                                   "when complete)")
        sub.add_argument("--branches", type=int, required=True, help=what)
        if name == "expand":
            sub.add_argument("--seed", type=int, default=0, help="seed of the new branches' initialisation")
        sub.add_argument("--overwrite", action="store_true", help="replace an existing output")
    return parser


def cli(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.output.exists() and not args.overwrite:
        raise CheckpointError(f"{args.output} already exists; choose another output or pass --overwrite.")
    if not args.output.exists():
        check_output_folder(args.output, "output", error=CheckpointError)
    if args.command == "compress":
        out, checkpoint = compress_folder(args.source, args.output, args.branches, args.overwrite)
        print(f"wrote {out}: {checkpoint.architecture}, {checkpoint.config.num_branches} branch(es) x "
              f"{checkpoint.config.layers_per_branch} layers ({checkpoint.provenance['branches']})")
    else:
        out, checkpoint, new_keys = expand_folder(args.source, args.output, args.branches, args.seed, args.overwrite)
        cfg = checkpoint.config
        print(f"wrote {out}: {checkpoint.architecture}, {cfg.num_branches} branches x {cfg.layers_per_branch} layers "
              f"({checkpoint.provenance['branches']}; {len(new_keys)} new tensors); train on with --init-from {out} "
              f"and this layout (--set num_branches={cfg.num_branches} --set num_layers={cfg.num_layers})")
    return 0
