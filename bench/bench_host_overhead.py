"""Host overhead of a training step: operators per step and host time per tiny step, ours against HF ALBERT.

What made WideNet launch-bound on an H100 (issue 26: 4,749 kernel launches and 41 ms of GPU work in a 96 ms
step) is the number of operators and the host time each costs (Python, dispatcher), which are the same on any
host. So the models run at tiny dimensions with the base presets' structure (12 blocks, 4 or 8 experts, K 2,
C 1.2, the paper's noise), `--dims`:

* `tiny` (issue 26's): H 64, F 128, 4 heads, E_emb 32, vocab 1,000; batch 2 x 32. Compute is small but not
  ~0 for the MoE: its 72 expert GEMMs per step (2.4x the FFN's FLOPs) take ~20 us each on a 2020s x86 core,
  ~1.5-2 ms of a ~11 ms step.
* `compute-free`: H 16, F 32, 2 heads, E_emb 16, vocab 1,000; batch 1 x 16: every operator is at its
  fixed cost, so the times are host time only.


* ops: operators of one forward + backward (loss.backward(), gradients None before), and of one optimizer
  step (our LAMB, multi-tensor), counted by `widenet_ds.engine.op_count.count_ops` (leaves of the aten
  call tree plus torch.compile's generated kernels; views and metadata left out). Exact from run to run.
* host ms: wall time of one forward + backward on 1 thread, the median of `--repeats` repeats that take
  turns (A B C D A B C D ...) so that the machine's load falls on every variant alike.

`--dtype bf16` runs the models in bf16: the dtype in which torch.compile takes `torch._grouped_mm` itself, so
the expert-sorted dispatches (dropless, compact) compile to the operator structure they have on a GPU; in fp32
they go through the `widenet_ds::grouped_mm` custom op (~40 us of Python dispatch per call on the host).

Every model runs eager and compiled (torch.compile, inductor: HF's `model.compile()`, ours
`compile_for_training(model, "model")` or `"blocks"`), side by side in one process; ratios are to HF ALBERT
in the same mode. The build of each compiled model is timed apart (its first calls).

    python bench/bench_host_overhead.py --repeats 60
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.workers import Worker, interleave, serve, use_checkout  # noqa: E402

# --dims: (model dimensions, batch, seq)
DIMS = {
    "tiny": (dict(hidden_size=64, intermediate_size=128, num_heads=4, embedding_size=32, vocab_size=1000), 2, 32),
    "compute-free": (dict(hidden_size=16, intermediate_size=32, num_heads=2, embedding_size=16, vocab_size=1000),
                     1, 16),
}
# WideNet in each dispatch: compact (the default), DeepSpeed's capacity path, dropless
DEFAULT_MODELS = ("hf-albert", "albert-base", "widenet-base-e4-compact", "widenet-base-e4", "widenet-base-e4-dropless",
                  "widenet-base-e8-compact", "widenet-base-e8", "widenet-base-e8-dropless")
MODES = ("eager", "model", "blocks")
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


class Variant:
    """One model in one mode, in a worker: its step functions and its counts."""

    def __init__(self, name: str, mode: str, dims: dict, batch: int, seq: int, dtype: str = "fp32") -> None:
        import torch

        from bench.bench_train_step import _batch, _build
        from widenet_ds.engine.compile import compile_for_training
        from widenet_ds.engine.lamb import Lamb, build_param_groups
        from widenet_ds.engine.op_count import count_ops
        self.label = f"{name} {mode}"
        torch.manual_seed(0)
        cfg, self.model, kwargs = _build(name, compile_model=False, **dims)
        self.model.to(getattr(torch, DTYPES[dtype])).train()
        if mode != "eager":
            if name == "hf-albert":
                self.model.compile()
            else:
                compile_for_training(self.model, mode)
        self.batch = kwargs(_batch(cfg.vocab_size, batch, seq, torch.device("cpu")))
        self.optimizer = Lamb(build_param_groups(self.model, weight_decay=0.01), lr=1e-4, weight_decay=0.01)
        start = time.perf_counter()
        for _ in range(2):  # builds the compiled graphs (forward, backward), fills the optimizer state
            self.forward_backward()
            self.optimizer.step()
        self.build_seconds = time.perf_counter() - start
        ops, optimizer_ops = count_ops(self.forward_backward), count_ops(self.optimizer.step)
        self.counts = dict(ops=ops.total, optimizer_ops=optimizer_ops.total, build_seconds=self.build_seconds,
                           top=ops.ops.most_common())

    def forward_backward(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.model(**self.batch).loss.backward()

    def time_step(self) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        start = time.perf_counter()
        self.model(**self.batch).loss.backward()
        return time.perf_counter() - start


def worker(args) -> None:
    """All variants of one checkout in this process; each step times one forward + backward of each."""
    use_checkout()
    import torch

    from bench.common import init_single_rank
    from widenet_ds.engine.op_count import record_compiled_kernels
    torch.set_num_threads(1)
    torch._dynamo.config.cache_size_limit = 64  # several models of one class compiled in one process
    record_compiled_kernels()
    init_single_rank()
    variants = [Variant(name, mode, DIMS[args.dims][0], args.batch, args.seq, args.dtype)
                for mode in args.modes for name in args.models]
    serve({v.label: v.counts for v in variants}, lambda: {v.label: v.time_step() for v in variants}, dict)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    parser.add_argument("--modes", nargs="+", default=["eager", "model"], choices=MODES,
                        help="eager and torch.compile modes (HF ALBERT: any compile mode is its model.compile())")
    parser.add_argument("--dims", choices=list(DIMS), default="tiny",
                        help="model dimensions (and batch x seq): issue 26's tiny ones, or compute-free")
    parser.add_argument("--dtype", choices=list(DTYPES), default="fp32",
                        help="the models' weights and activations; bf16: the dtype whose expert-sorted dispatches "
                             "compile to `torch._grouped_mm` itself, as on a GPU (fp32 goes through a custom op)")
    parser.add_argument("--batch", type=int, help="default: the --dims' batch")
    parser.add_argument("--seq", type=int, help="default: the --dims' sequence length")
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--checkout", action="append", metavar="LABEL=DIR",
                        help="compare checkouts of the code (widenet_ds imported from DIR), interleaved; "
                             "default: this one")
    parser.add_argument("--top", type=int, default=0, help="also print the N most frequent operators per variant")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    _, default_batch, default_seq = DIMS[args.dims]
    args.batch, args.seq = args.batch or default_batch, args.seq or default_seq
    if args.worker:
        worker(args)
        return 0

    from bench.common import machine
    checkouts = [c.split("=", 1) for c in args.checkout] if args.checkout else [["", None]]
    argv = [os.path.abspath(__file__), "--worker", "--models", *args.models, "--modes", *args.modes,
            "--dims", args.dims, "--batch", str(args.batch), "--seq", str(args.seq), "--dtype", args.dtype]
    # One compile thread: no pool of compile processes per worker.
    workers = [Worker(label, argv, checkout, env={"TORCHINDUCTOR_COMPILE_THREADS": "1"})
               for label, checkout in checkouts]
    interleave(workers, args.repeats)
    for w in workers:
        w.finish()

    print(f"\n# Host overhead: {machine()}, 1 thread; {args.dims} dims {DIMS[args.dims][0]}, batch {args.batch} x {args.seq}, {args.dtype}; "
          f"host ms = median of {args.repeats} interleaved forward + backward; {time.strftime('%Y-%m-%d %H:%M')}")
    width = max(10, *(len(w.label) + 2 for w in workers))
    print(f"{'checkout':<{width}}{'model':<26}{'mode':>7}{'fwd+bwd ops':>12}{'x HF':>7}{'opt ops':>9}{'host ms':>9}"
          f"{'x HF':>7}{'p25-p75 ms':>14}{'build s':>9}")
    for w in workers:
        for label, counts in w.info.items():
            name, mode = label.split()
            hf = w.info.get(f"hf-albert {mode}")
            median = w.median(label)
            hf_median = w.median(f"hf-albert {mode}") if hf else float("nan")
            quartiles = statistics.quantiles([t[label] for t in w.times], n=4)
            print(f"{w.label:<{width}}{name:<26}{mode:>7}{counts['ops']:>12,}"
                  f"{counts['ops'] / hf['ops'] if hf else float('nan'):>7.2f}{counts['optimizer_ops']:>9,}"
                  f"{median * 1e3:>9.1f}{median / hf_median:>7.2f}"
                  f"{quartiles[0] * 1e3:>7.1f}-{quartiles[2] * 1e3:<6.1f}{counts['build_seconds']:>9.1f}")
    if args.top:
        for w in workers:
            for label, counts in w.info.items():
                common = ", ".join(f"{name} {n}" for name, n in counts["top"][:args.top])
                print(f"\n{w.label} {label}: {common}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
