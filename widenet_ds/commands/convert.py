"""`widenet-ds convert`: to-folder, reshard, to-shape-free, to-albert, from-albert, to-hf-vit, to-hf, from-hf (docs/checkpoints.md).

Text and image checkpoints alike, except the native HF mappings: ALBERT's for dense text models, ViT's for dense
image ones; `to-hf` / `from-hf` carry any model with its own transformers code (interop/hf_export.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from widenet_ds.checkpoint.reshard import reshard
from widenet_ds.checkpoint.shape_free import (
    STATE_FILE,
    TENSORS_FILE,
    read_shape_free,
    save_shape_free,
)
from widenet_ds.checkpoint.source import CONVERT, CheckpointSource
from widenet_ds.checkpoint.tokenizer_check import (
    check_tokenizer_for_checkpoint,
    checkpoint_tokenizer,
    saved_tokenizer_problem,
)
from widenet_ds.data.tokenizer import TokenizerFiles
from widenet_ds.distributed.layout_checks import check_ep_size
from widenet_ds.errors import CheckpointError
from widenet_ds.fs.disk_space import check_free_space, disk_full_errors
from widenet_ds.fs.run_lock import output_lock
from widenet_ds.fs.writable import check_output_folder
from widenet_ds.interop.albert import from_albert, to_albert
from widenet_ds.interop.hf_export import (
    from_hf,
    hf_weight_files,
    native_alternative,
    read_hf_config,
    write_hf_folder,
)
from widenet_ds.interop.hf_vit import to_hf_vit
from widenet_ds.portable.format import WEIGHTS_FILE, architecture, save_folder
from widenet_ds.training.new_shape import continuation_on

_SOURCE_HELP = ("a checkpoint folder, or a DeepSpeed checkpoint: a tag folder (<output>/checkpoints/step1000), a "
                "checkpoints folder or a run's output folder (then --tag, or the latest complete tag)")


def _checked_tokenizers(args, source: CheckpointSource, vocab_size: int | None) -> tuple[TokenizerFiles, str | None]:
    """The tokenizer files to bundle (--tokenizer, else those saved with the checkpoint), each checked against what
    the checkpoint records; and the recorded (or bundled) tokenizer.json hash for the new folder's provenance."""
    info = checkpoint_tokenizer(source)
    files = TokenizerFiles.named(args.tokenizer, "--tokenizer") if args.tokenizer else source.tokenizer_files()
    if not args.tokenizer and files:
        problem = saved_tokenizer_problem(info)
        if problem:
            raise CheckpointError(f"{problem}. Pass --tokenizer with the data folder the run was trained on.")
    for path in files.paths:
        given = f"--tokenizer {path}" if args.tokenizer else f"the tokenizer saved with the run ({path})"
        check_tokenizer_for_checkpoint(TokenizerFiles((path,)).load(), given, info, vocab_size, given_file=path)
    return files, info.recorded_sha256 or files.sha256()


def _check_output(args) -> None:
    """Before reading any checkpoint: the output must be new (or --overwrite) and creatable."""
    output = Path(args.output)
    if output.exists() and not args.overwrite:
        raise CheckpointError(f"{output} already exists; choose another output or pass --overwrite.")
    if not output.exists():
        check_output_folder(output, "output", error=CheckpointError)


def _add_source(parser: argparse.ArgumentParser, tokenizer: bool = True) -> None:
    parser.add_argument("source", help=_SOURCE_HELP)
    parser.add_argument("output", help="the folder to write (written under a temporary name, moved when complete)")
    parser.add_argument("--tag", help="checkpoint tag, e.g. step1000 (default: the latest complete one)")
    parser.add_argument("--model-config", type=Path,
                        help="model-config JSON, for DeepSpeed checkpoints that do not record theirs")
    if tokenizer:
        parser.add_argument("--tokenizer", action="append", default=[],
                            help="tokenizer.json / vocab.txt (or a folder holding them) to include; default: those "
                                 "saved with the run, if any")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="widenet-ds convert", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    to_folder = commands.add_parser("to-folder", help="DeepSpeed checkpoint -> portable folder (config.json, "
                                                      "model.safetensors, tokenizer, README)")
    _add_source(to_folder)
    to_folder.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32")

    reshard = commands.add_parser("reshard", help="DeepSpeed checkpoint -> one for another ep_size / world size "
                                                  "(model states, and the training state that --resume re-lays out)")
    _add_source(reshard, tokenizer=False)
    reshard.add_argument("--ep-size", type=int, required=True, help="expert parallelism of the new run")
    reshard.add_argument("--world-size", type=int, required=True, help="number of ranks of the new run")
    reshard.add_argument("--model-states-only", action="store_true",
                         help="leave the optimizer state, schedule and data position out (a smaller copy that "
                              "--init-from starts a new run from; the one way to reshard an fp16 run)")

    shape_free = commands.add_parser("to-shape-free", help="training checkpoint (fp32 or bf16, ZeRO 0/1/2) -> its "
                                                           f"training state without layout: {TENSORS_FILE} (every master weight "
                                                           f"and optimizer state tensor whole, experts by global index) "
                                                           f"+ {STATE_FILE} (steps, schedule, loaders)")
    shape_free.add_argument("source", help="a training checkpoint: a tag folder (<output>/checkpoints/step1000), a "
                                           "checkpoints folder or a run's output folder (then --tag, or the latest)")
    shape_free.add_argument("output", help="the folder to write (written under a temporary name, moved when complete)")
    shape_free.add_argument("--tag", help="checkpoint tag, e.g. step1000 (default: the latest complete one)")
    shape_free.add_argument("--overwrite", action="store_true", help="replace an existing output")

    to_albert = commands.add_parser("to-albert", help="dense model -> HF AlbertForPreTraining folder")
    _add_source(to_albert)

    from_albert = commands.add_parser("from-albert", help="HF AlbertForPreTraining folder -> checkpoint folder "
                                                          "(exact), or a WideNet upcycled from it")
    from_albert.add_argument("source", help="HF folder with config.json + model.safetensors")
    from_albert.add_argument("output", help="the checkpoint folder to write")
    from_albert.add_argument("--upcycle-experts", type=int, metavar="E",
                             help="initialise a WideNet with E experts, each ALBERT's FFN plus noise")
    from_albert.add_argument("--upcycle-noise", type=float, default=0.01,
                             help="expert noise std relative to each weight's std (default 0.01)")
    from_albert.add_argument("--seed", type=int, default=0, help="seed of the expert noise and the new router")
    from_albert.add_argument("--overwrite", action="store_true", help="replace an existing output")

    to_hf_vit_parser = commands.add_parser("to-hf-vit", help="dense unshared image model (CLS head, no pre-logits) -> "
                                                             "HF ViTForImageClassification folder")
    _add_source(to_hf_vit_parser, tokenizer=False)

    to_hf_parser = commands.add_parser("to-hf", help="any text or image model -> HF folder with its own model code "
                                                     "(AutoModel... with trust_remote_code=True), tokenizer or image "
                                                     "processor, and a model card")
    _add_source(to_hf_parser)

    from_hf_parser = commands.add_parser("from-hf", help="HF folder written by to-hf (or save_pretrained of its "
                                                         "classes) -> checkpoint folder, weights bit for bit")
    from_hf_parser.add_argument("source", help="HF folder with config.json (model_type widenet or vit_widenet) + "
                                               "model.safetensors, or the shards model.safetensors.index.json names")
    from_hf_parser.add_argument("output", help="the checkpoint folder to write")
    from_hf_parser.add_argument("--overwrite", action="store_true", help="replace an existing output")
    return parser


def _weights_bytes(args, source: CheckpointSource | None) -> int:
    """About what the output takes: the source's weights (their files), at the output's dtype."""
    path = Path(args.source)
    if args.command == "from-hf":  # anything but an HF WideNet folder is refused first, naming the command that fits
        read_hf_config(path)
        size = sum(file.stat().st_size for file in hf_weight_files(path) if file.is_file())
    elif (path / WEIGHTS_FILE).is_file():  # a checkpoint folder, or an HF one (from-albert)
        size = (path / WEIGHTS_FILE).stat().st_size
    elif source is None:
        size = 0  # from-albert of a folder that is not an HF one: from_albert says so
    else:
        files = "*_states.pt" if args.command == "to-shape-free" else "*model_states.pt"  # with the optimizer's
        size = sum(file.stat().st_size for file in source.tag_dir.glob(files))
    return size // 2 if getattr(args, "dtype", "fp32") != "fp32" else size


def cli(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    _check_output(args)
    output = Path(args.output)
    with output_lock(output, f"widenet-ds convert {args.command}") as lock:
        if lock.takeover_message:
            print(f"widenet-ds convert: {lock.takeover_message}", file=sys.stderr)
        source = None
        if args.command not in ("from-albert", "from-hf"):  # opened once: a damaged file is named before anything
            # is read or written (HF folders: from_albert and from_hf name a truncated or foreign file themselves)
            source = CheckpointSource.open(args.source, "source", tag=args.tag, purpose=CONVERT)
        payload, fix = _weights_bytes(args, source), "Free space there, or write the output to another disk."
        check_free_space(output.parent, payload, f"the converted checkpoint {output}", fix)
        with disk_full_errors(output.parent, payload, f"the converted checkpoint {output}", fix):
            return _convert(args, source)


def _convert(args, source: CheckpointSource | None) -> int:
    if args.command == "to-folder":
        checkpoint = source.read_weights(args.model_config)
        tokenizers = TokenizerFiles()
        if architecture(checkpoint.architecture).tokenized:
            tokenizers, tokenizer_sha = _checked_tokenizers(args, source, checkpoint.config.vocab_size)
            if tokenizer_sha:
                checkpoint.provenance["tokenizer_sha256"] = tokenizer_sha
            described = f"tokenizer: {', '.join(p.name for p in tokenizers.paths) or 'none found (pass --tokenizer)'}"
        elif args.tokenizer:
            raise CheckpointError(f"{args.source} holds a {checkpoint.architecture}, an image model: it has no "
                                  f"tokenizer; drop --tokenizer.")
        else:
            described = f"{checkpoint.config.num_classes} classes"
        out = save_folder(checkpoint, Path(args.output), dtype=args.dtype, tokenizer=tokenizers,
                          overwrite=args.overwrite)
        print(f"wrote {out}: {checkpoint.architecture}, step {checkpoint.provenance.get('step')}, {args.dtype}, "
              f"{described}")
    elif args.command == "reshard":
        # what a --resume of the copy will do, or the refusal it would meet, before anything is written
        continues = None
        if not args.model_states_only and args.world_size > 0:
            saved_model = (source.meta.model_config if source.meta else None) or {}
            if saved_model:  # the layout's own refusal is the fix to make first (reshard checks it again)
                experts = (saved_model.get("moe") or {}).get("num_experts") if saved_model.get("ffn") == "moe" else None
                check_ep_size(args.ep_size, args.world_size, experts)
            continues = continuation_on(source, args.world_size)
        out, why_not = reshard(source, Path(args.output), ep_size=args.ep_size, world_size=args.world_size,
                               model_config=args.model_config, overwrite=args.overwrite,
                               model_states_only=args.model_states_only)
        if why_not is None:
            print(f"wrote {out} for ep_size {args.ep_size} on {args.world_size} rank(s), with its training state: "
                  f"--resume {out} {continues}")
        else:
            print(f"wrote {out} for ep_size {args.ep_size} on {args.world_size} rank(s): model states only ({why_not}); "
                  f"a trainer's --init-from {out} starts a new run from them")
    elif args.command == "to-shape-free":
        state = read_shape_free(source)
        out = save_shape_free(state, Path(args.output), overwrite=args.overwrite)
        source = state.scalars["source"]
        print(f"wrote {out}: {len(state.master)} weights with their optimizer states "
              f"({', '.join(sorted(state.optimizer))}), step {state.scalars['global_steps']}, from "
              f"{source['world_size']} rank(s), ep_size {source['ep_size']}, ZeRO {source['zero_stage']}")
    elif args.command == "to-hf-vit":
        out = to_hf_vit(source.read_weights(args.model_config), source, Path(args.output), overwrite=args.overwrite)
        print(f"wrote {out}: transformers.ViTForImageClassification.from_pretrained({str(out)!r}) loads it")
    elif args.command == "to-hf":
        checkpoint = source.read_weights(args.model_config)
        tokenizers = TokenizerFiles()
        if architecture(checkpoint.architecture).tokenized:
            tokenizers = _checked_tokenizers(args, source, checkpoint.config.vocab_size)[0]
        elif args.tokenizer:
            raise CheckpointError(f"{args.source} holds a {checkpoint.architecture}, an image model: it has no "
                                  f"tokenizer; drop --tokenizer.")
        out = write_hf_folder(checkpoint, source, Path(args.output), tokenizer=tokenizers, overwrite=args.overwrite)
        print(f"wrote {out}: transformers' Auto classes load it with trust_remote_code=True (README.md: the model "
              f"card)")
        if (native := native_alternative(checkpoint)) is not None:
            print(f"note: this model is dense; `widenet-ds convert` can also write it as {native}, which needs "
                  f"no remote code")
    elif args.command == "from-hf":
        out = from_hf(Path(args.source), Path(args.output), overwrite=args.overwrite)
        print(f"wrote {out} (weights exact)")
    elif args.command == "to-albert":
        out = to_albert(source.read_weights(args.model_config), source, Path(args.output),
                        tokenizer=_checked_tokenizers(args, source, None)[0], overwrite=args.overwrite)
        print(f"wrote {out}: transformers.AlbertForPreTraining.from_pretrained({str(out)!r}) loads it")
    else:
        out = from_albert(Path(args.source), Path(args.output), upcycle_experts=args.upcycle_experts,
                          noise=args.upcycle_noise, seed=args.seed, overwrite=args.overwrite)
        kind = f"WideNet upcycled to {args.upcycle_experts} experts" if args.upcycle_experts else "exact conversion"
        print(f"wrote {out} ({kind})")
    return 0
