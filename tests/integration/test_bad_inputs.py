"""A table of bad inputs across every entry and file format.

Each row is one bad input. It must fail with ONE clear error (exit status 2, or the entrypoint's
error) whose message names the problem (the row's pattern), before any training step, and leave every
file of a real earlier run untouched: the earlier run's data folder, pretraining run (with
checkpoints), exported folder and resharded checkpoint are hashed once and compared after every row.

Most rows call the entries' main(argv) in this process (widenet-ds, widenet-ds launch, a preflight's rank, and
`python -m widenet_ds.train` for pretraining, GLUE and SQuAD finetuning and image classification); launcher.sh and
slurm/train.sbatch rows run as subprocesses.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from tests.support.launching import REPO, child_env
from tests.support.pretrain_support import CPU_CONFIG, write_model_config
from widenet_ds.cli import main as widenet_ds
from widenet_ds.errors import WideNetError
from widenet_ds.fs.run_lock import LOCK_FILE, Holder, _process_start
from widenet_ds.launch.preflight_rank import main as preflight_rank
from widenet_ds.run_folder import read_metrics
from widenet_ds.tasks import TASKS
from widenet_ds.train import main as train

pytestmark = pytest.mark.usefixtures("dist")
VISION_CONFIG = REPO / "ds_configs" / "vision_cpu_small.json"


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# --- the earlier run ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def earlier(tmp_path_factory, shared_data, dist):
    """A real earlier run: prepared data, a 2-step pretraining run with a checkpoint, its exported
    folder and a resharded copy; plus inputs the rows share (another tokenizer of the same size)."""
    root = tmp_path_factory.mktemp("earlier")
    books = shared_data / "corpus/books"
    data, run = root / "data", root / "run"
    assert widenet_ds(["prepare-data", "--source", str(books / "pg11.txt"), "--tokenizer", "train", "--vocab-size",
                       "1000", "--seq-length", "64", "--valid-fraction", "0.05", "--output", str(data),
                       "--workers", "1", "--no-progress"]) == 0
    vocab = json.loads((data / "manifest.json").read_text())["vocab_size"]
    model = write_model_config(root / "model.json", vocab_size=vocab)
    assert train(["pretrain", "--model-config", str(model), "--deepspeed_config", str(CPU_CONFIG), "--data",
                  str(data), "--output-dir", str(run), "--max-steps", "2", "--eval-interval", "0",
                  "--no-progress-bar", "--no-tensorboard"]) == 0
    assert widenet_ds(["convert", "to-folder", str(run), str(root / "export")]) == 0
    assert widenet_ds(["convert", "reshard", str(run), str(root / "resharded"), "--ep-size", "1",
                       "--world-size", "1", "--model-states-only"]) == 0
    other = root / "other_tokenizer"  # same vocabulary size, other words
    assert widenet_ds(["train-tokenizer", "--source", str(books / "pg84.txt"), "--vocab-size", str(vocab),
                       "--output", str(other)]) == 0
    # another program at work meanwhile: a process writing a folder (holding its lock), one listening on a port
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    env = {"root": root, "data": data, "run": run, "model": model, "export": root / "export",
           "resharded": root / "resharded", "other_tokenizer": other, "vocab": vocab, "shared": shared_data,
           "bert_vocab": shared_data / "vocab/bert-base-uncased-vocab.txt", "books": books, "writer": writer.pid,
           "busy_port": listener.getsockname()[1]}
    env["digests"] = {name: digest(env[name]) for name in ("data", "run", "export", "resharded")}
    yield env
    listener.close()
    writer.kill()
    writer.wait()


# --- helpers that write one bad input into the row's own folder -----------------------------------
def write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def ds_config(tmp: Path, **changes) -> Path:
    config = json.loads(CPU_CONFIG.read_text())
    for key, value in changes.items():
        if "." in key:
            section, inner = key.split(".", 1)
            config.setdefault(section, {})
            target = config[section]
            for part in inner.split(".")[:-1]:
                target = target.setdefault(part, {})
            target[inner.split(".")[-1]] = value
        else:
            config[key] = value
    return write(tmp / "ds.json", json.dumps(config))


def model_config(env, tmp: Path, **changes) -> Path:
    config = json.loads(env["model"].read_text())
    config.update(changes)
    return write(tmp / "model.json", json.dumps(config))


def other_activation(env) -> str:
    return "gelu" if json.loads(env["model"].read_text())["activation"] == "gelu_new" else "gelu_new"


def data_copy(env, tmp: Path, damage: Callable[[Path], None]) -> Path:
    copy = tmp / "data"
    shutil.copytree(env["data"], copy)
    damage(copy)
    return copy


def run_copy(env, tmp: Path, damage: Callable[[Path], None]) -> Path:
    copy = tmp / "run"
    shutil.copytree(env["run"], copy)
    damage(copy)
    return copy


def forget_data_order(run: Path) -> None:
    """The marker as versions before the global-chunks data order wrote it (format version 1)."""
    marker = run / "checkpoints/step2/widenet_checkpoint.json"
    data = json.loads(marker.read_text())
    del data["data_order"]
    data["format_version"] = 1
    marker.write_text(json.dumps(data))


def unrecord_settings(run: Path) -> None:
    """The marker of a 2-rank run of a version that did not record its DeepSpeed JSON (format version 1)."""
    marker = run / "checkpoints/step2/widenet_checkpoint.json"
    data = json.loads(marker.read_text())
    data.update(world_size=2, deepspeed_config={}, format_version=1)
    marker.write_text(json.dumps(data))
    shutil.copy(run / "checkpoints/step2/rank_00000_state.pt", run / "checkpoints/step2/rank_00001_state.pt")


def older_run_copied_deeper(env, tmp: Path) -> Path:
    """The earlier run as a version before absolute records saved it (its paths as typed in `env["root"]`:
    output_dir "run", data "data"), copied to another depth: a start folder guessed from output_dir's depth
    (tmp/deeper) holds no data."""
    copy = tmp / "deeper" / "copy"
    shutil.copytree(env["run"], copy)
    record = json.loads((copy / "run_config.json").read_text())
    record.update(output_dir="run", data="data")
    (copy / "run_config.json").write_text(json.dumps(record))
    return copy


def marker_says(**entries) -> Callable[[Path], None]:
    """Damage for run_copy: the step2 marker's entries replaced (deepspeed_config's sections merged in)."""
    def damage(run: Path) -> None:
        marker = run / "checkpoints/step2/widenet_checkpoint.json"
        data = json.loads(marker.read_text())
        data["deepspeed_config"].update(entries.pop("deepspeed_config", {}))
        marker.write_text(json.dumps({**data, **entries}))
    return damage


def data_of_other_tokenizer(env, tmp: Path) -> Path:
    """The earlier run's text tokenized with another vocabulary of the same size."""
    data = tmp / "data"
    assert widenet_ds(["prepare-data", "--source", str(env["books"] / "pg11.txt"), "--tokenizer",
                       str(env["other_tokenizer"] / "tokenizer.json"), "--seq-length", "64", "--valid-fraction",
                       "0.05", "--output", str(data), "--workers", "1", "--no-progress"]) == 0
    return data


def held(env, folder: Path, beside: bool = False) -> Path:
    """`folder` with the lock of another live process (`env["writer"]`): inside it, or beside it for outputs
    built elsewhere and moved in (convert, report)."""
    lock = (folder.with_name(f".{folder.name}{LOCK_FILE}") if beside else folder / LOCK_FILE)
    holder = Holder(socket.gethostname(), env["writer"], "2026-01-01 00:00:00", "widenet-ds (another run)",
                    _process_start(env["writer"]))
    write(lock, json.dumps(asdict(holder)))
    return folder


def mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def unrecord(tag_dir: Path) -> None:
    """The marker as versions before checksums wrote it (format version 1)."""
    marker = json.loads((tag_dir / "widenet_checkpoint.json").read_text())
    del marker["files"]
    marker["format_version"] = 1
    write(tag_dir / "widenet_checkpoint.json", json.dumps(marker))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def two_tags_the_latest_truncated(run: Path) -> None:
    """A run with a whole step1 beside its latest tag, step2, whose model states are cut in half."""
    shutil.copytree(run / "checkpoints/step2", run / "checkpoints/step1")
    truncate(run / "checkpoints/step2/mp_rank_00_model_states.pt")


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))


def export_copy(env, tmp: Path, damage: Callable[[Path], None]) -> Path:
    copy = tmp / "export"
    shutil.copytree(env["export"], copy)
    damage(copy)
    return copy


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def flip_token(data: Path) -> None:
    shard = data / "train" / "part-00000.bin"
    tokens = np.fromfile(shard, dtype=np.uint16)
    tokens[len(tokens) // 3] = 7 if tokens[len(tokens) // 3] != 7 else 8
    tokens.tofile(shard)


def hf_folder_of(tmp: Path, model_type: str) -> Path:
    """A real HF folder that transformers itself saved: a tiny ALBERT or BERT (model types from-hf refuses)."""
    import transformers

    dims = dict(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24)
    model = transformers.AlbertForPreTraining(transformers.AlbertConfig(embedding_size=8, **dims)) \
        if model_type == "albert" else transformers.BertForMaskedLM(transformers.BertConfig(**dims))
    model.save_pretrained(tmp / model_type)
    return tmp / model_type


def hf_folder(env, tmp: Path, damage: Callable[[Path], None]) -> Path:
    """The earlier run's export through `convert to-hf`, then damaged."""
    assert widenet_ds(["convert", "to-hf", str(env["export"]), str(tmp / "hf")]) == 0
    damage(tmp / "hf")
    return tmp / "hf"


def as_pickle(hf: Path) -> None:
    """The weights as transformers wrote them before safetensors (save_pretrained(safe_serialization=False))."""
    import torch
    from safetensors.torch import load_file

    torch.save(load_file(hf / "model.safetensors"), hf / "pytorch_model.bin")
    (hf / "model.safetensors").unlink()


def finished_glue(env, tmp: Path) -> Path:
    """A finetuning run of one step, finished (its results.json written)."""
    assert train(["glue", *glue(env, tmp, "--allow-recipe-mismatch", "--max-eval-examples", "8", out=tmp / "done")]) == 0
    return tmp / "done"


def squad(tmp: Path, data, predictions, *extra: str) -> list[str]:
    return ["squad-eval", "--data", str(write(tmp / "dev.json", json.dumps(data))),
            "--predictions", str(write(tmp / "pred.json", json.dumps(predictions))), *extra]


SQUAD_OK = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": "a b c", "qas": [
    {"id": "q1", "question": "what?", "answers": [{"text": "b", "answer_start": 2}]}]}]}]}


def pretrain(env, tmp: Path, *extra: str, ds: Path | None = None, data: Path | None = None,
             model: Path | None = None, out: Path | None = None) -> list[str]:
    return ["--model-config", str(model or env["model"]), "--deepspeed_config", str(ds or CPU_CONFIG),
            "--data", str(data or env["data"]), "--output-dir", str(out or tmp / "out"), "--max-steps", "2",
            "--eval-interval", "0", "--no-progress-bar", "--no-tensorboard", *extra]


def glue(env, tmp: Path, *extra: str, ds: Path | None = None, data: Path | None = None, task: str = "sst2",
         model: tuple[str, str] = ("--model-config", "widenet-tiny-e4"), tokenizer: Path | None = None,
         out: Path | None = None) -> list[str]:
    return ["--task", task, "--data", str(data or env["shared"] / "glue/SST-2"), *model,
            "--tokenizer", str(tokenizer or env["data"]), "--deepspeed_config",
            str(ds or REPO / "ds_configs/finetune_cpu_small.json"), "--output-dir", str(out or tmp / "ft"),
            "--max-steps", "1", *extra]


SENTENCES = "sentence,label\nfine film,1\ndull film,0\n"  # a good CSV of labelled sentences


def own_data(env, tmp: Path, *extra: str, train: str | bytes | None = SENTENCES, train_name: str = "train.csv",
             validation: str | bytes | None = SENTENCES, validation_name: str = "validation.csv") -> list[str]:
    """A text-classification run on files of the row's own (written into its folder; None: no such flag)."""
    files = []
    for flag, content, name in (("--train-file", train, train_name), ("--validation-file", validation,
                                                                      validation_name)):
        if content is not None:
            files += [flag, str(write(tmp / name, content))]
    return [*files, "--text-fields", "sentence", "--model-config", "widenet-tiny-e4", "--tokenizer",
            str(env["bert_vocab"]), "--deepspeed_config", str(REPO / "ds_configs/finetune_cpu_small.json"),
            "--allow-recipe-mismatch", "--output-dir", str(tmp / "ft"), "--max-steps", "1", *extra]


def parquet(rows: list[dict]) -> bytes:
    """`rows` as the bytes of a Parquet file."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buffer)
    return buffer.getvalue()


def files_in(folder: Path, *names: str) -> Path:
    """`folder` holding the files `names`, each of the same labelled sentences."""
    for name in names:
        write(folder / name, SENTENCES)
    return folder


def hf_folder_without_validation(tmp: Path) -> Path:
    write(tmp / "mine" / "train.csv", SENTENCES)  # a folder HF datasets reads: its train split only
    return tmp / "mine"


def classify(env, tmp: Path, *extra: str, out: Path | None = None) -> list[str]:
    return ["--model-config", "widenet-vit-digits", "--dataset", "digits", "--deepspeed-config", str(VISION_CONFIG),
            "--output-dir", str(out or tmp / "out"), "--max-steps", "2", "--workers", "0", "--no-progress-bar",
            "--no-tensorboard", *extra]


# Entries whose every refusal comes before any rank builds a model (some of the others' come from DeepSpeed's own
# checks of its JSON, once the model exists)
REFUSED_BEFORE_THE_MODEL = {"text-classification"}


@dataclass(frozen=True)
class Case:
    id: str
    entry: str                                   # widenet-ds | launch | launcher | a task of the table |
    #                                              preflight (a preflight's rank) | sbatch (slurm/train.sbatch)
    argv: Callable[[dict, Path], list[str]]      # (earlier run, this row's folder) -> arguments
    pattern: str                                 # what the message must say (regex, case-insensitive)
    env: tuple[tuple[str, str], ...] = ()        # environment of the row (a value "{closed_port}": a port nobody serves)
    disk: str | None = None                      # a small real disk of this size, as the row's e["disk"] (tmpfs)
    fill: bool = False                           # ... filled up by another program


C = Case
CASES = [
    # ---- prepare-data: output folders (item 2) and sources (item 10) ----
    C("prepare-output-is-a-run-folder", "widenet-ds", lambda e, t: ["prepare-data", "--source", str(e["books"] / "pg11.txt"),
      "--output", str(e["run"])], r"not a data folder of prepare-data.*new or empty --output"),
    C("prepare-output-is-a-file", "widenet-ds", lambda e, t: ["prepare-data", "--default-corpus", "--output",
      str(write(t / "f", "x"))], r"is a file"),
    C("prepare-output-under-a-file", "widenet-ds", lambda e, t: ["prepare-data", "--default-corpus", "--output",
      str(write(t / "f", "x") / "sub")], r"cannot be created: .*f is a file"),
    C("prepare-missing-source", "widenet-ds", lambda e, t: ["prepare-data", "--source", str(t / "nope.txt"), "--output",
      str(t / "o")], r"nope\.txt.*does not exist"),
    C("prepare-source-scheme", "widenet-ds", lambda e, t: ["prepare-data", "--source", "file:abc", "--output",
      str(t / "o")], r"'file:' is not a kind of source.*local path"),
    C("prepare-source-bad-weight", "widenet-ds", lambda e, t: ["prepare-data", "--source", f"{e['books'] / 'pg11.txt'}:abc",
      "--output", str(t / "o")], r"weight 'abc' is not a number"),
    C("prepare-source-negative-weight", "widenet-ds", lambda e, t: ["prepare-data", "--source",
      f"{e['books'] / 'pg11.txt'}:-1", "--output", str(t / "o")], r"weight must be a positive number"),
    C("prepare-binary-source", "widenet-ds", lambda e, t: ["prepare-data", "--source", str(write(t / "x.txt", bytes(range(256)) * 40)),
      "--output", str(t / "o"), "--no-progress"], r"x\.txt is binary.*not text"),
    C("prepare-gzip-source", "widenet-ds", lambda e, t: ["prepare-data", "--source", str(write(t / "c.txt", b"\x1f\x8b\x08" + b"\x01" * 100)),
      "--output", str(t / "o"), "--no-progress"], r"gzip-compressed.*decompress"),
    C("prepare-non-utf8-source", "widenet-ds", lambda e, t: ["prepare-data", "--source",
      str(write(t / "l.txt", "Caf\xe9 cr\xe8me. Na\xefve.\n\nSoci\xe9t\xe9 g\xe9n\xe9rale.\n".encode("latin-1"))),
      "--output", str(t / "o"), "--no-progress"], r"no usable document.*non-UTF-8.*Convert the file to UTF-8"),
    C("prepare-jsonl-without-text", "widenet-ds", lambda e, t: ["prepare-data", "--source",
      str(write(t / "r.jsonl", '{"body": "One. Two."}\n{"body": "Three. Four."}\n')), "--output", str(t / "o"),
      "--no-progress"], r"without a string 'text' field.*--text-field"),
    C("prepare-malformed-jsonl", "widenet-ds", lambda e, t: ["prepare-data", "--source",
      str(write(t / "m.jsonl", "{not json\n[1, 2\n")), "--output", str(t / "o"), "--no-progress"],
      r"malformed JSON line.*one JSON object"),
    C("prepare-empty-source", "widenet-ds", lambda e, t: ["prepare-data", "--source", str(write(t / "e.txt", "\n \n")),
      "--output", str(t / "o"), "--no-progress"], r"e\.txt is empty"),
    C("prepare-vocab-size-with-tokenizer", "widenet-ds", lambda e, t: ["prepare-data", "--default-corpus", "--tokenizer",
      str(e["bert_vocab"]), "--vocab-size", "8000", "--output", str(t / "o")], r"--vocab-size 8000 only applies to --tokenizer train"),
    C("prepare-missing-tokenizer", "widenet-ds", lambda e, t: ["prepare-data", "--default-corpus", "--tokenizer",
      str(t / "tok.json"), "--output", str(t / "o")], r"tok\.json.*does not exist"),
    C("prepare-tokenizer-without-specials", "widenet-ds", lambda e, t: ["prepare-data", "--default-corpus", "--tokenizer",
      str(write(t / "vocab.txt", "a\nb\nc\n")), "--output", str(t / "o"), "--no-progress"], r"lacks the special tokens"),
    C("prepare-tiny-vocab", "widenet-ds", lambda e, t: ["prepare-data", "--default-corpus", "--vocab-size", "10",
      "--output", str(t / "o"), "--no-progress"], r"--vocab-size 10 is too small"),
    C("prepare-seq-length-too-short", "widenet-ds", lambda e, t: ["prepare-data", "--default-corpus", "--seq-length",
      "8", "--output", str(t / "o"), "--no-progress"], r"--seq-length 8 must be between 32 and 65535 .*leaves 5 tokens"),
    C("prepare-zero-workers", "widenet-ds", lambda e, t: ["prepare-data", "--default-corpus", "--workers", "0",
      "--output", str(t / "o")], r"--workers 0 must be at least 1"),
    C("prepare-zero-dupe-factor", "widenet-ds", lambda e, t: ["prepare-data", "--default-corpus", "--dupe-factor", "0",
      "--output", str(t / "o")], r"--dupe-factor 0 must be at least 1"),
    C("prepare-valid-fraction", "widenet-ds", lambda e, t: ["prepare-data", "--default-corpus", "--valid-fraction", "0.9",
      "--output", str(t / "o")], r"--valid-fraction 0.9 must be in"),
    C("prepare-masking-choice", "widenet-ds", lambda e, t: ["prepare-data", "--default-corpus", "--masking", "both",
      "--output", str(t / "o")], r"invalid choice: 'both'"),
    C("prepare-no-source", "widenet-ds", lambda e, t: ["prepare-data", "--output", str(t / "o")], r"no sources given"),
    C("prepare-changed-settings", "widenet-ds", lambda e, t: ["prepare-data", "--source", str(e["books"] / "pg11.txt"),
      "--tokenizer", "train", "--vocab-size", "1000", "--seq-length", "128", "--output",
      str(data_copy(e, t, lambda d: None)), "--workers", "1", "--no-progress"], r"prepared with other settings.*--overwrite"),
    # ---- verify-data and damaged data folders (item 7) ----
    C("verify-missing-folder", "widenet-ds", lambda e, t: ["verify-data", str(t / "none")], r"does not exist.*prepare-data"),
    C("verify-run-folder", "widenet-ds", lambda e, t: ["verify-data", str(e["run"])],
      r"run is a training run's output folder \(run_config\.json\), not a data folder of `widenet-ds prepare-data`: "
      r"pass the data folder the run trained on \(.*/data\); `widenet-ds verify .*run` checks"),
    C("verify-bit-flip", "widenet-ds", lambda e, t: ["verify-data", str(data_copy(e, t, flip_token))],
      r"train/part-00000\.bin: content does not match its checksum.*Re-run `widenet-ds prepare-data`"),
    C("verify-replaced-tokenizer", "widenet-ds", lambda e, t: ["verify-data", str(data_copy(
      e, t, lambda d: shutil.copy(e["other_tokenizer"] / "tokenizer.json", d / "tokenizer.json")))],
      r"tokenizer\.json: not the tokenizer the shards were built with"),
    C("verify-manifest-not-json", "widenet-ds", lambda e, t: ["verify-data", str(data_copy(
      e, t, lambda d: write(d / "manifest.json", "{oops")))], r"manifest\.json is not valid JSON"),
    # ---- train-tokenizer, model-config, params ----
    C("tokenizer-no-source", "widenet-ds", lambda e, t: ["train-tokenizer", "--output", str(t / "o")],
      r"give at least one --source"),
    C("tokenizer-tiny-vocab", "widenet-ds", lambda e, t: ["train-tokenizer", "--default-corpus", "--vocab-size", "50",
      "--output", str(t / "o")], r"--vocab-size 50 is too small"),
    C("model-config-unknown-preset", "widenet-ds", lambda e, t: ["model-config", "widenet-huge-e99", "--output",
      str(t / "m.json")], r"widenet-huge-e99"),
    C("model-config-bad-set", "widenet-ds", lambda e, t: ["model-config", "widenet-tiny-e4", "--set", "hidden",
      "--output", str(t / "m.json")], r"is not KEY=VALUE"),
    C("model-config-unknown-field", "widenet-ds", lambda e, t: ["model-config", "widenet-tiny-e4", "--set",
      "hiden_size=64", "--output", str(t / "m.json")], r"hiden_size"),
    C("model-config-broken-json", "widenet-ds", lambda e, t: ["model-config", str(write(t / "b.json", "{")),
      "--output", str(t / "m.json")], r"b\.json"),
    C("unknown-command", "widenet-ds", lambda e, t: ["prepare-dta"], r"unknown command 'prepare-dta'"),
    # ---- squad-eval, glue-eval (items 8, 10) ----
    C("squad-data-wrong-shape", "widenet-ds", lambda e, t: squad(t, {"version": "1.1", "data": {"x": 1}}, {}),
      r"'data' is a dict, not a list of articles"),
    C("squad-article-without-paragraphs", "widenet-ds", lambda e, t: squad(t, {"version": "1.1", "data": [{"t": 1}]}, {}),
      r"data\[0\] has no 'paragraphs' list"),
    C("squad-qa-without-id", "widenet-ds", lambda e, t: squad(t, {"version": "1.1", "data": [{"paragraphs": [{"qas": [
      {"question": "q", "answers": []}]}]}]}, {}), r"qas\[0\] has no string 'id'"),
    C("squad-predictions-unknown-ids", "widenet-ds", lambda e, t: squad(t, SQUAD_OK, {"zz1": "b", "zz2": "c"}),
      r"2 of 2 ids are not questions of .*another data file"),
    C("squad-predictions-not-a-mapping", "widenet-ds", lambda e, t: squad(t, SQUAD_OK, ["b"]),
      r"expected a JSON object"),
    C("squad-predictions-not-json", "widenet-ds", lambda e, t: ["squad-eval", "--data", str(write(t / "d.json",
      json.dumps(SQUAD_OK))), "--predictions", str(write(t / "p.json", "{"))], r"p\.json is not valid JSON"),
    C("squad-missing-data", "widenet-ds", lambda e, t: ["squad-eval", "--data", str(t / "none.json"), "--predictions",
      str(write(t / "p.json", "{}"))], r"none\.json: no such file"),
    C("squad-na-prob-for-v11", "widenet-ds", lambda e, t: squad(t, SQUAD_OK, {"q1": "b"}, "--na-prob",
      str(write(t / "na.json", '{"q1": 0.5}'))), r"--na-prob is for SQuAD v2\.0"),
    C("squad-unknown-version", "widenet-ds", lambda e, t: squad(t, {**SQUAD_OK, "version": "3"}, {"q1": "b"}),
      r"unknown SQuAD version '3'"),
    C("glue-predictions-missing", "widenet-ds", lambda e, t: ["glue-eval", "--task", "sst2", "--data",
      str(e["shared"] / "glue/SST-2/dev.tsv"), "--predictions", str(t / "none.tsv")], r"none\.tsv"),
    C("glue-unknown-task", "widenet-ds", lambda e, t: ["glue-eval", "--task", "sst3", "--data",
      str(e["shared"] / "glue/SST-2/dev.tsv"), "--predictions", str(write(t / "p.tsv", "index\tprediction\n0\t1\n"))],
      r"sst3"),
    # ---- convert (items 4, 5, 9) ----
    C("convert-other-tokenizer-same-size", "widenet-ds", lambda e, t: ["convert", "to-folder", str(e["run"]), str(t / "o"),
      "--tokenizer", str(e["other_tokenizer"])], r"other_tokenizer.* is not the tokenizer of the checkpoint .*run"),
    C("convert-tokenizer-other-size", "widenet-ds", lambda e, t: ["convert", "to-folder", str(e["run"]), str(t / "o"),
      "--tokenizer", str(e["bert_vocab"])], r"has 30522 tokens but the checkpoint .* has embeddings for 1000"),
    C("convert-run-tokenizer-replaced", "widenet-ds", lambda e, t: ["convert", "to-folder", str(run_copy(
      e, t, lambda r: shutil.copy(e["other_tokenizer"] / "tokenizer.json", r / "tokenizer.json"))), str(t / "o")],
      r"no tokenizer\.json saved with it has that hash.*--tokenizer"),
    C("convert-model-config-activation", "widenet-ds", lambda e, t: ["convert", "to-folder", str(e["run"]), str(t / "o"),
      "--model-config", str(model_config(e, t, activation=other_activation(e)))],
      r"activation: 'gelu\w*' \(checkpoint\) vs 'gelu\w*' \(this run\).*drop --model-config"),
    C("convert-model-config-eps", "widenet-ds", lambda e, t: ["convert", "to-folder", str(e["export"]), str(t / "o"),
      "--model-config", str(model_config(e, t, layer_norm_eps=1e-5))], r"layer_norm_eps: .*drop --model-config"),
    C("convert-output-exists", "widenet-ds", lambda e, t: ["convert", "to-folder", str(e["run"]), str(e["export"])],
      r"already exists; choose another output or pass --overwrite"),
    C("convert-output-under-a-file", "widenet-ds", lambda e, t: ["convert", "to-folder", str(e["run"]),
      str(write(t / "f", "x") / "o")], r"cannot be created: .*f is a file"),
    C("convert-missing-source", "widenet-ds", lambda e, t: ["convert", "to-folder", str(t / "none"), str(t / "o")],
      r"none does not exist"),
    C("convert-unknown-tag", "widenet-ds", lambda e, t: ["convert", "to-folder", str(e["run"]), str(t / "o"), "--tag",
      "step99"], r"tag 'step99' does not exist.*step2"),
    C("convert-moe-to-albert", "widenet-ds", lambda e, t: ["convert", "to-albert", str(e["export"]), str(t / "o")],
      r"Mixture-of-Experts.*convert to-hf.*to-folder"),
    C("convert-from-albert-not-hf", "widenet-ds", lambda e, t: ["convert", "from-albert", str(e["data"]), str(t / "o")],
      r"has no config\.json"),
    C("convert-from-hf-albert-folder", "widenet-ds", lambda e, t: ["convert", "from-hf", str(hf_folder_of(t, "albert")),
      str(t / "o")], r"is an HF ALBERT folder \(AlbertForPreTraining\).*convert from-albert"),
    C("convert-from-hf-other-model-type", "widenet-ds", lambda e, t: ["convert", "from-hf", str(hf_folder_of(t, "bert")),
      str(t / "o")], r"holds model_type 'bert' \(BertForMaskedLM\), not a WideNet written by `widenet-ds convert to-hf`"),
    C("convert-from-hf-truncated-safetensors", "widenet-ds", lambda e, t: ["convert", "from-hf",
      str(hf_folder(e, t, lambda h: truncate(h / "model.safetensors"))), str(t / "o")],
      r"hf/model\.safetensors is not a readable safetensors file"),
    C("convert-from-hf-pickled-weights", "widenet-ds", lambda e, t: ["convert", "from-hf", str(hf_folder(e, t, as_pickle)),
      str(t / "o")], r"hf has no model\.safetensors .*found pytorch_model\.bin: pickles are refused.*"
                     r"safe_serialization=True"),
    C("convert-from-hf-run-folder", "widenet-ds", lambda e, t: ["convert", "from-hf", str(e["run"]), str(t / "o")],
      r"run is a DeepSpeed checkpoint of a training run, not an HF folder: `widenet-ds convert to-hf .*run OUT`"),
    C("convert-from-hf-portable-folder", "widenet-ds", lambda e, t: ["convert", "from-hf", str(e["export"]),
      str(t / "o")], r"export is a widenet-ds checkpoint folder already.*use it as it is \(--init-from"),
    C("convert-to-hf-other-tokenizer-same-size", "widenet-ds", lambda e, t: ["convert", "to-hf", str(e["run"]),
      str(t / "o"), "--tokenizer", str(e["other_tokenizer"])], r"is not the tokenizer of the checkpoint"),
    C("convert-reshard-fp16-checkpoint", "widenet-ds", lambda e, t: ["convert", "reshard", str(run_copy(
      e, t, marker_says(deepspeed_config={"fp16": {"enabled": True}}))), str(t / "o"), "--ep-size", "1",
      "--world-size", "1"], r"step2 was trained in fp16: fp16's optimizer state includes DeepSpeed's dynamic loss "
                            r"scaler.*pass --model-states-only to reshard its weights alone"),
    C("convert-reshard-for-ranks-no-resume-can-use", "widenet-ds", lambda e, t: ["convert", "reshard", str(e["run"]),
      str(t / "o"), "--ep-size", "1", "--world-size", "3"], r"--world-size 3: checkpoint .*step2 trained 2 "
      r"micro-batch\(es\) of 8 per step \(train_batch_size 16\), which 3 ranks cannot form with any micro batch, so a "
      r"--resume there would be refused\. Reshard for 1 or 2 rank\(s\), or pass --model-states-only"),
    C("convert-marker-version-as-text", "widenet-ds", lambda e, t: ["convert", "to-folder", str(run_copy(
      e, t, marker_says(format_version="3"))), str(t / "o")], r"widenet_checkpoint\.json \(checkpoint marker\) has "
      r"format_version '3', a JSON text, not a whole number, which is no version \(1 to \d\) \(a number written as "
      r"text: a file edited by hand holds format_version 3, without quotes\)"),
    C("convert-marker-not-json", "widenet-ds", lambda e, t: ["convert", "to-folder", str(run_copy(
      e, t, lambda r: write(r / "checkpoints/step2/widenet_checkpoint.json", "{"))), str(t / "o")],
      r"widenet_checkpoint\.json is not valid JSON"),
    C("convert-damaged-pt", "widenet-ds", lambda e, t: ["convert", "to-folder", str(run_copy(
      e, t, lambda r: write(r / "checkpoints/step2/mp_rank_00_model_states.pt", os.urandom(4096)))), str(t / "o")],
      r"step2 is damaged.*mp_rank_00_model_states\.pt: 4,096 bytes, written with [\d,]+ \(truncated\)"),
    C("convert-damaged-pt-of-a-checkpoint-without-checksums", "widenet-ds", lambda e, t: ["convert", "to-folder",
      str(run_copy(e, t, lambda r: (write(r / "checkpoints/step2/mp_rank_00_model_states.pt", os.urandom(4096)),
                                    unrecord(r / "checkpoints/step2")))), str(t / "o")],
      r"refused to read .*mp_rank_00_model_states\.pt"),
    # ---- pretraining (items 6-10) ----
    C("pretrain-resume-resharded", "pretrain", lambda e, t: pretrain(e, t, "--resume", str(e["resharded"])),
      r"holds model states only.*--init-from"),
    # resumes on another shape (here ZeRO 1 -> 0) that cannot continue the run, or not without asking
    C("pretrain-resume-new-shape-other-micro-batch-not-accepted", "pretrain", lambda e, t: pretrain(
      e, t, "--resume", str(e["run"] / "checkpoints/step2"), ds=ds_config(
          t, train_micro_batch_size_per_gpu=4, **{"zero_optimization.stage": 0})),
      r"settings that change it:\n  train_micro_batch_size_per_gpu: 8 -> 4\n.*--accept-changed-settings"),
    C("pretrain-resume-new-shape-other-global-batch", "pretrain", lambda e, t: pretrain(
      e, t, "--resume", str(e["run"] / "checkpoints/step2"), "--accept-changed-settings", ds=ds_config(
          t, train_batch_size=32, **{"zero_optimization.stage": 0})),
      r"trained with train_batch_size 16; on 1 rank, ep 1, ZeRO 0 this run has 32\. A step of another size would take "
      r"other samples.*set train_batch_size 16 .*or start a new run from its weights with --init-from"),
    C("pretrain-resume-new-precision-not-accepted", "pretrain", lambda e, t: pretrain(
      e, t, "--resume", str(e["run"] / "checkpoints/step2"), ds=ds_config(t, bf16={"enabled": True})),
      r"settings that change it:\n  bf16\.enabled: '<absent>' -> True\n.*--accept-changed-settings"),
    C("pretrain-resume-new-shape-fp16-checkpoint", "pretrain", lambda e, t: pretrain(
      e, t, "--resume", str(run_copy(e, t, marker_says(deepspeed_config={"fp16": {"enabled": True}})) /
                            "checkpoints/step2"), "--accept-changed-settings",
      ds=ds_config(t, **{"zero_optimization.stage": 0})),
      r"step2 was trained in fp16: fp16's optimizer state includes DeepSpeed's dynamic loss scaler.*resume on its own "
      r"shape \(1 rank, ep 1, ZeRO 1, fp16\), or start a new run from its weights with --init-from "
      r"(?!.*or continue it in)"),  # (not "or continue it in fp32 or bf16 on another shape": what it refused)
    C("pretrain-resume-new-shape-settings-not-recorded", "pretrain", lambda e, t: pretrain(
      e, t, "--resume", str(run_copy(e, t, unrecord_settings) / "checkpoints/step2")),
      r"step2 does not record its DeepSpeed settings; resume on its own shape \(2 ranks, ep 1, ZeRO 1\)"),
    C("pretrain-resume-new-shape-rank-strided-order", "pretrain", lambda e, t: pretrain(
      e, t, "--resume", str(run_copy(e, t, forget_data_order) / "checkpoints/step2"),
      ds=ds_config(t, **{"zero_optimization.stage": 0})),
      r"rank-strided data order of earlier widenet-ds versions.*cannot continue on 1 rank, ep 1, ZeRO 0: resume "
      r"on its own shape \(1 rank, ep 1, ZeRO 1\), or start a new run from its weights with --init-from"),
    C("pretrain-zero-key-typo", "pretrain", lambda e, t: pretrain(e, t, ds=ds_config(t, **{"zero_optimization.overlap_com": True})),
      r"unknown key 'zero_optimization\.overlap_com'.*Did you mean 'overlap_comm'"),
    C("pretrain-offload-key-typo", "pretrain", lambda e, t: pretrain(e, t, ds=ds_config(
      t, **{"zero_optimization.offload_optimizer.devic": "cpu"})), r"offload_optimizer\.devic'.*Did you mean 'device'"),
    C("pretrain-scheduler-param-typo", "pretrain", lambda e, t: pretrain(e, t, ds=ds_config(
      t, **{"scheduler.params.warmup_num_step": 3})), r"scheduler\.params\.warmup_num_step'.*warmup_num_steps"),
    C("pretrain-optimizer-param-typo", "pretrain", lambda e, t: pretrain(e, t, ds=ds_config(
      t, optimizer={"type": "AdamW", "params": {"lr": 0.02, "weight_decy": 0.01}})), r"weight_decy'.*weight_decay"),
    C("pretrain-lamb-param-typo", "pretrain", lambda e, t: pretrain(e, t, ds=ds_config(t, **{"optimizer.params.bta1": 0.9})),
      r"Lamb has no parameter 'bta1'"),
    C("pretrain-lr-zero", "pretrain", lambda e, t: pretrain(e, t, ds=ds_config(
      t, **{"optimizer.params.lr": 0, "scheduler.params.warmup_max_lr": 0})), r"lr 0 must be a positive number"),
    C("pretrain-negative-clipping", "pretrain", lambda e, t: pretrain(e, t, ds=ds_config(t, gradient_clipping=-1.0)),
      r"gradient_clipping -1\.0 must be a number >= 0"),
    C("pretrain-offload-with-lamb", "pretrain", lambda e, t: pretrain(e, t, ds=ds_config(
      t, zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu"}})), r"offloads the optimizer.*Lamb"),
    C("pretrain-unknown-top-key", "pretrain", lambda e, t: pretrain(e, t, ds=ds_config(t, gradient_cliping=1.0)),
      r"unknown key 'gradient_cliping'.*gradient_clipping"),
    C("pretrain-ds-json-broken", "pretrain", lambda e, t: pretrain(e, t, ds=write(t / "ds.json", '{"a": 1,')),
      r"ds\.json is not valid JSON"),
    C("pretrain-fp16-on-cpu", "pretrain", lambda e, t: pretrain(e, t, ds=ds_config(t, fp16={"enabled": True})),
      r"fp16 needs a CUDA device"),
    C("pretrain-output-is-a-file", "pretrain", lambda e, t: pretrain(e, t, out=write(t / "f", "x")),
      r"f is a file; choose a folder path for --output-dir"),
    C("pretrain-output-under-a-file", "pretrain", lambda e, t: pretrain(e, t, out=write(t / "f", "x") / "out"),
      r"cannot be created: .*f is a file"),
    C("pretrain-checkpoints-is-a-file", "pretrain", lambda e, t: pretrain(e, t, out=write(t / "o" / "checkpoints", "x").parent),
      r"checkpoints is a file, where the run writes"),
    C("pretrain-output-unwritable", "pretrain", lambda e, t: pretrain(e, t, out=Path("/proc/widenet-out")),
      r"/proc/widenet-out is not writable \(/proc: no files can be created there: it is on a virtual file system"),
    C("pretrain-into-earlier-run", "pretrain", lambda e, t: pretrain(e, t, out=e["run"]),
      r"already holds a run \(run_config\.json, results\.json, checkpoints/\); pass --resume"),
    C("pretrain-resume-an-older-run-copied-elsewhere-names-only-what-changed", "pretrain", lambda e, t: pretrain(
      e, t, "--resume", "--seed", "9", out=older_run_copied_deeper(e, t)),
      r"settings that change it:\n  seed: 1234 \(the run in the folder\) vs 9 \(now\)\nThe resumed run"),
    C("pretrain-resume-with-another-seed", "pretrain", lambda e, t: pretrain(e, t, "--resume", "--seed", "9",
      out=run_copy(e, t, lambda r: None)), r"seed: 1234 \(the run in the folder\) vs 9 \(now\).*--accept-changed"),
    C("pretrain-resume-other-model", "pretrain", lambda e, t: pretrain(e, t, "--resume", str(e["run"]),
      model=model_config(e, t, hidden_dropout=0.3)), r"another model config.*hidden_dropout"),
    C("pretrain-damaged-shard", "pretrain", lambda e, t: pretrain(e, t, data=data_copy(e, t, flip_token)),
      r"part-00000\.bin is damaged"),
    C("pretrain-data-is-run-folder", "pretrain", lambda e, t: pretrain(e, t, data=e["run"]),
      r"run is a training run's output folder .*pass the data folder the run trained on"),
    C("pretrain-vocab-mismatch", "pretrain", lambda e, t: pretrain(e, t, model=model_config(e, t, vocab_size=30522)),
      r"vocab_size 30522.*1000"),
    C("pretrain-zero-steps", "pretrain", lambda e, t: pretrain(e, t, "--max-steps", "0"), r"--max-steps must be positive"),
    C("pretrain-resume-a-checkpoint-and-init", "pretrain", lambda e, t: pretrain(
      e, t, "--resume", str(e["run"] / "checkpoints/step2"), "--init-from", str(e["run"])), r"pass only one of them"),
    C("pretrain-resume-changed-lr", "pretrain", lambda e, t: pretrain(e, t, "--resume", str(e["run"]), "--max-steps", "3",
      ds=ds_config(t, **{"optimizer.params.lr": 0.01, "scheduler.params.warmup_max_lr": 0.01})),
      r"optimizer\.params\.lr: 0\.02 -> 0\.01.*--accept-changed-settings"),
    C("pretrain-resume-changed-batch", "pretrain", lambda e, t: pretrain(e, t, "--resume", str(e["run"]), "--max-steps",
      "3", ds=ds_config(t, train_batch_size=32)), r"train_batch_size: 16 -> 32.*no longer be the same run"),
    C("pretrain-init-from-folder-data-of-other-tokenizer", "pretrain", lambda e, t: pretrain(
      e, t, "--init-from", str(e["export"]), data=data_of_other_tokenizer(e, t)),
      r"the tokenizer of --data .*data is not the tokenizer of the checkpoint .*export"),
    C("pretrain-init-from-folder-of-other-model", "pretrain", lambda e, t: pretrain(
      e, t, "--init-from", str(e["export"]), model=model_config(e, t, layer_norm_eps=1e-5)),
      r"export is of another model config.*layer_norm_eps: 1e-12 \(checkpoint\) vs 1e-05 \(this run\)"),
    C("pretrain-model-config-plain-folder", "pretrain", lambda e, t: pretrain(e, t, model=e["data"]),
      r"--model-config .*data is a directory but not a checkpoint"),
    C("pretrain-missing-ds-config", "pretrain", lambda e, t: pretrain(e, t, ds=t / "none.json"), r"none\.json does not exist"),
    # ---- ParaFormer branch layouts, schedules, compression ----
    C("model-config-branches-not-dividing", "widenet-ds", lambda e, t: ["model-config", str(e["model"]), "--set",
      "num_branches=3", "--output", str(t / "m.json")], r"num_branches = 3 must divide num_layers = 4"),
    C("pretrain-prefix-schedule-without-branches", "pretrain", lambda e, t: pretrain(e, t, "--branch-schedule", "prefix",
      ds=ds_config(t, **{"zero_optimization.stage": 0})), r"needs a model with branches.*paraformer"),
    C("pretrain-prefix-schedule-under-zero1", "pretrain", lambda e, t: pretrain(e, t, "--branch-schedule", "prefix",
      model=model_config(e, t, num_branches=2, norm_position="pre")), r"no update of any kind.*stage is 1: set it to 0"),
    C("pretrain-staged-without-stage-steps", "pretrain", lambda e, t: pretrain(e, t, "--branch-schedule", "staged",
      model=model_config(e, t, num_branches=2, norm_position="pre"), ds=ds_config(t, **{"zero_optimization.stage": 0})),
      r"needs --stage-steps"),
    C("branches-compress-model-without-branches", "widenet-ds", lambda e, t: ["branches", "compress", str(e["export"]),
      str(t / "o"), "--branches", "1"], r"no branches \(num_branches = 1\)"),
    # ---- finetuning entrypoints, CLI level ----
    C("glue-missing-data", "glue", lambda e, t: glue(e, t, data=t / "none"), r"none does not exist"),
    C("glue-zero-key-typo", "glue", lambda e, t: glue(e, t, ds=ds_config(t, **{"zero_optimization.stag": 1})),
      r"zero_optimization\.stag'.*Did you mean 'stage'"),
    C("glue-negative-clipping", "glue", lambda e, t: glue(e, t, ds=ds_config(t, gradient_clipping=-2)),
      r"gradient_clipping -2 must be"),
    C("squad-version-choice", "squad", lambda e, t: ["--version", "3.0", "--data", str(t)], r"invalid choice: '3\.0'"),
    C("glue-resume-names-a-checkpoint", "glue", lambda e, t: glue(e, t, "--resume", str(e["run"])),
      r"continues from its own output folder.*--resume without a value"),
    C("glue-resume-a-finished-run-with-more-steps", "glue", lambda e, t: glue(e, t, "--resume", "--max-steps", "3",
      "--allow-recipe-mismatch", "--max-eval-examples", "8", out=finished_glue(e, t)), r"done is complete: each seed trained 1 steps .*--max-steps 3 cannot be applied.*"
                                r"new --output-dir"),
    C("glue-eval-only-of-a-pretraining-checkpoint", "glue", lambda e, t: glue(e, t, "--eval-only", model=(
      "--init-from", str(e["export"]))), r"--eval-only scores trained weights.*"
      r"WideNetForPreTraining, not a WideNetForSequenceClassification"),
    # ---- image classification ----
    C("classify-unknown-dataset", "classify", lambda e, t: classify(e, t, "--dataset", "mnist"),
      r"invalid choice: 'mnist'"),
    C("classify-classes-exceed-the-head", "classify", lambda e, t: classify(e, t, "--set", "num_classes=5"),
      r"has 10 classes, the model's head has 5; set --set num_classes=10"),
    C("classify-channels", "classify", lambda e, t: classify(e, t, "--model-config", "vit-b16"),
      r"1-channel images, the model expects 3; set --set num_channels=1"),
    C("classify-epochs-and-max-steps", "classify", lambda e, t: classify(e, t, "--epochs", "1"),
      r"--epochs and --max-steps both set the run's length; pass one of them"),
    C("classify-cifar-folder-missing", "classify", lambda e, t: classify(e, t, "--dataset", "cifar10", "--data",
      str(t / "cifar"), "--set", "num_classes=10"), r"--data .*cifar does not exist; put torchvision's "
      r"cifar-10-batches-py/ folder \(its data_batch_1, .*, data_batch_5, test_batch\) or cifar-10-python\.tar\.gz "
      r"under --data"),
    C("classify-cifar-without-data", "classify", lambda e, t: classify(e, t, "--dataset", "cifar10",
      "--set", "num_classes=10"), r"--dataset cifar10 needs --data"),
    C("classify-init-from-a-text-folder", "classify", lambda e, t: classify(e, t, "--init-from", str(e["export"])),
      r"WideNetForPreTraining"),
    C("classify-resume-a-text-checkpoint", "classify", lambda e, t: classify(e, t, "--resume", str(e["run"])),
      r"another model config"),
    C("classify-randaugment-not-two-numbers", "classify", lambda e, t: classify(e, t, "--randaugment", "2,x"),
      r"expected two integers OPS,MAGNITUDE"),
    C("classify-randaugment-without-magnitude", "classify", lambda e, t: classify(e, t, "--randaugment", "2"),
      r"'2': expected two integers OPS,MAGNITUDE, e\.g\. 2,15"),
    C("classify-randaugment-magnitude", "classify", lambda e, t: classify(e, t, "--randaugment", "2,40"),
      r"magnitude in 0\.\.30"),
    C("classify-negative-workers", "classify", lambda e, t: classify(e, t, "--workers", "-1"),
      r"--workers must be >= 0"),
    C("classify-ep-size-not-dividing-the-ranks", "classify", lambda e, t: classify(e, t, "--ep-size", "2"),
      r"--ep-size 2 does not divide the 1 rank"),
    C("classify-unknown-model-field", "classify", lambda e, t: classify(e, t, "--set", "hiden_size=32"),
      r"unknown key 'hiden_size'.*hidden_size"),
    C("classify-patch-not-tiling-the-image", "classify", lambda e, t: classify(e, t, "--set", "patch_size=3"),
      r"image_size = 8 is not divisible by patch_size = 3"),
    C("classify-into-earlier-run", "classify", lambda e, t: classify(e, t, out=e["run"]),
      r"already holds a run.*pass --resume"),
    C("classify-branch-parallel-without-branches", "classify", lambda e, t: classify(e, t, "--branch-parallel", "2"),
      r"--branch-parallel 2: the model has one branch.*does not divide the 1 rank"),
    C("classify-ds-json-broken", "classify", lambda e, t: classify(e, t, "--deepspeed-config",
      str(write(t / "ds.json", '{"a": 1,'))), r"ds\.json is not valid JSON"),
    # ---- finetuning on your own labelled texts (text-classification): settings, files, their contents ----
    C("own-data-nothing-to-train-on", "text-classification", lambda e, t: own_data(e, t, train=None, validation=None),
      r"nothing to train on: pass --train-file and --validation-file, a --data folder holding train\.EXT"),
    C("own-data-dataset-and-files", "text-classification", lambda e, t: own_data(e, t, "--dataset", "imdb"),
      r"--dataset reads the HF dataset's own splits; drop --train-file and --validation-file"),
    C("own-data-data-hf", "text-classification", lambda e, t: own_data(e, t, "--data", "hf", train=None,
      validation=None), r"--data hf: name the HF dataset with --dataset NAME\[@CONFIG\] instead"),
    C("own-data-spreadsheet-file", "text-classification", lambda e, t: own_data(e, t, train_name="train.xlsx"),
      r"--train-file .*train\.xlsx: \.xlsx is no format this task reads; save it as \.csv, \.tsv, \.jsonl"),
    C("own-data-label-among-the-texts", "text-classification", lambda e, t: own_data(e, t, "--label-field",
      "sentence"), r"--label-field sentence is also one of --text-fields"),
    C("own-data-three-text-fields", "text-classification", lambda e, t: own_data(e, t, "--text-fields", "a,b,c"),
      r"--text-fields: 'a,b,c': expected one field name, or two different ones for a pair"),
    C("own-data-train-file-missing", "text-classification", lambda e, t: own_data(e, t, "--train-file",
      str(t / "none.csv")), r"--train-file .*none\.csv does not exist"),
    C("own-data-folder-without-validation", "text-classification", lambda e, t: own_data(e, t, "--data",
      str(write(t / "d" / "train.csv", SENTENCES).parent), train=None, validation=None),
      r"no validation file: pass --validation-file, or a --data folder holding validation\.EXT or dev\.EXT"),
    C("own-data-folder-with-two-training-files", "text-classification", lambda e, t: own_data(e, t, "--data", str(
      files_in(t / "d", "train.csv", "train.jsonl", "dev.csv")), train=None, validation=None),
      r"--data .*d holds train\.csv and train\.jsonl: pass --train-file to choose one"),
    C("own-data-data-is-a-file", "text-classification", lambda e, t: own_data(e, t, "--data", str(write(
      t / "all.csv", SENTENCES)), train=None, validation=None), r"--data .*all\.csv is a file; pass it as --train-file"),
    C("own-data-missing-text-field", "text-classification", lambda e, t: own_data(e, t, "--text-fields", "text"),
      r"train\.csv has no field 'text'; its fields: sentence, label\. Name the text and label fields with "
      r"--text-fields"),
    C("own-data-missing-label-field-in-validation", "text-classification", lambda e, t: own_data(
      e, t, validation="sentence,sentiment\nfine,1\n"),
      r"validation\.csv has no field 'label'; its fields: sentence, sentiment\. .*with --label-field"),
    C("own-data-validation-label-training-never-saw", "text-classification", lambda e, t: own_data(
      e, t, train="sentence,label\na,positive\nb,negative\n", validation="sentence,label\na,positive\nb,neutral\n"),
      r"validation\.csv: label\(s\) 'neutral' \(line 3\) never appear in the training file .*train\.csv, so the "
      r"model has no class for them \(its classes: negative, positive\)"),
    C("own-data-empty-file", "text-classification", lambda e, t: own_data(e, t, train=""),
      r"train\.csv is empty; pass a file with a header and labelled rows"),
    C("own-data-header-only", "text-classification", lambda e, t: own_data(e, t, validation="sentence,label\n"),
      r"validation\.csv holds no examples \(a header only\)"),
    C("own-data-labels-mixing-numbers-and-text", "text-classification", lambda e, t: own_data(
      e, t, train="sentence,label\na,1\nb,positive\nc,0\n"),
      r"train\.csv: the label field 'label' mixes numbers \(line 2: 1\) and text \(line 3: 'positive'\)"),
    C("own-data-latin-1-file", "text-classification", lambda e, t: own_data(
      e, t, train="sentence,label\nfine,1\ncaf\u00e9 film,0\n".encode("latin-1")),
      r"train\.csv is not UTF-8 text: line 3 holds the byte 0xe9.*Convert it to UTF-8: iconv -f latin1 -t utf8 "
      r".*train\.csv > .*train\.utf8\.csv"),
    C("own-data-utf-16-file", "text-classification", lambda e, t: own_data(e, t, train=SENTENCES.encode("utf-16")),
      r"train\.csv is not UTF-8 text.*UTF-16 .*iconv -f utf16 -t utf8"),
    C("own-data-one-class", "text-classification", lambda e, t: own_data(e, t, train="sentence,label\na,1\nb,1\n",
      validation="sentence,label\na,1\n"), r"train\.csv: every label is '1'; a classifier needs examples of two"),
    C("own-data-scores-as-classes", "text-classification", lambda e, t: own_data(
      e, t, train="sentence,label\na,3.8\nb,1\n"),
      r"the labels are numbers with fractions \(line 2: 3\.8\), scores rather than classes; pass --regression"),
    C("own-data-regression-of-class-names", "text-classification", lambda e, t: own_data(
      e, t, "--regression", train="sentence,label\na,good\nb,bad\n"),
      r"--regression predicts numbers, but the labels are text \(line 2: 'good'\); drop --regression"),
    C("own-data-csv-row-with-an-unquoted-comma", "text-classification", lambda e, t: own_data(
      e, t, train="sentence,label\nfine,1\nlong, dull film,0\n"),
      r"train\.csv, line 3: 3 fields where the header \(line 1\) has 2; quote a field that holds commas"),
    C("own-data-header-naming-a-column-twice", "text-classification", lambda e, t: own_data(
      e, t, train="sentence,label,label\nfine,1,0\n"), r"train\.csv, line 1: the header names 'label' twice"),
    C("own-data-rows-without-a-label", "text-classification", lambda e, t: own_data(
      e, t, train="sentence,label\nfine,1\ndull, \nok,0\n"),
      r"train\.csv: 1 row\(s\) without a label in 'label' \(line 3\); label every example"),
    C("own-data-json-lines-not-json", "text-classification", lambda e, t: own_data(
      e, t, train='{"sentence": "fine", "label": 1}\n{"sentence": "dull", label: 0}\n', train_name="train.jsonl"),
      r"train\.jsonl, line 2: not JSON \(Expecting property name"),
    C("own-data-json-lines-not-objects", "text-classification", lambda e, t: own_data(
      e, t, train='["fine", 1]\n', train_name="train.jsonl"), r"train\.jsonl, line 1: a JSON list, not an object"),
    C("own-data-parquet-not-parquet", "text-classification", lambda e, t: own_data(e, t, train_name="train.parquet"),
      r"train\.parquet cannot be read as Parquet"),
    C("own-data-text-field-of-numbers", "text-classification", lambda e, t: own_data(e, t, train=parquet(
      [{"sentence": 5, "label": "a"}, {"sentence": 6, "label": "b"}]), train_name="train.parquet"),
      r"train\.parquet, row 0: the text field 'sentence' holds 5 \(int\), not a text"),
    C("own-data-hf-dataset-unreadable", "text-classification", lambda e, t: own_data(
      e, t, "--dataset", str(mkdir(t / "empty")), train=None, validation=None),
      r"--dataset .*empty: HF datasets could not read it \(EmptyDatasetError"),
    C("own-data-hf-dataset-without-validation", "text-classification", lambda e, t: own_data(
      e, t, "--dataset", str(hf_folder_without_validation(t)), train=None, validation=None),
      r"--dataset .*mine has no validation split \(its splits: train\); pass the files of both"),
    # ---- widenet-ds launch: refused before anything starts ----
    C("launch-zero-ranks", "launch", lambda e, t: ["pretrain", "--num-ranks", "0", "--", "--x"],
      r"--num-ranks/--num-gpus: '0' must be a whole number >= 1"),
    C("launch-unknown-option", "launch", lambda e, t: ["pretrain", "--gpus", "2", "--", "--x"],
      r"unknown launch option '--gpus'.*--num-ranks.*go after `--`"),
    C("launch-task-options-before-the-separator", "launch", lambda e, t: ["pretrain", "--data", "d"],
      r"unknown launch option '--data'.*go after `--`"),
    C("launch-nodes-without-hostfile", "launch", lambda e, t: ["pretrain", "--num-nodes", "2", "--", "--x"],
      r"--num-nodes 2 needs --hostfile"),
    C("launch-unknown-task", "launch", lambda e, t: ["pretrian", "--", "--x"], r"invalid choice: 'pretrian'"),
    C("launch-port-out-of-range", "launch", lambda e, t: ["glue", "--master-port", "70000", "--", "--x"],
      r"'70000' is not a TCP port"),
    C("launch-without-task-options", "launch", lambda e, t: ["classify", "--num-ranks", "2"],
      r"the classify options after `--`: the following arguments are required: .*--output-dir"),
    # ---- widenet-ds launch: what the ranks it starts cannot form (launch/job_checks.py), before they start ----
    C("launch-resume-on-fewer-ranks-than-its-ep-size", "launch", lambda e, t: ["pretrain", "--num-ranks", "1",
      "--config", str(saved_settings(e, t, lambda r: r.update(ep_size=2))), "--", "--resume", "--max-steps", "3"],
      r"widenet-ds launch: error: the pretrain run on 1 rank: --ep-size 2 does not divide the 1 rank\(s\).* To run on "
      r"these ranks, add `--ep-size 1` after `--` \(the resume re-lays its checkpoint out for them\)\."),
    C("launch-batch-does-not-split-over-the-ranks", "launch", lambda e, t: ["pretrain", "--num-ranks", "3", "--",
      *pretrain(e, t)], r"widenet-ds launch: error: the pretrain run on 3 ranks: DeepSpeed config: train_batch_size 16 "
                        r"is not a multiple of train_micro_batch_size_per_gpu 8 x 3 data-parallel rank\(s\)"),
    C("launch-branch-groups-the-ranks-cannot-form", "launch", lambda e, t: ["classify", "--num-ranks", "3", "--",
      *classify(e, t, "--branch-parallel", "2")],
      r"the classify run on 3 ranks: --branch-parallel 2: the model has one branch.*does not divide the 3 rank.*add "
      r"`--branch-parallel 1` after"),
    C("launch-finished-finetuning-resumed-for-other-steps", "launch", lambda e, t: ["glue", "--config", str(
      finished_glue(e, t)), "--", "--resume", "--max-steps", "2"],
      r"widenet-ds launch: error: the run in .*done is complete: each seed trained 1 steps .*--max-steps 2 cannot be "
      r"applied to it"),
    # ---- widenet-ds launch --dry-run: the job's start-up refusals for its shape, planned here (launch/dry_run.py) ----
    C("dry-run-ep-size-does-not-divide", "launch", lambda e, t: ["--dry-run", "--num-nodes", "2", "--gpus-per-node", "8",
      "pretrain", "--", *pretrain(e, t, "--ep-size", "3")],
      r"--ep-size 3 does not divide the 16 rank\(s\); use one of \[1, 2, 4\]"),
    C("dry-run-batch-does-not-divide", "launch", lambda e, t: ["--dry-run", "--num-ranks", "4", "pretrain", "--",
      *pretrain(e, t)], r"train_batch_size 16 is not a multiple of train_micro_batch_size_per_gpu 8 x 4 data-parallel "
      r"rank\(s\).*On 4 data-parallel ranks train_batch_size 16 takes train_micro_batch_size_per_gpu 1 or 2 or 4"),
    C("dry-run-exceeds-device-memory", "launch", lambda e, t: ["--dry-run", "--num-nodes", "2", "--gpus-per-node", "8",
      "--device-memory", "0.009", "pretrain", "--", *pretrain(e, t, ds=ds_config(
          t, train_micro_batch_size_per_gpu=1, zero_optimization={"stage": 1, "reduce_bucket_size": 1000}))],
      r"the job needs [\d.]+ MiB on the device of rank \d+ \(node \d\), more than its 0\.009 GiB\. It fits with "
      r"--activation-checkpointing"),
    C("dry-run-resume-cannot-split-the-checkpoints-steps", "launch", lambda e, t: ["--dry-run", "--num-nodes", "2",
      "--gpus-per-node", "8", "pretrain", "--", *pretrain(e, t, "--resume", out=run_copy(e, t, lambda r: None))],
      r"trained 2 micro-batch\(es\) of 8 per step .*16 data-parallel rank\(s\) cannot split them.*resume on 1 or 2 "
      r"data-parallel rank"),
    C("dry-run-prefix-schedule-without-the-data", "launch", lambda e, t: ["--dry-run", "--num-ranks", "1", "pretrain",
      "--", *pretrain(e, t, "--branch-schedule", "prefix", model=model_config(e, t, norm_position="pre", num_branches=2),
                data=t / "absent")],
      r"--branch-schedule prefix cycles once per epoch of the data, which is not on this machine: pass "
      r"--prefix-cycle-batches"),
    C("dry-run-of-a-finetuning-job", "launch", lambda e, t: ["--dry-run", "--num-ranks", "2", "glue", "--",
      *glue(e, t)], r"--dry-run plans pretrain jobs; a glue run checks its data and model when it starts"),
    C("dry-run-device-memory-not-positive", "launch", lambda e, t: ["--dry-run", "--device-memory", "0", "pretrain",
      "--", *pretrain(e, t)], r"argument --device-memory: '0' must be a positive number"),
    C("dry-run-unknown-gpu", "launch", lambda e, t: ["--dry-run", "--gpu", "V100", "pretrain", "--", *pretrain(e, t)],
      r"--gpu: invalid choice: 'V100' \(choose from 'H100', 'H200', 'A100-40GB', 'A100-80GB'\)"),
    C("dry-run-sizing-without-dry-run", "launch", lambda e, t: ["--gpu", "H100", "--seq-length", "128", "pretrain",
      "--", *pretrain(e, t)], r"--gpu, --seq-length size a job's plan: add --dry-run, or leave them out"),
    C("dry-run-gpus-without-a-count", "launch", lambda e, t: ["--dry-run", "--gpu", "H100", "--num-nodes", "2",
      "pretrain", "--", *pretrain(e, t)], r"give the GPUs of each node: --gpus-per-node G"),
    # ---- widenet-ds launch --preflight (launch/preflight.py), its ranks (launch/preflight_rank.py) and PREFLIGHT=1 ----
    C("launch-preflight-with-dry-run", "launch", lambda e, t: ["--dry-run", "--preflight", "pretrain", "--",
      *pretrain(e, t)], r"--dry-run plans the job on this machine, --preflight checks the cluster it will run on: "
                        r"give one"),
    C("launch-preflight-of-a-finetuning-job", "launch", lambda e, t: ["--preflight", "--num-ranks", "2", "glue", "--",
      *glue(e, t)], r"--preflight checks pretrain jobs; a glue run's model, data and steps depend on its dataset and "
                    r"checkpoint, which its start-up checks \(run it on a few ranks first\)"),
    C("preflight-rank-of-an-image-job", "preflight", lambda e, t: ["classify", *classify(e, t)],
      r"the preflight checks pretrain jobs, not 'classify': the model, data and steps of a finetuning or image job"),
    C("launch-preflight-batch-does-not-split-over-the-ranks", "launch", lambda e, t: ["--preflight", "pretrain",
      "--num-ranks", "3", "--", *pretrain(e, t)],
      r"widenet-ds launch: error: the pretrain run on 3 ranks: DeepSpeed config: train_batch_size 16 is not a multiple "
      r"of train_micro_batch_size_per_gpu 8 x 3 data-parallel rank\(s\)"),
    C("sbatch-preflight-neither-0-nor-1", "sbatch", lambda e, t: ["pretrain", *without(pretrain(e, t), "--output-dir")],
      r"PREFLIGHT=yes: set PREFLIGHT=1 to check the cluster for the job, or leave it unset \(or 0\) to run the job",
      env=(("PREFLIGHT", "yes"), ("OUTPUT_DIR", "/nonexistent/run"))),
    # ---- several nodes (issue 49): what a one-process row can show; each case's run across nodes is a test of
    # tests/integration/test_two_nodes.py (the table in docs/cluster.md, "What has run across nodes for real") ----
    C("launch-loopback-master-addr-with-two-nodes", "launch", lambda e, t: ["pretrain", "--hostfile", str(write(
      t / "hosts", f"localhost slots=1\n{socket.gethostname()} slots=1\n")), "--num-nodes", "2", "--num-ranks", "1",
      "--master-addr", "127.0.0.1", "--", "--x"], r"--master-addr 127\.0\.0\.1 is a loopback address, and the ranks "
                                                  r"run on 2 nodes.*never reach.*leave out --master-addr"),
    C("pretrain-data-missing-on-this-node", "pretrain", lambda e, t: pretrain(e, t, data=t / "node-local" / "data"),
      r"--data .*node-local/data does not exist; pass the folder `widenet-ds prepare-data --output` wrote"),
    C("pretrain-train-timeout-not-positive", "pretrain", lambda e, t: pretrain(e, t, "--train-timeout", "0"),
      r"--train-timeout must be positive, got 0\.0"),
    C("pretrain-train-timeout-nan", "pretrain", lambda e, t: pretrain(e, t, "--train-timeout", "nan"),
      r"argument --train-timeout: 'nan' is not a finite number"),
    C("glue-train-timeout-infinite", "glue", lambda e, t: glue(e, t, "--train-timeout", "inf"),
      r"argument --train-timeout: 'inf' is not a finite number"),
    C("pretrain-init-timeout-below-any-wait", "pretrain", lambda e, t: pretrain(e, t, "--init-timeout", "1e-9"),
      r"--init-timeout 1e-09 s is shorter than a healthy run waits in one collective .*give at least 10 s"),
    C("launch-config-train-timeout-nan", "launch", lambda e, t: ["pretrain", "--config", str(saved_settings(
      e, t, lambda r: r.update(train_timeout=float("nan"))))], r"--train-timeout must be a finite number, got nan"),
    C("glue-init-timeout-not-a-number", "glue", lambda e, t: glue(e, t, "--init-timeout", "10m"),
      r"--init-timeout: invalid float value: '10m'"),
    # ---- launcher.sh (subprocesses) ----
    C("launcher-vision-unknown-task-option", "launcher", lambda e, t: ["vision", "--num-ranks", "2", "--",
      "--model-config", "widenet-vit-digits", "--output-dir", str(t / "o"), "--deepspeed-config", str(VISION_CONFIG),
      "--dataset", "digits", "--learning-rate", "0.1"],  # the learning rate is the DeepSpeed JSON's
      r"the classify options after `--`: unrecognized arguments: --learning-rate 0\.1"),
    C("launcher-unknown-command", "launcher", lambda e, t: ["pretrian"], r"unknown command 'pretrian'"),
    # the GPU set-up (scripts/setup_gpu.sh): refused before anything is installed
    C("launcher-setup-gpu-unknown-option", "launcher", lambda e, t: ["setup", "--gpu", "--prebuild"],
      r"unknown option '--prebuild'; usage: \./launcher\.sh setup --gpu \[--prebuild-ops"),
    C("launcher-setup-gpu-op-names-not-deepspeeds", "launcher", lambda e, t: ["setup", "--gpu",
      "--prebuild-ops=Fused-Lamb"], r"--prebuild-ops=Fused-Lamb: give DeepSpeed's op names, comma-separated"),
    C("launcher-alias-zero-ranks", "launcher", lambda e, t: ["finetune", "--squad", "--num-gpus", "0", "--", "--x"],
      r"--num-ranks/--num-gpus: '0' must be a whole number >= 1"),
    # ---- when the world, not the flags, goes wrong (issue 25) ----
    # one writer per folder: another live process holds the folder's lock
    C("pretrain-into-a-folder-another-run-writes", "pretrain", lambda e, t: pretrain(e, t, out=held(e, t / "out")),
      r"out is being written by another process: PID \d+ on .*widenet-ds \(another run\).*wait for that one to end"),
    C("pretrain-resume-while-another-run-writes", "pretrain", lambda e, t: pretrain(e, t, "--resume", out=held(
      e, run_copy(e, t, lambda r: None))), r"run is being written by another process: PID \d+"),
    C("classify-into-a-folder-another-run-writes", "classify", lambda e, t: classify(e, t, out=held(e, t / "out")),
      r"out is being written by another process"),
    C("glue-into-a-folder-another-run-writes", "glue", lambda e, t: glue(e, t, out=held(e, t / "ft")),
      r"ft is being written by another process"),
    C("prepare-into-a-folder-another-prepare-writes", "widenet-ds", lambda e, t: ["prepare-data", "--source",
      str(e["books"] / "pg11.txt"), "--output", str(held(e, t / "o")), "--no-progress"],
      r"o is being written by another process: PID \d+"),
    C("convert-into-an-output-another-convert-writes", "widenet-ds", lambda e, t: ["convert", "to-folder", str(e["run"]),
      str(held(e, t / "o", beside=True))], r"o is being written by another process"),
    C("report-into-an-output-another-report-writes", "widenet-ds", lambda e, t: ["report", str(e["run"]), "--output",
      str(held(e, t / "o", beside=True))], r"o is being written by another process"),
    # a damaged checkpoint, named before anything loads it
    C("pretrain-resume-a-truncated-checkpoint", "pretrain", lambda e, t: pretrain(e, t, "--resume", "--max-steps", "4",
      out=run_copy(e, t, lambda r: truncate(r / "checkpoints/step2/zero_pp_rank_0_mp_rank_00_optim_states.pt"))),
      r"step2 is damaged: 1 of its \d+ files.*zero_pp_rank_0_mp_rank_00_optim_states\.pt: [\d,]+ bytes, written with "
      r"[\d,]+ \(truncated\).*Nothing was loaded"),
    C("pretrain-init-from-a-damaged-export", "pretrain", lambda e, t: pretrain(e, t, "--init-from", str(export_copy(
      e, t, lambda x: flip_byte(x / "model.safetensors")))), r"export is damaged.*model\.safetensors: content differs"),
    C("classify-init-from-a-truncated-checkpoint", "classify", lambda e, t: classify(e, t, "--init-from", str(run_copy(
      e, t, lambda r: truncate(r / "checkpoints/step2/mp_rank_00_model_states.pt")))),
      r"step2 is damaged.*mp_rank_00_model_states\.pt.*truncated"),
    C("convert-a-truncated-expert-file", "widenet-ds", lambda e, t: ["convert", "to-folder", str(run_copy(
      e, t, lambda r: truncate(r / "checkpoints/step2/layer_0_expert_1_mp_rank_00_model_states.pt"))), str(t / "o")],
      r"layer_0_expert_1_mp_rank_00_model_states\.pt: [\d,]+ bytes, written with [\d,]+ \(truncated\)"),
    C("convert-a-damaged-tag-names-the-other-as-convert-takes-it", "widenet-ds", lambda e, t: ["convert", "to-folder",
      str(run_copy(e, t, two_tags_the_latest_truncated)), str(t / "o")],
      r"step2 is damaged.*use another checkpoint of the run \(--tag step1; complete tags: step1\)"),
    C("pretrain-init-from-a-damaged-tag-names-the-other-as-init-from-takes-it", "pretrain", lambda e, t: pretrain(
      e, t, "--init-from", str(run_copy(e, t, two_tags_the_latest_truncated))),
      r"step2 is damaged.*use another checkpoint of the run \(--init-from .*run/checkpoints/step1; complete tags"),
    C("pretrain-resume-a-tag-that-does-not-exist", "pretrain", lambda e, t: pretrain(e, t, "--resume",
      str(e["run"] / "checkpoints/step99")), r"checkpoint .*step99 does not exist; the tags in .*checkpoints: step2\."),
    C("verify-a-truncated-checkpoint", "widenet-ds", lambda e, t: ["verify", str(run_copy(
      e, t, lambda r: truncate(r / "checkpoints/step2/rank_00000_state.pt")))], r"rank_00000_state\.pt: .*truncated"),
    C("verify-a-damaged-export", "widenet-ds", lambda e, t: ["verify", str(export_copy(
      e, t, lambda x: flip_byte(x / "model.safetensors")))], r"model\.safetensors: content differs.*Restore it"),
    C("verify-missing-checkpoint", "widenet-ds", lambda e, t: ["verify", str(t / "none")], r"none does not exist"),
    # a disk too small for what is about to be written: refused before writing
    C("pretrain-output-on-a-nearly-full-disk", "pretrain", lambda e, t: pretrain(e, t, out=e["disk"] / "out"),
      r"not enough space in .*out/checkpoints for a checkpoint of this run: about 1\d\.\d MiB needed, [\d.]+ MiB free",
      disk="6m"),
    C("prepare-output-on-a-nearly-full-disk", "widenet-ds", lambda e, t: ["prepare-data", "--source",
      str(e["books"] / "pg2701.txt"), "--output", str(e["disk"] / "o"), "--no-progress"],
      r"not enough space in .*o for the prepared data .*: about 2\.\d MiB needed", disk="1m"),
    C("convert-output-on-a-nearly-full-disk", "widenet-ds", lambda e, t: ["convert", "to-folder", str(e["run"]),
      str(e["disk"] / "o")], r"not enough space in .* for the converted checkpoint .*o: about \d\.\d MiB needed",
      disk="1m"),
    C("pretrain-output-on-a-full-disk", "pretrain", lambda e, t: pretrain(e, t, out=e["disk"] / "out"),
      r"no space left on the disk holding .*out to write its lock file .*out/\.widenet-ds\.lock .*Free space there",
      disk="64k", fill=True),
    # a busy port, an unreachable hub, a compile backend torch does not have, unusable tokenizers and outputs
    C("launch-master-port-in-use", "launch", lambda e, t: ["pretrain", "--num-ranks", "2", "--master-port",
      str(e["busy_port"]), "--", "--x"], r"--master-port \d+ is in use on this machine by PID \d+.*leave out --master-port"),
    C("prepare-hf-source-offline", "widenet-ds", lambda e, t: ["prepare-data", "--source", "hf:wikipedia", "--output",
      str(t / "o"), "--no-progress"], r"needs the HF hub \(127\.0\.0\.1\), which cannot be reached.*HF_DATASETS_OFFLINE",
      env=(("HF_ENDPOINT", "http://127.0.0.1:{closed_port}"),)),
    C("pretrain-compile-backend-unknown", "pretrain", lambda e, t: pretrain(e, t, "--compile", "--compile-backend",
      "nonexistent"), r"--compile-backend 'nonexistent' is not a torch\.compile backend; choose one of "
                      r"(?!.*(?:eager_debug|minifier|TESTING))[\w, ]*inductor"),  # not torch's debugging backends
    C("pretrain-compile-backend-without-compile", "pretrain", lambda e, t: pretrain(e, t, "--compile-backend",
      "aot_eager"), r"--compile-backend aot_eager applies only to a compiled model; add --compile, or drop"),
    C("prepare-tokenizer-empty-folder", "widenet-ds", lambda e, t: ["prepare-data", "--default-corpus", "--tokenizer",
      str(mkdir(t / "tok")), "--output", str(t / "o")], r"tok' is a folder holding neither tokenizer\.json nor vocab\.txt"),
    C("prepare-tokenizer-binary-file", "widenet-ds", lambda e, t: ["prepare-data", "--default-corpus", "--tokenizer",
      str(write(t / "vocab.bin", bytes(range(256)))), "--output", str(t / "o")],
      r"vocab\.bin is not a vocab\.txt \(UTF-8 text, one token a line\) nor a tokenizer\.json"),
    C("glue-tokenizer-binary-file", "glue", lambda e, t: glue(e, t, tokenizer=write(t / "vocab.txt", bytes(range(256)))),
      r"vocab\.txt is not a vocab\.txt \(UTF-8"),
    C("report-output-below-a-file", "widenet-ds", lambda e, t: ["report", str(e["run"]), "--output",
      str(write(t / "f", "x") / "page")], r"--output .*page is below .*f, which is a file"),
    # ---- launch --config with a run's settings edited or damaged, or continued elsewhere (issue 50) ----
    C("launch-config-a-json-list", "launch", lambda e, t: ["pretrain", "--config", str(saved_settings(e, t, [1, 2])),
      "--", "--resume"], r"run_config\.json: cannot read the run's settings: .*run_config\.json \(the run's settings\) "
                         r"holds a JSON list, not an object"),
    C("launch-config-null", "launch", lambda e, t: ["pretrain", "--config", str(saved_settings(e, t, None))],
      r"run_config\.json: cannot read the run's settings: .*holds a JSON null, not an object"),
    C("launch-config-without-data", "launch", lambda e, t: ["pretrain", "--config", str(saved_settings(
      e, t, lambda r: r.pop("data"))), "--", "--resume"], r'run_config\.json: "data" is missing \(the --data setting\); '
                                                         r"pass --data after `--`"),
    C("launch-config-max-steps-text", "launch", lambda e, t: ["pretrain", "--config", str(saved_settings(
      e, t, lambda r: r.update(max_steps="abc")))], r'run_config\.json: "max_steps" is "abc", which is not an integer '
                                                   r"or null"),
    C("launch-config-ep-size-fraction", "launch", lambda e, t: ["pretrain", "--config", str(saved_settings(
      e, t, lambda r: r.update(ep_size=2.5)))], r'--config .*run_config\.json: "ep_size" is 2\.5, which is not an '
                                               r"integer"),
    C("launch-config-a-model-config", "launch", lambda e, t: ["pretrain", "--config", str(e["model"])],
      r"--config .*model\.json is a model config .*not a run's settings; pass the run folder or its run_config\.json"),
    C("launch-config-resume-into-another-folder", "launch", lambda e, t: ["pretrain", "--config", str(run_copy(
      e, t, lambda r: None)), "--", "--resume", "--output-dir", str(t / "new")],
      r"--config .*run is a run with checkpoint step2, but --output-dir .*new holds nothing to resume: --resume there "
      r"would start a new run from step 1"),
    C("pretrain-init-from-a-data-folder", "pretrain", lambda e, t: pretrain(e, t, "--init-from", str(e["data"])),
      r"--init-from .*data is a directory but not a checkpoint .*: it is a data folder of `widenet-ds prepare-data`, "
      r"which a run takes as --data .*; --init-from takes a folder written by `widenet-ds convert to-folder`"),
    C("pretrain-warmup-zero", "pretrain", lambda e, t: pretrain(e, t, ds=ds_config(
      t, **{"scheduler.params.warmup_num_steps": 0})), r"warmup_num_steps must be a positive integer"),
    C("classify-epochs-zero", "classify", lambda e, t: without(classify(e, t, "--epochs", "0"), "--max-steps"),
      r"--epochs must be positive \(passes over the train split\), got 0\.(?!.*--max-steps)"),
    C("classify-route-padding", "classify", lambda e, t: classify(e, t, "--set", "moe.route_padding=true"),
      r"moe\.route_padding = true routes padding tokens, and an image has none"),
    C("widenet-ds-train-misspelt-task", "widenet-ds", lambda e, t: ["train", "pretrian"],
      r"unknown task 'pretrian'\. Did you mean 'pretrain'\?"),
]


def without(argv: list[str], option: str) -> list[str]:
    """`argv` less `option` and its value."""
    at = argv.index(option)
    return argv[:at] + argv[at + 2:]


def saved_settings(env, tmp: Path, edit) -> Path:
    """A copy of the earlier run whose run_config.json is replaced by `edit` (a value) or changed by it (a function
    of the record)."""
    run = run_copy(env, tmp, lambda r: None)
    record = json.loads((run / "run_config.json").read_text())
    if callable(edit):
        edit(record)
    else:
        record = edit
    (run / "run_config.json").write_text(json.dumps(record))
    return run / "run_config.json"


def run_entry(entry: str, argv: list[str], capsys) -> tuple[int, str]:
    if entry == "launcher":
        venv = Path(sys.executable).parent.parent
        proc = subprocess.run([str(REPO / "launcher.sh"), *argv], capture_output=True, text=True, timeout=60,
                              env=child_env(WIDENET_VENV=str(venv)))
        return proc.returncode, proc.stdout + proc.stderr
    if entry == "sbatch":  # the batch script's own checks, before its srun
        proc = subprocess.run(["bash", str(REPO / "slurm" / "train.sbatch"), *argv], capture_output=True, text=True,
                              timeout=60, env=child_env(WIDENET_HOME=str(REPO), PYTHON=sys.executable))
        return proc.returncode, proc.stdout + proc.stderr
    try:
        if entry == "widenet-ds":
            code = widenet_ds(argv)
        elif entry == "launch":
            code = widenet_ds(["launch", *argv])
        elif entry == "preflight":
            code = preflight_rank(argv)
        else:
            code = train([entry, *argv])
    except SystemExit as exit_:  # argparse: usage + one error line
        code = exit_.code
    except WideNetError as err:  # an entrypoint that lets its user errors out (caught by its caller)
        print(f"error: {err}", file=sys.stderr)
        code = 2
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_the_table_covers_every_entry_with_60_distinct_cases():
    assert len({case.id for case in CASES}) == len(CASES) >= 60
    assert {case.entry for case in CASES} == {"widenet-ds", "launch", "launcher", "preflight", "sbatch",
                                              *TASKS}  # every task has rows


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_bad_input_fails_with_one_clear_error_and_touches_no_earlier_file(case, earlier, tmp_path, capsys,
                                                                          monkeypatch, request):
    capsys.readouterr()
    for name, value in case.env:
        monkeypatch.setenv(name, value.format(closed_port=closed_port()))
    if case.disk:
        small_disk = request.getfixturevalue("small_disk")
        earlier = {**earlier, "disk": small_disk(case.disk)}
        if case.fill:
            small_disk.fill(earlier["disk"])
    argv = case.argv(earlier, tmp_path)
    code, output = run_entry(case.entry, argv, capsys)
    assert code == 2, f"exit status {code}, expected 2 (a user error):\n{output[-3000:]}"
    assert re.search(case.pattern, output, re.IGNORECASE | re.DOTALL), f"message does not name the problem:\n{output[-3000:]}"
    assert "Traceback" not in output, output[-3000:]
    if case.entry in REFUSED_BEFORE_THE_MODEL:
        assert "building the model" not in output, f"refused only once a rank built its model:\n{output[-3000:]}"
    errors = [line for line in output.splitlines() if re.search(r"\berror\b", line, re.IGNORECASE)]
    assert len(errors) <= 1, f"more than one error line:\n{output[-3000:]}"
    assert not (tmp_path / "out" / "metrics.jsonl").exists() and not (tmp_path / "ft" / "results.json").exists()
    for name, before in earlier["digests"].items():
        assert digest(earlier[name]) == before, f"{case.id} modified the earlier run's {name} folder"


def test_finetuning_tokenizer_check_compares_contents_and_names_both_sources(earlier):
    """Item 4, finetuning side: `check_checkpoint_tokenizer` refuses another vocabulary of the same size
    (the vocabulary-size check finetuning does today passes it) and accepts the run's own tokenizer."""
    from widenet_ds.checkpoint.source import CheckpointSource
    from widenet_ds.checkpoint.tokenizer_check import check_checkpoint_tokenizer
    from widenet_ds.data.tokenizer import load_tokenizer
    from widenet_ds.errors import CheckpointError
    from widenet_ds.tasks.finetune.features import check_tokenizer_matches

    other = load_tokenizer(earlier["other_tokenizer"] / "tokenizer.json")
    check_tokenizer_matches(other, earlier["vocab"])  # same size: the size check is blind to it
    with pytest.raises(CheckpointError, match=r"--tokenizer other is not the tokenizer of the checkpoint .*run.*"
                                              r"vocabulary differs from .*run/tokenizer\.json"):
        check_checkpoint_tokenizer(other, "--tokenizer other", CheckpointSource.open(earlier["run"], "--init-from"),
                                   earlier["vocab"])
    for source in ("run", "export"):
        check_checkpoint_tokenizer(load_tokenizer(earlier["data"]), "--tokenizer data",
                                   CheckpointSource.open(earlier[source], "--init-from"), earlier["vocab"])


def test_exported_folders_are_readable_by_group_and_others(earlier):
    for folder in ("export", "data"):
        for path in earlier[folder].rglob("*"):
            assert path.stat().st_mode & 0o044 == 0o044, f"{path} is not readable by group/others"


@pytest.mark.slow  # a resumed run (21 s of CPU)
def test_resume_with_changed_settings_runs_when_accepted_and_logs_the_change(earlier, tmp_path):
    """With --accept-changed-settings the resumed run continues and its log names each change."""
    run = run_copy(earlier, tmp_path, lambda r: None)
    ds = ds_config(tmp_path, **{"optimizer.params.lr": 0.01, "scheduler.params.warmup_max_lr": 0.01})
    argv = pretrain(earlier, tmp_path, "--resume", "--max-steps", "3", "--accept-changed-settings", ds=ds, out=run)
    assert train(["pretrain", *argv]) == 0
    events = [r["event"] for r in read_metrics(run / "metrics.jsonl").events]
    assert any("changed since the checkpoint" in e and "optimizer.params.lr: 0.02 -> 0.01" in e for e in events), events
    assert (run / "checkpoints" / "latest").read_text() == "step3"


def test_resume_of_a_finished_run_says_it_is_complete_and_changes_nothing(earlier, tmp_path, capsys):
    run = run_copy(earlier, tmp_path, lambda r: None)
    before = digest(run)
    capsys.readouterr()
    assert train(["pretrain", *pretrain(earlier, tmp_path, "--resume", out=run)]) == 0
    output = capsys.readouterr().err
    assert f"the run in {run} is complete (step 2)" in output and "training: steps" not in output, output[-2000:]
    assert digest(run) == before


def test_a_launch_resuming_a_finished_run_says_its_scores_and_starts_nothing(earlier, tmp_path, capsys):
    """`widenet-ds launch TASK --config RUN -- --resume` of a finished run: its scores in place of a launch (no rank
    started: the echo of the runner's command is absent; the data not read: the saved --data is gone), the run
    unchanged; a finetuning run's medians likewise (the settings' own check, `complete_results`, as the demo's)."""
    run = saved_settings(earlier, tmp_path, lambda r: r.update(data=str(tmp_path / "gone"))).parent
    before = digest(run)
    capsys.readouterr()
    assert widenet_ds(["launch", "pretrain", "--num-ranks", "2", "--config", str(run), "--", "--resume"]) == 0
    output = capsys.readouterr()
    assert output.out.startswith(f"widenet-ds launch: the pretrain run in {run} is complete: step 2, held-out "
                                 f"valid/loss ") and f"; its results: {run / 'results.json'}. No rank started" \
        in output.out and "deepspeed" not in output.out + output.err, output
    assert digest(run) == before

    done = finished_glue(earlier, tmp_path)
    capsys.readouterr()
    assert widenet_ds(["launch", "glue", "--config", str(done), "--", "--resume"]) == 0
    said = capsys.readouterr().out
    assert re.match(rf"widenet-ds launch: the glue run in {re.escape(str(done))} is complete: 1 seed\(s\) of 1 steps, "
                    rf"median dev acc 0\.\d{{4}} \(trivial baseline: dev acc 0\.\d{{4}}\); its results: ", said), said


@pytest.mark.parametrize("command", [["widenet-ds", "--help"], ["widenet-ds", "launch", "squad", "--help"],
                                     ["widenet-ds", "params"], ["train", "--help"]])
def test_output_into_a_closed_pipe_ends_without_a_traceback(command):
    """`widenet-ds --help | head`: the reader gone before the output is written (its end of the pipe closed first),
    the command ends with exit status 1 and no BrokenPipeError traceback, as Python's documentation advises."""
    entry = ["-m", "widenet_ds.cli"] if command[0] == "widenet-ds" else ["-m", "widenet_ds.train"]
    read, write_end = os.pipe()
    os.close(read)
    proc = subprocess.run([sys.executable, *entry, *command[1:]], stdout=write_end, stderr=subprocess.PIPE, text=True,
                          env=child_env(), timeout=120)
    os.close(write_end)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, \
        proc.stderr[-2000:]


def test_a_run_shorter_than_its_schedule_says_so(earlier):
    """cpu_small.json's schedule decays over 300 steps (30 of warmup); the earlier run stopped at step 2."""
    notes = [e["event"] for e in read_metrics(earlier["run"] / "metrics.jsonl").events if "total_num_steps" in e["event"]]
    assert notes == ["the run ends at step 2, before the DeepSpeed schedule's total_num_steps 300: the learning rate "
                     "will not have decayed to its end value. For a complete schedule set total_num_steps to 2 and "
                     "warmup_num_steps to 1 (the same share of the run) in the DeepSpeed config."]


SCHEDULE_HINT = re.compile(r"set total_num_steps to (\d+)(?: and warmup_num_steps to (\d+) \(the same share of the "
                           r"run\))? in the DeepSpeed config(?: and pass ((?:--[\w-]+ ?)+))?")


def follow_schedule_hint(text: str, base: Path, tmp: Path) -> list[str]:
    """The options that follow the schedule hint in `text`: a copy of the DeepSpeed JSON `base` changed as it says,
    and the flags it names."""
    found = SCHEDULE_HINT.search(text)
    assert found, f"no schedule hint in:\n{text[-2000:]}"
    config = json.loads(base.read_text())
    config["scheduler"]["params"]["total_num_steps"] = int(found.group(1))
    if found.group(2) is not None:
        config["scheduler"]["params"]["warmup_num_steps"] = int(found.group(2))
    path = write(tmp / f"hint{len(list(tmp.glob('hint*.json')))}.json", json.dumps(config))
    return ["--deepspeed_config", str(path), *(found.group(3) or "").split()]


def test_every_hint_of_a_shortened_or_resumed_run_is_accepted_when_followed(earlier, tmp_path, capsys):
    """Item 4: each schedule hint the trainer prints (a run shorter than its schedule, fresh or resumed; a resume
    past the schedule; a finetuning run shortened below its task recipe) is followed as written, and the run
    takes it."""
    base = ds_config(tmp_path, **{"scheduler.params.total_num_steps": 6, "scheduler.params.warmup_num_steps": 3})
    first = tmp_path / "first"
    assert train(["pretrain", *pretrain(earlier, tmp_path, ds=base, out=first)]) == 0  # 2 of 6 steps

    def follow(text: str, *argv: str, out: Path) -> None:
        hint = follow_schedule_hint(text, base, tmp_path)
        capsys.readouterr()
        code = train(["pretrain", *argv, *hint, "--output-dir", str(out)])
        output = capsys.readouterr().err
        assert code == 0, f"the hint {hint} was not accepted:\n{output[-3000:]}"
        assert not any("total_num_steps" in e and "For a complete schedule" in e
                       for e in read_metrics(out / "metrics.jsonl").events)

    def resumable_copy() -> Path:
        return shutil.copytree(first, tmp_path / f"copy{len(list(tmp_path.glob('copy*')))}")

    # a fresh run shorter than its schedule
    events = "\n".join(e["event"] for e in read_metrics(first / "metrics.jsonl").events)
    follow(events, *pretrain(earlier, tmp_path, out=tmp_path / "unused"), out=tmp_path / "fresh")
    # a resumed run shorter than its schedule
    resumed = resumable_copy()
    assert train(["pretrain", *pretrain(earlier, tmp_path, "--resume", "--max-steps", "4", ds=base, out=resumed)]) == 0
    events = "\n".join(e["event"] for e in read_metrics(resumed / "metrics.jsonl").events if e.get("step") == 2)
    assert "--accept-changed-settings" in events, events
    follow(events, *pretrain(earlier, tmp_path, "--resume", "--max-steps", "4"), out=resumable_copy())
    # a resume past the schedule: refused, with a hint
    capsys.readouterr()
    past = pretrain(earlier, tmp_path, "--resume", "--max-steps", "8", ds=base, out=resumable_copy())
    assert train(["pretrain", *past]) == 2
    refusal = capsys.readouterr().err
    assert "or lower --max-steps to 6" in refusal, refusal
    follow(refusal, *pretrain(earlier, tmp_path, "--resume", "--max-steps", "8"), out=resumable_copy())
    assert train(["pretrain", *pretrain(earlier, tmp_path, "--resume", "--max-steps", "6", ds=base,
                                        out=resumable_copy())]) == 0  # its other way
    # finetuning shortened below its recipe (SST-2: 5234 steps, 314 of warmup): a JSON that is the recipe's
    recipe = json.loads((REPO / "ds_configs/finetune_sst2.json").read_text())
    recipe.pop("bf16")
    recipe["optimizer"]["params"]["torch_adam"] = True
    recipe_json = write(tmp_path / "sst2.json", json.dumps(recipe))
    short = glue(earlier, tmp_path, "--max-train-examples", "128", "--max-eval-examples", "8", "--max-seq-length", "32",
                 ds=recipe_json, out=tmp_path / "ft")
    assert train(["glue", *short]) == 0
    events = "\n".join(e["event"] for e in read_metrics(tmp_path / "ft/seed1234/metrics.jsonl").events)
    assert "--allow-recipe-mismatch" in events, events
    base = recipe_json
    hint = follow_schedule_hint(events, recipe_json, tmp_path)
    capsys.readouterr()
    assert train(["glue", *glue(earlier, tmp_path, "--max-train-examples", "128", "--max-eval-examples", "8",
                                "--max-seq-length", "32", *hint, out=tmp_path / "ft2")]) == 0, capsys.readouterr().err


def test_a_resume_on_ranks_that_cannot_split_its_micro_batches_says_so_first(earlier, tmp_path):
    """The earlier run's step holds 2 micro-batches (16 = 8 x 2 on 1 rank): planned on 3 or 4 ranks, the resume's
    own message comes first, not the DeepSpeed JSON's batch arithmetic (whose other global batch the resume would
    refuse): the micro batches that form 16 there (none on 3 ranks) and the rank counts it names are accepted."""
    from widenet_ds.errors import ConfigError
    from widenet_ds.tasks.pretrain.config import PretrainConfig
    from widenet_ds.tasks.pretrain.task import PretrainTask
    from widenet_ds.training.command_line import parse
    from widenet_ds.training.plan import find_resume, plan_run

    cfg = parse(PretrainConfig, pretrain(earlier, tmp_path, "--resume", out=run_copy(earlier, tmp_path, lambda r: None)))
    resume = find_resume(cfg, cfg.folder)
    for world, micro in ((3, ""), (4, "set train_micro_batch_size_per_gpu to 1 or 2 or 4 in the DeepSpeed JSON .*")):
        with pytest.raises(ConfigError, match=rf"trained 2 micro-batch\(es\) of 8 per step \(train_batch_size 16\); "
                                              rf"{world} data-parallel rank\(s\) cannot split them\. Keep "
                                              rf"train_batch_size 16 and {micro}resume on 1 or 2 data-parallel rank"):
            plan_run(cfg, PretrainTask(cfg, cfg.folder), world, 0, resume)
    for world in (1, 2):
        plan_run(cfg, PretrainTask(cfg, cfg.folder), world, 0, resume)


def test_a_resharded_checkpoint_resumed_on_its_own_shape_is_not_called_another_shape(earlier, tmp_path, capsys):
    """`convert reshard` for the run's own shape (1 rank, ep 1): the resume re-lays the state out, and says so
    without "on another shape"."""
    resharded = tmp_path / "resharded"
    assert widenet_ds(["convert", "reshard", str(earlier["run"]), str(resharded), "--ep-size", "1",
                       "--world-size", "1"]) == 0
    out = run_copy(earlier, tmp_path, lambda r: None)
    capsys.readouterr()
    assert train(["pretrain", *pretrain(earlier, tmp_path, "--resume", str(resharded / "step2"), "--max-steps", "3",
                                        out=out)]) == 0
    console = capsys.readouterr().err
    said = [e["event"] for e in read_metrics(out / "metrics.jsonl").events if "resumed from" in e["event"]]
    assert "re-laid out from its resharded state (on its own shape, 1 rank, ep 1, ZeRO 1)" in said[-1], said
    assert "on another shape" not in said[-1] + console


def test_a_reshard_says_what_a_resume_of_it_will_do(earlier, tmp_path, capsys):
    """Before, `convert reshard --world-size N` promised "--resume continues the run (on that shape or another)" for
    any N, also where the resume would then be refused (3 ranks: the refusal is a row of the table). The earlier
    run's step holds 2 micro-batches of 8: 2 ranks split them; 4 ranks form its 16 samples with another micro batch
    only, which the promise names."""
    said = {}
    for world in (2, 4):
        capsys.readouterr()
        assert widenet_ds(["convert", "reshard", str(earlier["run"]), str(tmp_path / f"r{world}"), "--ep-size", "1",
                           "--world-size", str(world)]) == 0
        said[world] = capsys.readouterr().out
    assert f"--resume {tmp_path / 'r2' / 'step2'} continues the run on 2 rank(s), or on another shape" in said[2]
    assert ("continues the run on 4 rank(s) with train_micro_batch_size_per_gpu 1 or 2 or 4 in the DeepSpeed JSON "
            "(the same train_batch_size 16: the same samples per step in other micro-batches, so statistically), or "
            "as it is on 1 or 2 rank(s)") in said[4], said[4]
