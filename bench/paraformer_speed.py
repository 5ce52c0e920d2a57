"""ParaFormer's parallel branches on CPU, measured side by side in one run (Fashion-MNIST-sized images):

(a) forward latency and training throughput of the sequential model of the same total depth
    (paraformer-tiny-1x12) against ParaFormer layouts (3x4, 4x3) and WideNet x ParaFormer (3x4), one process;
(b) the encoder's batched branch computation (one batched step per depth over all branches) against a
    plain Python loop over the branches (the encoder's sequential `_block`, as tests/model/test_branches.py's
    reference), same weights, same process;
(c) branch-parallel on 2 CPU ranks (gloo, 1 thread each, started here by torch.multiprocessing) against the
    same model on 1 rank with 1 thread and with 2 threads.

    PYTHONPATH=. .venv/bin/python bench/paraformer_speed.py

Forward latency: eval mode, no autograd. Training: forward + cross-entropy + backward + AdamW step in train
mode (dropout on), plain torch, no DeepSpeed; the MoE's balance loss is left out of every variant alike.
Branch-parallel training adds `BranchParallel.all_reduce_shared_gradients` (the shared attention and MoE).
Each figure: warm-up iterations, then the median of repeats; on 2 ranks each repeat starts after a barrier
and counts the slower rank. Random pixels (speed does not depend on the images). The load average is
printed before and after each section: other work on the machine shows there.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial

import torch
import torch.distributed as torch_dist
import torch.multiprocessing as torch_mp
import torch.nn.functional as F
from torch import Tensor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import machine  # noqa: E402
from widenet_ds.model.branches import BranchParallel  # noqa: E402
from widenet_ds.vision.config import VisionConfig  # noqa: E402
from widenet_ds.vision.model import ViTWideNetForImageClassification, count_trainable_parameters  # noqa: E402

SEQUENTIAL = "paraformer-tiny-1x12"
MODELS = (SEQUENTIAL, "paraformer-tiny-3x4", "paraformer-tiny-4x3", "widenet-paraformer-tiny-3x4")
BRANCHED = MODELS[1:]


def build(preset: str) -> ViTWideNetForImageClassification:
    torch.manual_seed(0)
    return ViTWideNetForImageClassification(VisionConfig.from_preset(preset))


def make_batch(cfg: VisionConfig, size: int) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(1)
    pixels = torch.rand(size, cfg.num_channels, cfg.image_size, cfg.image_size, generator=gen) * 2 - 1
    return pixels, torch.randint(0, cfg.num_classes, (size,), generator=gen)


def loop_logits(model: ViTWideNetForImageClassification, pixels: Tensor) -> Tensor:
    """Each branch run alone, block after block (the encoder's sequential block code), then summed."""
    encoder, cfg = model.encoder, model.cfg
    x0 = model.embeddings(pixels)
    total = torch.zeros_like(x0)
    for branch in range(cfg.num_branches):
        x = x0
        for depth in range(cfg.layers_per_branch):
            x, _ = encoder._block(branch * cfg.layers_per_branch + depth, x, None, None)
        total = total + x
    x = encoder.final_norm(total)
    return model.classifier(x.mean(dim=1) if cfg.head == "gap" else x[:, 0])


def batched_logits(model: ViTWideNetForImageClassification, pixels: Tensor) -> Tensor:
    return model(pixels).logits


LogitsFn = Callable[[ViTWideNetForImageClassification, Tensor], Tensor]


def train_step(model, logits_fn: LogitsFn, pixels: Tensor, labels: Tensor,
               after_backward: Callable[[], None] | None = None) -> Callable[[], None]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> None:
        model.train()
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(logits_fn(model, pixels), labels).backward()
        if after_backward is not None:
            after_backward()
        optimizer.step()
    return step


def forward_pass(model, logits_fn: LogitsFn, pixels: Tensor) -> Callable[[], None]:
    def forward() -> None:
        model.eval()
        with torch.inference_mode():
            logits_fn(model, pixels)
    return forward


def interleaved_medians(runs: dict[str, Callable[[], float]], warmup: int, repeats: int) -> dict[str, float]:
    """Median seconds of each run, the runs taken in turn within every repeat (A B C A B C ...), so that a
    change of the machine's load falls on all of them alike. Each run returns its own elapsed seconds."""
    for run in runs.values():
        for _ in range(warmup):
            run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            times[name].append(run())
    return {name: statistics.median(values) for name, values in times.items()}


def timed(fn: Callable[[], None], threads: int | None = None) -> Callable[[], float]:
    def run() -> float:
        if threads is not None:
            torch.set_num_threads(threads)
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    return run


def load() -> str:
    return "load average " + ", ".join(f"{v:.2f}" for v in os.getloadavg())


def measure_all(variants: dict[str, tuple], args, threads: int | None = None) -> dict[str, tuple[float, float]]:
    """variants: name -> (model, logits_fn, pixels, labels); -> name -> (forward ms, training samples/s)."""
    forward = interleaved_medians({n: timed(forward_pass(m, f, x), threads) for n, (m, f, x, _) in variants.items()},
                                  args.warmup, args.repeats)
    train = interleaved_medians({n: timed(train_step(m, f, x, y), threads) for n, (m, f, x, y) in variants.items()},
                                args.warmup, args.train_repeats)
    return {n: (forward[n] * 1e3, len(x) / train[n]) for n, (_, _, x, _) in variants.items()}


# --- (a) and (b): one process ------------------------------------------------------------------------
def section_layouts(args) -> None:
    torch.set_num_threads(args.threads)
    print(f"\n### (a) layouts against the sequential model: 1 process, {args.threads} threads, batch {args.batch}\n")
    print(f"({load()})\n")
    models = {preset: build(preset) for preset in MODELS}
    variants = {p: (m, batched_logits, *make_batch(m.cfg, args.batch)) for p, m in models.items()}
    results = measure_all(variants, args)
    print("| model | branches x layers | params | forward ms | fwd vs 1x12 | train samples/s | train vs 1x12 |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    base = results[SEQUENTIAL]
    for preset, (fwd, train) in results.items():
        cfg = models[preset].cfg
        print(f"| {preset} | {cfg.num_branches} x {cfg.layers_per_branch} | "
              f"{count_trainable_parameters(models[preset]):,} | {fwd:.1f} | {base[0] / fwd:.2f}x faster | "
              f"{train:.0f} | {train / base[1]:.2f}x |")
    print(f"\n({load()})", flush=True)


def section_batching(args) -> None:
    torch.set_num_threads(args.threads)
    print(f"\n### (b) batched branches against a Python loop over the branches: 1 process, {args.threads} "
          f"threads\n")
    print(f"({load()})\n")
    print("| model | batch | loop forward ms | batched forward ms | batched speed-up | loop train samples/s | "
          "batched train samples/s | batched speed-up |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for batch in args.loop_batches:
        variants = {}
        for preset in BRANCHED:
            model = build(preset)
            pixels, labels = make_batch(model.cfg, batch)
            if not model.cfg.is_moe:  # the same logits both ways (an MoE's capacity is per routing call)
                with torch.no_grad():
                    torch.testing.assert_close(batched_logits(model.eval(), pixels), loop_logits(model, pixels),
                                               atol=1e-4, rtol=1e-4)
            variants[preset, "loop"] = (model, loop_logits, pixels, labels)
            variants[preset, "batched"] = (build(preset), batched_logits, pixels, labels)
        results = measure_all(variants, args)
        for preset in BRANCHED:
            loop, batched = results[preset, "loop"], results[preset, "batched"]
            print(f"| {preset} | {batch} | {loop[0]:.1f} | {batched[0]:.1f} | {loop[0] / batched[0]:.2f}x | "
                  f"{loop[1]:.0f} | {batched[1]:.0f} | {batched[1] / loop[1]:.2f}x |", flush=True)
    print(f"\n({load()})", flush=True)


# --- (c): branch-parallel on 2 ranks -----------------------------------------------------------------
def on_ranks(fn: Callable[[], None], ranks: tuple[int, ...], threads: int) -> Callable[[], float]:
    """A run of `fn` on `ranks` (the others wait at the next barrier, which does not spin), timed from a
    common barrier to the slower rank's end."""
    def run() -> float:
        torch_dist.barrier()
        elapsed = torch.zeros(1, dtype=torch.float64)
        if torch_dist.get_rank() in ranks:
            torch.set_num_threads(threads)
            start = time.perf_counter()
            fn()
            elapsed[0] = time.perf_counter() - start
        torch_dist.all_reduce(elapsed, op=torch_dist.ReduceOp.MAX)
        return elapsed.item()
    return run


def _rank_main(rank: int, world: int, port: int, args, result_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch_dist.init_process_group("gloo", rank=rank, world_size=world)
    results = {}
    for preset in BRANCHED:
        split = build(preset)
        parallel = BranchParallel.contiguous(split.cfg.num_branches, rank, world)
        split.encoder.branch_parallel = parallel
        whole = build(preset)  # the same weights, all branches, on rank 0 alone
        pixels, labels = make_batch(split.cfg, args.batch)
        runs = {"1 rank, 1 thread": (whole, (0,), 1, None), "1 rank, 2 threads": (whole, (0,), 2, None),
                "2 ranks": (split, (0, 1), 1, partial(parallel.all_reduce_shared_gradients, split.encoder))}
        forward = interleaved_medians({name: on_ranks(forward_pass(model, batched_logits, pixels), ranks, threads)
                                       for name, (model, ranks, threads, _) in runs.items()},
                                      args.warmup, args.repeats)
        train = interleaved_medians({name: on_ranks(train_step(model, batched_logits, pixels, labels, after),
                                                    ranks, threads)
                                     for name, (model, ranks, threads, after) in runs.items()},
                                    args.warmup, args.train_repeats)
        results[preset] = {name: (forward[name] * 1e3, args.batch / train[name]) for name in runs}
    if rank == 0:
        with open(result_path, "w") as fh:
            json.dump(results, fh)
    torch_dist.barrier()  # nobody tears the group down while the other still uses it
    torch_dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def section_branch_parallel(args) -> None:
    print(f"\n### (c) branch-parallel on 2 ranks (gloo, 1 thread each) against 1 rank, batch {args.batch}\n")
    print(f"({load()})\n")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ranks.json")
        torch_mp.spawn(_rank_main, args=(2, free_port(), args, path), nprocs=2, join=True)
        with open(path) as fh:
            results = json.load(fh)
    print("| model | branches rank 0 / 1 | forward ms: 1 rank 1 thr / 1 rank 2 thr / 2 ranks | "
          "2 ranks vs 1 thr | 2 ranks vs 2 thr | train samples/s: 1 rank 1 thr / 1 rank 2 thr / 2 ranks | "
          "2 ranks vs 1 thr | 2 ranks vs 2 thr |")
    print("| --- | --- | --- | ---: | ---: | --- | ---: | ---: |")
    for preset in BRANCHED:
        one, two, ranks = (results[preset][name] for name in ("1 rank, 1 thread", "1 rank, 2 threads", "2 ranks"))
        num_branches = VisionConfig.from_preset(preset).num_branches
        split = [len(BranchParallel.contiguous(num_branches, r, 2).branches) for r in (0, 1)]
        print(f"| {preset} | {split[0]} / {split[1]} | {one[0]:.1f} / {two[0]:.1f} / {ranks[0]:.1f} | "
              f"{one[0] / ranks[0]:.2f}x faster | {two[0] / ranks[0]:.2f}x faster | "
              f"{one[1]:.0f} / {two[1]:.0f} / {ranks[1]:.0f} | {ranks[1] / one[1]:.2f}x | {ranks[1] / two[1]:.2f}x |")
    print(f"\n({load()})", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2, help="threads of the 1-process sections (a) and (b)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=15, help="forward repeats")
    parser.add_argument("--train-repeats", type=int, default=10)
    parser.add_argument("--loop-batches", type=int, nargs="+", default=[8, 64], help="batch sizes of (b)")
    parser.add_argument("--sections", nargs="+", default=["a", "b", "c"], choices=["a", "b", "c"])
    args = parser.parse_args()
    print(f"ParaFormer speed, CPU fp32, {machine()}, {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"batch {args.batch} images of 1 x 28 x 28; warm-up {args.warmup}, median of {args.repeats} forward / "
          f"{args.train_repeats} training repeats")
    sections = {"a": section_layouts, "b": section_batching, "c": section_branch_parallel}
    for name in args.sections:
        sections[name](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
