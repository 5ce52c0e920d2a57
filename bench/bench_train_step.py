"""Training-step throughput, model FLOPs, MFU and peak memory per token: ours against HF ALBERT.

Every model runs through the same DeepSpeed engine and the same LAMB (`--optimizer`: DeepSpeed's fused
`Lamb`, the default on CUDA, or `widenet_ds.engine.lamb.Lamb`, the only one on CPU), on the same random batch
shape, in a worker process of its own (so peak memory is that model's). A step is forward + backward +
optimizer step; tokens/s is micro-batch x seq_len over the median step time. The models' steps take turns
(A B C D A B C D ..., bench/workers.py) after each has warmed up, so that a change of the machine's load falls
on all of them alike. On CPU each worker runs with the allocator a `widenet-ds launch` rank gets (`--malloc
launcher`: tcmalloc where installed, else glibc keeping freed memory; launch/host_allocator.py), or with
glibc's default, glibc keeping freed memory, or tcmalloc: several side by side with `--malloc default launcher`
etc. MFU is the model's training FLOPs (widenet_ds.model.counts: K routes per token, capacity
padding NOT counted, MLM logits over all positions) per second over a large matmul's FLOP/s timed in the same
run, in the same dtype.

    python bench/bench_train_step.py --batch 8 --seq 128 --warmup 3 --repeats 5          # CPU
    python bench/bench_train_step.py --models albert-base widenet-base-e8 --malloc default glibc tcmalloc
    python bench/bench_train_step.py --batch 64 256 --seq 128 --dtype bf16 --warmup 5 --repeats 20 \
        --eager-and-compiled                                                             # GPU, issue 12
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import gemm_peak_flops, init_single_rank, machine, sync  # noqa: E402
from bench.workers import Worker, interleave, serve, timed  # noqa: E402

# name -> (preset, MoEConfig overrides); "hf-albert" is transformers' AlbertForPreTraining.
MODELS = {
    "hf-albert": ("albert-base", {}),
    "albert-base": ("albert-base", {}),
    "widenet-base-e4": ("widenet-base-e4", {"dispatch": "deepspeed"}),
    "widenet-base-e4-dropless": ("widenet-base-e4", {"dispatch": "dropless"}),
    "widenet-base-e8": ("widenet-base-e8", {"dispatch": "deepspeed"}),
    "widenet-base-e8-dropless": ("widenet-base-e8", {"dispatch": "dropless"}),
    # DeepSpeed's capacity and drops (the capacity path's routing), only the kept routes computed
    "widenet-base-e4-compact": ("widenet-base-e4", {"dispatch": "compact"}),
    "widenet-base-e8-compact": ("widenet-base-e8", {"dispatch": "compact"}),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
MALLOC = ("launcher", "default", "glibc", "tcmalloc")


def _build(name: str, compile_model: bool, **dims):
    """(config, model, batch -> forward kwargs) of MODELS[name]; `dims` override the preset's fields."""
    from widenet_ds.model.config import ModelConfig
    from widenet_ds.model.widenet import WideNetForPreTraining
    preset, moe = MODELS[name]
    cfg = ModelConfig.from_preset(preset, moe=moe, **dims)
    if name == "hf-albert":
        import transformers
        hf_cfg = transformers.AlbertConfig(
            vocab_size=cfg.vocab_size, embedding_size=cfg.embedding_size, hidden_size=cfg.hidden_size,
            num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
            intermediate_size=cfg.intermediate_size, hidden_act="gelu", hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0, classifier_dropout_prob=cfg.classifier_dropout,
            max_position_embeddings=cfg.max_position_embeddings, num_hidden_groups=1, inner_group_num=1,
            layer_norm_eps=cfg.layer_norm_eps, attn_implementation="sdpa")
        model = transformers.AlbertForPreTraining(hf_cfg)
        kwargs = lambda b: dict(input_ids=b["input_ids"], token_type_ids=b["token_type_ids"],  # noqa: E731
                                attention_mask=b["attention_mask"], labels=b["mlm_labels"],
                                sentence_order_label=b["sop_labels"])
    else:
        model = WideNetForPreTraining(cfg)
        kwargs = lambda b: b  # noqa: E731
    if compile_model:
        model.compile()
    return cfg, model, kwargs


def zero_stage(dtype: str) -> int:
    # DeepSpeed's bf16 master-weight optimizer comes with ZeRO (stage 1, as ds_configs/*_bf16.json); fp32 needs none.
    return 1 if dtype == "bf16" else 0


def _engine(model, dtype: str, micro_batch: int, optimizer_name: str):
    import deepspeed

    from widenet_ds.engine.lamb import Lamb, build_param_groups
    groups = build_param_groups(model, weight_decay=0.01)
    config = {"train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": 1,
              "steps_per_print": 10 ** 9, "gradient_clipping": 1.0, "zero_allow_untested_optimizer": True,
              "bf16": {"enabled": dtype == "bf16"}, "zero_optimization": {"stage": zero_stage(dtype)}}
    optimizer = None
    lamb = {"lr": 1e-4, "weight_decay": 0.01, "betas": [0.9, 0.999], "eps": 1e-6}
    if optimizer_name == "fused-lamb":
        config["optimizer"] = {"type": "Lamb", "params": lamb}   # DeepSpeed's fused CUDA kernel
    else:
        optimizer = Lamb(groups, **lamb)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, optimizer=optimizer, config=config)
    return engine


def _batch(vocab: int, batch: int, seq: int, dev: torch.device) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (batch, seq), generator=gen)
    types = torch.zeros_like(ids)
    types[:, seq // 2:] = 1
    labels = torch.where(torch.rand(batch, seq, generator=gen) < 0.15, ids, torch.full_like(ids, -100))
    sop = torch.randint(0, 2, (batch,), generator=gen)
    batch_ = dict(input_ids=ids, token_type_ids=types, attention_mask=torch.ones_like(ids), mlm_labels=labels,
                  sop_labels=sop)
    return {k: v.to(dev) for k, v in batch_.items()}


def worker(args) -> None:
    """One model in this process: warms up, then times one step per request of the driver (bench/workers.py);
    its closing result holds the FLOPs, peak memory and losses."""
    from widenet_ds.model.counts import flops_per_token
    init_single_rank()
    torch.manual_seed(0)
    cfg, model, kwargs = _build(args.worker, args.compile)
    engine = _engine(model, args.dtype, args.batch, args.optimizer)
    batch = kwargs(_batch(cfg.vocab_size, args.batch, args.seq, engine.device))
    losses = []

    def step():
        loss = engine(**batch).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.detach())

    if torch.cuda.is_available():
        step()  # allocator and kernels warm before the peak is tracked
        torch.cuda.reset_peak_memory_stats()
    for _ in range(args.warmup):
        step()

    def result() -> dict:
        sync()
        if torch.cuda.is_available():
            peak = torch.cuda.max_memory_allocated()
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # whole-process RSS, bytes
        flops = flops_per_token(cfg, args.seq)
        padded = flops_per_token(cfg, args.seq, capacity_padding=True, tokens_per_call=args.batch * args.seq) \
            if cfg.is_moe and cfg.moe.dispatch == "deepspeed" else flops
        return dict(model=args.worker, train_flops_per_token=flops.training,
                    padded_train_flops_per_token=padded.training, peak_bytes=peak, final_loss=float(losses[-1]),
                    finite=bool(all(torch.isfinite(l) for l in losses)))

    serve({}, lambda: timed(step, sync), result)


def _start(args, name: str, batch: int, compiled: bool, malloc: str, env: dict[str, str]) -> Worker | None:
    argv = [os.path.abspath(__file__), "--worker", name, "--batch", str(batch), "--seq", str(args.seq),
            "--dtype", args.dtype, "--warmup", str(args.warmup), "--optimizer", args.optimizer] + \
        (["--compile"] if compiled else [])
    try:
        return Worker(f"{name} batch {batch}{' compiled' if compiled else ''} malloc {malloc}", argv, env=env)
    except RuntimeError as err:  # the worker died during its set-up; the others still run
        print(f"{err}: FAILED", file=sys.stderr)
        return None


def _malloc_env(malloc: str) -> dict[str, str]:
    from widenet_ds.launch.host_allocator import allocator_env, find_tcmalloc
    tcmalloc = find_tcmalloc()
    if malloc == "tcmalloc" and tcmalloc is None:
        sys.exit("--malloc tcmalloc: tcmalloc is not installed (Debian: apt-get install libtcmalloc-minimal4)")
    return {"launcher": allocator_env({}, tcmalloc), "default": {}, "glibc": allocator_env({}, None),
            "tcmalloc": allocator_env({}, tcmalloc)}[malloc]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--batch", type=int, nargs="+", default=[8],
                        help="micro-batch sizes, each a table (issue 12: --batch 64 256 on a GPU)")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--dtype", choices=list(DTYPES), default="fp32")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--optimizer", choices=("fused-lamb", "torch-lamb"),
                        default="fused-lamb" if torch.cuda.is_available() else "torch-lamb",
                        help="DeepSpeed's fused CUDA Lamb (CUDA only) or widenet_ds.engine.lamb.Lamb")
    parser.add_argument("--compile", action="store_true", help="torch.compile each model (ours and HF's)")
    parser.add_argument("--eager-and-compiled", action="store_true",
                        help="every model eager and compiled, side by side in the same run")
    parser.add_argument("--one-at-a-time", action="store_true",
                        help="run the models one after another instead of interleaved (when memory holds one only)")
    parser.add_argument("--malloc", nargs="+", choices=MALLOC, default=["launcher"],
                        help="the workers' allocator on CPU: as `widenet-ds launch` gives CPU ranks, glibc's "
                             "default, glibc keeping freed memory, tcmalloc; several: side by side")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--worker", choices=list(MODELS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.batch = args.batch[0]
        worker(args)
        return 0

    malloc_env = {m: {} if torch.cuda.is_available() else _malloc_env(m) for m in args.malloc}  # refused early
    peak = gemm_peak_flops(DTYPES[args.dtype])
    modes = [False, True] if args.eager_and_compiled else [args.compile]
    # Groups of models resident at once, their steps interleaved: the models of one batch size and mode (each
    # model alone with --one-at-a-time, where memory holds one only).
    groups = [[(name, batch, compiled, malloc) for malloc in args.malloc for name in args.models]
              for batch in args.batch for compiled in modes]
    if args.one_at_a_time:
        groups = [[run] for group in groups for run in group]
    results = []
    for group in groups:
        workers = {run: w for run in group if (w := _start(args, *run, malloc_env[run[-1]])) is not None}
        interleave(list(workers.values()), args.repeats)
        for (name, batch, compiled, malloc), w in workers.items():
            seconds = w.median()
            results.append(dict(w.finish(), batch=batch, compiled=compiled, malloc=malloc, seconds=seconds,
                                tokens_per_s=batch * args.seq / seconds))

    print(f"\n# Training step: {machine()}; {args.dtype}, seq {args.seq}, median of {args.repeats} interleaved "
          f"steps after {args.warmup} warm-up; load average {os.getloadavg()[0]:.1f}; GEMM peak {peak / 1e12:.2f} TFLOP/s ({args.dtype}); optimizer {args.optimizer}, "
          f"ZeRO stage {zero_stage(args.dtype)}; malloc " + ", ".join(f"{m} {env or 'unchanged'}"
                                                                      for m, env in malloc_env.items()))
    print(f"{'model':<26}{'batch':>6}{'mode':>9}{'malloc':>9}{'step ms':>10}{'tokens/s':>11}{'GFLOP/tok':>11}{'+padding':>10}"
          f"{'TFLOP/s':>9}{'MFU':>7}{'peak MiB':>10}{'KiB/tok':>9}{'loss':>8}")
    for r in results:
        achieved = r["train_flops_per_token"] * r["tokens_per_s"]
        tokens = r["batch"] * args.seq
        print(f"{r['model']:<26}{r['batch']:>6}{'compiled' if r['compiled'] else 'eager':>9}{r['malloc']:>9}"
              f"{r['seconds'] * 1e3:>10.1f}{r['tokens_per_s']:>11.0f}"
              f"{r['train_flops_per_token'] / 1e9:>11.3f}{r['padded_train_flops_per_token'] / 1e9:>10.3f}"
              f"{achieved / 1e12:>9.2f}{achieved / peak:>7.1%}{r['peak_bytes'] / 2**20:>10.0f}"
              f"{r['peak_bytes'] / tokens / 1024:>9.1f}{r['final_loss']:>8.3f}" + ("" if r["finite"] else "  NaN!"))
    print("(GFLOP/tok: training FLOPs per token, K routes, no capacity padding; +padding: with DeepSpeed's "
          "capacity slots; MFU from the first; peak: GPU max allocated, or process max RSS on CPU)")

    for batch in args.batch:
        for malloc in args.malloc:
            runs = [r for r in results if r["batch"] == batch and r["malloc"] == malloc]
            for compiled in modes:
                _ratios({r["model"]: r for r in runs if r["compiled"] == compiled},
                        f"batch {batch}, {'compiled' if compiled else 'eager'}, malloc {malloc}")
            if len(modes) == 2:
                eager = {r["model"]: r for r in runs if not r["compiled"]}
                comp = {r["model"]: r for r in runs if r["compiled"]}
                print("  compiled / eager tokens/s: " + ", ".join(
                    f"{m} {comp[m]['tokens_per_s'] / eager[m]['tokens_per_s']:.2f}" for m in eager if m in comp))
        default = {(r["model"], r["compiled"]): r for r in results if r["batch"] == batch and r["malloc"] == "default"}
        for malloc in (m for m in args.malloc if m != "default" and default):
            print(f"\n{malloc} / default malloc tokens/s (batch {batch}): " + ", ".join(
                f"{r['model']}{' compiled' if r['compiled'] else ''} {r['tokens_per_s'] / d['tokens_per_s']:.3f}"
                for r in results if r["batch"] == batch and r["malloc"] == malloc
                and (d := default.get((r["model"], r["compiled"])))))
    if args.json:
        with open(f"{args.json}.tmp", "w") as fh:
            json.dump(dict(machine=machine(), args=vars(args), gemm_peak=peak, results=results), fh, indent=1)
        os.replace(f"{args.json}.tmp", args.json)
    return 0


def _ratios(by_name: dict[str, dict], label: str) -> None:
    def ratio(a: str, b: str) -> float | None:
        return by_name[a]["tokens_per_s"] / by_name[b]["tokens_per_s"] if a in by_name and b in by_name else None

    print(f"\nratios ({label})")
    if (r := ratio("albert-base", "hf-albert")) is not None:
        print(f"  albert-base / HF AlbertForPreTraining tokens/s      = {r:.3f}   (target >= 1.0)")
    for moe in (name for name in MODELS if name.startswith("widenet-")):
        if (r := ratio(moe, "albert-base")) is not None:
            ideal = by_name["albert-base"]["train_flops_per_token"] / by_name[moe]["train_flops_per_token"]
            print(f"  {moe} / albert-base tokens/s = {r:.3f}; FLOP-ideal {ideal:.3f}; "
                  f"fraction of ideal = {r / ideal:.3f}   (target >= 0.90)")
    for experts in ("e4", "e8"):
        for dispatch in ("dropless", "compact"):
            if (r := ratio(f"widenet-base-{experts}-{dispatch}", f"widenet-base-{experts}")) is not None:
                print(f"  widenet-base-{experts}: {dispatch} / capacity-1.2 tokens/s = {r:.3f}   (target >= 1.0)")

if __name__ == "__main__":
    sys.exit(main())
