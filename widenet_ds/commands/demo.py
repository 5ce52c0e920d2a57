"""`widenet-ds demo` and `widenet-ds vision-demo`: real small runs end to end on 2 local CPU ranks.

demo: the embedded default corpus prepared (WordPiece 8000, sequences of 128), widenet-tiny-e4 pretrained
with expert parallelism 2, finetuned on SST-2 (the local GLUE copy in $WIDENET_SHARED_DATA/glue/SST-2, else
HF `glue/sst2` when the hub answers, else it stops after pretraining saying what to provide), the scores
printed and an HTML report written. Each setting of --steps and --finetune-steps has its own runs in the folder
(pretrain-<N>steps/, sst2-<M>steps-after-<N>/), each trained over its whole learning-rate schedule: run again with
the same options, it continues where it stopped (--resume); with others, it trains them beside the earlier ones.

vision-demo: widenet-vit-tiny on Fashion-MNIST (Debian's dataset-fashion-mnist; `./launcher.sh vision-demo`
installs it as root), test accuracy printed.

Both need a checkout: the DeepSpeed JSONs are the repository's ds_configs/.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import widenet_ds
from widenet_ds.data.manifest import MANIFEST_FILE, read_manifest
from widenet_ds.data.prepare import cli as prepare_data
from widenet_ds.errors import ConfigError, DataError
from widenet_ds.fs.atomic import atomic_write_json
from widenet_ds.launch.launcher import launch_config
from widenet_ds.model.config import ModelConfig
from widenet_ds.report.cli import cli as write_report
from widenet_ds.run_folder import RunFolder
from widenet_ds.tasks.classify.config import ClassifyConfig
from widenet_ds.tasks.classify.results import ClassifyResults
from widenet_ds.tasks.finetune.results import FinetuneResults
from widenet_ds.tasks.glue.config import GlueConfig
from widenet_ds.tasks.pretrain.config import PretrainConfig
from widenet_ds.training.run_config import LATEST, RunConfig
from widenet_ds.vision.datasets import DEBIAN_FASHION_MNIST, FASHION_MNIST_FIX

CHECKOUT = Path(widenet_ds.__file__).resolve().parents[1]
DS_CONFIGS = CHECKOUT / "ds_configs"
RANKS, EP_SIZE = 2, 2
MODEL_PRESET, VISION_PRESET = "widenet-tiny-e4", "widenet-vit-tiny"
HF_PROBE_SECONDS = 300


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def ds_config(name: str) -> Path:
    path = DS_CONFIGS / name
    if not path.is_file():
        raise ConfigError(f"{path} not found: the demos use the DeepSpeed JSONs of a widenet-ds checkout; run them "
                          f"from one (./launcher.sh demo)")
    return path


def launch_run(cfg: RunConfig) -> int:
    """Train `cfg` on RANKS CPU ranks: the configuration is built (and its values checked) here, the ranks get it
    as the command line that parses back to it."""
    return launch_config(cfg, ranks_per_node=RANKS)


def shared_data() -> Path:
    return Path(os.environ.get("WIDENET_SHARED_DATA") or CHECKOUT.parent / "shared" / "data")


def find_sst2(local: Path) -> tuple[str, str] | None:
    """(--data value, where from) of SST-2: the local GLUE folder, else HF `glue/sst2` when it downloads."""
    if local.is_dir():
        return str(local), str(local)
    say(f"[demo] SST-2 not found at {local}; trying HF datasets glue/sst2")
    probe = "import datasets; datasets.load_dataset('glue', 'sst2', split='validation')"
    try:
        reachable = subprocess.run([sys.executable, "-c", probe], capture_output=True,
                                   timeout=HF_PROBE_SECONDS).returncode == 0
    except subprocess.TimeoutExpired:
        reachable = False
    return ("hf", "HF datasets glue/sst2") if reachable else None


def schedule_for(name: str, steps: int, folder: Path) -> Path:
    """The DeepSpeed JSON `name` with its schedule ending at `steps` (warmup the same share): the repository's
    own file when it already does, else a copy in `folder` (a quick look trains its whole schedule, so that its
    learning rate warms up and decays as in the full demo)."""
    path = ds_config(name)
    config = json.loads(path.read_text())
    params = config["scheduler"]["params"]
    if params["total_num_steps"] == steps:
        return path
    params["warmup_num_steps"] = max(1, params["warmup_num_steps"] * steps // params["total_num_steps"])
    params["total_num_steps"] = steps
    folder.mkdir(parents=True, exist_ok=True)
    scaled = folder / f"{path.stem}-{steps}steps.json"
    atomic_write_json(scaled, config)
    return scaled


def demo(output: Path, steps: int, finetune_steps: int) -> int:
    output = output.resolve()
    # One folder per setting: run again with the same options, a run continues; with others, they get their own
    # runs beside the earlier ones (kept), reusing the prepared data.
    data, pretrain = output / "data", RunFolder(output / f"pretrain-{steps}steps")
    sst2 = RunFolder(output / f"sst2-{finetune_steps}steps-after-{steps}")
    output.mkdir(parents=True, exist_ok=True)
    earlier = sorted(p.name for pattern in ("pretrain-*", "sst2-*") for p in output.glob(pattern)
                     if p.is_dir() and p not in (pretrain.path, sst2.path))
    if earlier:
        say(f"[demo] {output} holds the runs of other settings too ({', '.join(earlier)}): kept; this demo's "
            f"runs are {pretrain.path.name} and {sst2.path.name}")
    if (data / MANIFEST_FILE).is_file():
        # Kept: training the tokenizer again gives another vocabulary (WordPiece training is not deterministic
        # here), and a finished pretraining must go on with the data it learned from.
        say(f"[demo] 1/3 the embedded default corpus is prepared already: {data}")
    else:
        say(f"[demo] 1/3 preparing the embedded default corpus -> {data}")
        status = prepare_data(["--default-corpus", "--tokenizer", "train", "--vocab-size", "8000", "--seq-length",
                               "128", "--output", str(data), "--workers", "2", "--seed", "1"])
        if status:
            return status
    model = output / "model.json"
    ModelConfig.from_preset(MODEL_PRESET, vocab_size=read_manifest(data).vocab_size).to_json(model)

    # A run of this demo that ended at its steps with its results is reused without a launch (the settings' own
    # check, `complete_results`, as `widenet-ds launch` makes it): its ranks would import torch, build the engine and
    # load the last checkpoint only to say so (~20 s of CPU).
    pretraining = PretrainConfig(
        model_config=str(model), deepspeed_config=schedule_for("cpu_small.json", steps, output / "ds_configs"),
        data=data, output_dir=pretrain.path, max_steps=steps, ep_size=EP_SIZE, save_interval=100, eval_interval=100,
        resume=LATEST)
    if pretraining.complete_results() is not None:
        say(f"[demo] 2/3 the pretraining in {pretrain.path} is complete (step {steps}): reused")
    else:
        say(f"[demo] 2/3 pretraining {MODEL_PRESET} on {RANKS} CPU ranks, expert parallel {EP_SIZE}, {steps} steps "
            f"-> {pretrain.path}")
        if status := launch_run(pretraining):
            return status

    local_sst2 = shared_data() / "glue" / "SST-2"
    found = find_sst2(local_sst2)
    if found is not None:
        finetuning = GlueConfig(
            glue_task="sst2", data=found[0], init_from=pretrain.path, tokenizer=str(data), output_dir=sst2.path,
            deepspeed_config=schedule_for("finetune_cpu_small.json", finetune_steps, output / "ds_configs"),
            allow_recipe_mismatch=True,
            max_steps=finetune_steps, max_train_examples=6000, max_seq_length=64, resume=LATEST)
        if finetuning.complete_results() is not None:
            say(f"[demo] 3/3 the SST-2 finetuning in {sst2.path} is complete (step {finetune_steps}): reused")
        else:
            say(f"[demo] 3/3 finetuning on SST-2 ({found[1]}), {finetune_steps} steps -> {sst2.path}")
            if status := launch_run(finetuning):
                return status

    print("\n== widenet-ds demo ==")
    metrics = pretrain.read_metrics()
    train, valid = metrics.series("train/mlm_loss"), metrics.series("valid/mlm_loss")
    first, last = min(train), max(train)
    held_out = f", held-out MLM loss {valid[max(valid)]:.3f}" if valid else ""
    print(f"pretraining ({last} steps, {MODEL_PRESET}, {RANKS} ranks, ep {EP_SIZE}): MLM loss {train[first]:.3f} -> "
          f"{train[last]:.3f}{held_out}")
    if found is not None:
        results = sst2.read_results(FinetuneResults)
        accuracy, majority = results.median["dev"]["acc"], results.baseline["dev"]["acc"]
        print(f"SST-2 dev accuracy {accuracy:.4f} (majority class {majority:.4f})"
              + ("" if accuracy > majority else ": no better than always answering the majority class; more "
                                                 "--finetune-steps learn more (the default 200: about 0.7)"))
    print(f"outputs in {output}", flush=True)

    runs = [pretrain.path] + ([sst2.path] if found is not None else [])
    write_report([*map(str, runs), "--output", str(output / "report"), "--title", "widenet-ds demo"])
    say(f"[demo] open the report: file://{output / 'report' / 'index.html'}")
    if found is None:
        say(f"[demo] skipped the finetuning step: no SST-2 at {local_sst2} and HF datasets glue/sst2 could not be "
            f"downloaded. To finetune, put GLUE's SST-2 folder (train.tsv, dev.tsv) at $WIDENET_SHARED_DATA/glue/SST-2 "
            f"(default ../shared/data beside the checkout), or give this machine access to the HF hub, then run the "
            f"demo again (the finished pretraining is reused).")
    return 0


def vision_demo(output: Path, steps: int) -> int:
    if not DEBIAN_FASHION_MNIST.is_dir():
        raise DataError(f"Fashion-MNIST folder {DEBIAN_FASHION_MNIST} does not exist; {FASHION_MNIST_FIX}.")
    output = output.resolve()
    run = RunFolder(output)
    say(f"[vision-demo] training {VISION_PRESET} on Fashion-MNIST, {RANKS} CPU ranks, expert parallel {EP_SIZE}, "
        f"{steps} steps -> {output}")
    status = launch_run(ClassifyConfig(
        model_config=VISION_PRESET, dataset="fashion-mnist", deepspeed_config=ds_config("vision_cpu_small.json"),
        output_dir=output, ep_size=EP_SIZE, max_steps=steps, save_interval=200, eval_interval=200,
        max_eval_examples=2000, log_interval=50, workers=1, flip=True, resume=LATEST))
    if status:
        return status
    results = run.read_results(ClassifyResults)
    print("\n== widenet-ds vision demo ==")
    print(f"{VISION_PRESET}, {results.step} steps on Fashion-MNIST ({RANKS} ranks, ep {EP_SIZE}): test accuracy "
          f"{results.accuracy:.4f} on the first 2000 test images (chance 0.1)")
    print(f"outputs in {output}", flush=True)
    return 0


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number >= 1")
    return int(text)


def demo_cli(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="widenet-ds demo", description=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", type=Path, default=Path("runs/demo"), metavar="DIR",
                   help="the demo's folder (default: runs/demo)")
    p.add_argument("--steps", type=_positive_int, default=300, metavar="N", help="pretraining steps (default: 300)")
    p.add_argument("--finetune-steps", type=_positive_int, default=200, metavar="N",
                   help="SST-2 finetuning steps (default: 200)")
    args = p.parse_args(argv)
    return demo(args.output, args.steps, args.finetune_steps)


def vision_demo_cli(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="widenet-ds vision-demo", description=__doc__.split("\n\n")[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", type=Path, default=Path("runs/vision-demo"), metavar="DIR",
                   help="the run folder (default: runs/vision-demo)")
    p.add_argument("--steps", type=_positive_int, default=600, metavar="N", help="training steps (default: 600)")
    args = p.parse_args(argv)
    return vision_demo(args.output, args.steps)
