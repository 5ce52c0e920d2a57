"""Raw text -> tokenized pretraining examples: widenet-ds `prepare-data` vs the HF `run_mlm` pipeline.

Both run on the same text file (the shared corpus repeated to the requested sizes), with the same
BERT uncased vocabulary and the same number of processes, each in a fresh subprocess whose process
tree's RSS is sampled every 50 ms. The HF side is `run_mlm.py`'s preprocessing: `load_dataset("text")`,
`datasets.map` with a fast BERT tokenizer (`return_special_tokens_mask=True`), then `group_texts`
into blocks of `seq_length`, all cached to disk as run_mlm does. Ours builds ALBERT MLM+SOP examples
(sentence split, pairs, SOP labels; dynamic masking, as run_mlm masks in its collator) into shards.

    python bench/bench_data_pipeline.py --sizes-mb 50 100 --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil

SHARED = Path(os.environ.get("WIDENET_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))

OURS = """
import json, sys, time
from pathlib import Path
from widenet_ds.data.examples import ExampleConfig
from widenet_ds.data.prepare import PrepareConfig, prepare
from widenet_ds.data.sources import parse_source
text, vocab, out, workers, seq = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
start = time.perf_counter()
manifest = prepare([parse_source(text)], out, PrepareConfig(ExampleConfig(seq_length=seq)), tokenizer=vocab,
                   workers=workers, progress=False)
seconds = time.perf_counter() - start
splits = manifest.splits
print(json.dumps({"seconds": seconds, "examples": sum(s.examples for s in splits.values()),
                  "tokens": sum(s.tokens for s in splits.values())}))
"""

HF_RUN_MLM = """
import json, sys, time
from itertools import chain
text, vocab, out, workers, seq = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
start = time.perf_counter()
import datasets
from transformers import BertTokenizerFast
datasets.disable_progress_bars()
tokenizer = BertTokenizerFast(vocab_file=vocab, do_lower_case=True)
raw = datasets.load_dataset("text", data_files={"train": text}, cache_dir=out)["train"]
def tokenize_function(examples):  # run_mlm.py, line_by_line=False
    return tokenizer(examples["text"], return_special_tokens_mask=True)
tokenized = raw.map(tokenize_function, batched=True, num_proc=workers, remove_columns=["text"])
def group_texts(examples):  # run_mlm.py
    concatenated = {k: list(chain(*examples[k])) for k in examples.keys()}
    total_length = len(concatenated[list(examples.keys())[0]])
    total_length = (total_length // seq) * seq
    return {k: [t[i : i + seq] for i in range(0, total_length, seq)] for k, t in concatenated.items()}
grouped = tokenized.map(group_texts, batched=True, num_proc=workers)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "examples": len(grouped), "tokens": len(grouped) * seq}))
"""


def run_measured(code: str, args: list[str]) -> dict:
    """Run `code` in a fresh interpreter; return its JSON line plus the peak RSS of its process tree."""
    env = dict(os.environ, TOKENIZERS_PARALLELISM="true", HF_DATASETS_OFFLINE="1")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    root = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        try:
            tree = [root, *root.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        except psutil.NoSuchProcess:
            pass
        time.sleep(0.05)
    stdout, stderr = proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"benchmark subprocess failed:\n{stderr[-3000:]}")
    result = json.loads(stdout.strip().splitlines()[-1])
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result["peak_rss_mb"] = peak / 2**20
    # CPU seconds of the whole tree (workers are waited for, so their time is included): less
    # sensitive than wall time to other load on a shared machine.
    result["cpu_seconds"] = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return result


def build_corpus(folder: Path, size_mb: int) -> Path:
    """The shared corpus (books + WikiText-2) repeated to `size_mb` MB."""
    parts = sorted((SHARED / "corpus" / "books").glob("*.txt")) + sorted((SHARED / "corpus" / "wikitext-2").glob("*"))
    if not parts:
        sys.exit(f"shared corpus not found under {SHARED}; set WIDENET_SHARED_DATA")
    block = b"\n\n".join(p.read_bytes() for p in parts) + b"\n\n"
    path = folder / f"corpus-{size_mb}mb.txt"
    with open(path, "wb") as handle:
        written = 0
        while written < size_mb * 10**6:
            handle.write(block)
            written += len(block)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[50, 100])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seq-length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs per pipeline; the fastest counts")
    args = parser.parse_args()
    vocab = SHARED / "vocab" / "bert-base-uncased-vocab.txt"
    pipelines = (("widenet-ds prepare-data", OURS), ("HF run_mlm (datasets.map)", HF_RUN_MLM))
    table = []
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        tmp = Path(tmp)
        for size in args.sizes_mb:
            text = build_corpus(tmp, size)
            mb = text.stat().st_size / 10**6
            best: dict[str, dict] = {}
            for repeat in range(args.repeats):
                for name, code in pipelines:
                    out = tmp / f"out-{size}-{repeat}"
                    result = run_measured(textwrap.dedent(code), [str(text), str(vocab), str(out),
                                                                  str(args.workers), str(args.seq_length)])
                    print(f"{name:<26} {mb:6.1f} MB  run {repeat + 1}: {result['seconds']:6.1f} s wall "
                          f"{mb / result['seconds']:5.2f} MB/s  {result['cpu_seconds']:6.1f} CPU s  peak RSS "
                          f"{result['peak_rss_mb']:5.0f} MB  {result['examples']} examples of "
                          f"{args.seq_length}", flush=True)
                    subprocess.run(["rm", "-rf", str(out)], check=True)
                    if name not in best or result["seconds"] < best[name]["seconds"]:
                        best[name] = result
                    best[name]["peak_rss_mb"] = max(best[name]["peak_rss_mb"], result["peak_rss_mb"])
            table.append((mb, best[pipelines[0][0]], best[pipelines[1][0]]))
            text.unlink()
    print(f"\nbest of {args.repeats} alternating runs, {args.workers} processes each, seq_length {args.seq_length}")
    print("| text MB | ours MB/s | HF MB/s | speed-up (wall) | ours CPU s/MB | HF CPU s/MB | ours peak RSS MB | HF peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|")
    for mb, ours, hf in table:
        print(f"| {mb:.1f} | {mb / ours['seconds']:.2f} | {mb / hf['seconds']:.2f} | "
              f"{hf['seconds'] / ours['seconds']:.2f}x | {ours['cpu_seconds'] / mb:.2f} | {hf['cpu_seconds'] / mb:.2f} | "
              f"{ours['peak_rss_mb']:.0f} | {hf['peak_rss_mb']:.0f} |")


if __name__ == "__main__":
    main()
