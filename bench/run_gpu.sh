#!/usr/bin/env bash
# Every GPU benchmark in one call on a lent CUDA machine (no network there): installs the carried
# wheels (.whl: deepspeed 0.19.8 built here with `pip wheel deepspeed==0.19.8 --no-deps
# --no-build-isolation -w .whl`, plus hjson, pydantic, pydantic_core, annotated-types,
# typing-inspection), then runs the benchmarks and writes each table to $OUT/<name>.txt.
#   bash bench/run_gpu.sh a    # GEMM peaks, LAMB, MoE breakdown, bf16 training steps, profiles
#   bash bench/run_gpu.sh b    # fp32 training steps, torch.compile bf16 steps
#   bash bench/run_gpu.sh c    # issue 12's must-shows: sync-free step check, MoE layer vs its grouped-GEMM limit
#                              # (eager + compiled), MFU at micro-batch 64 and 256 eager + compiled with HF
#                              # ALBERT side by side, LAMB foreach vs FusedLamb
set -u
OUT=${OUT:-/tmp/widenet-bench}
mkdir -p "$OUT"
if [ ! -d /tmp/site/deepspeed ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16
run() { name=$1; shift; echo "== $name: $*"; python3 "$@" > "$OUT/$name.txt" 2> "$OUT/$name.err"; rc=$?;
        grep -v -E "^\[|^Using |^No existing|^Emitting|^Building|^Loading|^Time to load" "$OUT/$name.txt";
        [ $rc -ne 0 ] && tail -30 "$OUT/$name.err"; return $rc; }
case "${1:-a}" in
  a)
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv
    python3 -c "import sys; sys.path.insert(0, '.'); import torch; from bench.common import gemm_peak_flops as g; \
print(f'GEMM peak 8192^3: fp32 {g(torch.float32)/1e12:.1f} TFLOP/s, tf32 off; bf16 {g(torch.bfloat16)/1e12:.1f} TFLOP/s')"
    opt=fused-lamb
    if [ -z "${SKIP_LAMB:-}" ]; then run lamb bench/bench_lamb.py --preset widenet-base-e4 || opt=torch-lamb; fi
    run moe_bf16 bench/bench_moe_layer.py --tokens 2048 8192 32768 --experts 4 8 --dtype bf16 --warmup 3 --repeats ${MOE_REPEATS:-10}
    run step_bf16 bench/bench_train_step.py --batch 64 --seq 128 --dtype bf16 --warmup 5 --repeats 20 \
        --optimizer $opt --json "$OUT/step_bf16.json"
    for m in ${PROFILE_MODELS:-widenet-base-e4 widenet-base-e4-dropless}; do
      run "profile_$m" bench/profile_step.py $m --batch 64 --dtype bf16 --optimizer $opt --top 15
    done
    ;;
  b)
    opt=fused-lamb
    python3 -c "from deepspeed.ops.lamb import FusedLamb" 2>/dev/null || opt=torch-lamb
    run step_fp32 bench/bench_train_step.py --batch 64 --seq 128 --dtype fp32 --warmup 3 --repeats 10 \
        --models hf-albert albert-base widenet-base-e4 widenet-base-e4-dropless --optimizer $opt
    run moe_fp32 bench/bench_moe_layer.py --tokens 8192 --experts 4 --dtype fp32 --warmup 3 --repeats 10
    run step_bf16_compile bench/bench_train_step.py --batch 64 --seq 128 --dtype bf16 --warmup 5 --repeats 20 \
        --models hf-albert albert-base widenet-base-e4-dropless --optimizer $opt --compile
    ;;
  c)
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv
    python3 -c "import sys; sys.path.insert(0, '.'); import torch; from bench.common import gemm_peak_flops as g; \
print(f'GEMM peak 8192^3: bf16 {g(torch.bfloat16)/1e12:.1f} TFLOP/s')"
    run sync_check bench/check_sync.py --preset widenet-base-e4 --batch 64
    opt=fused-lamb
    run lamb bench/bench_lamb.py --preset widenet-base-e4 || opt=torch-lamb
    run moe_bf16 bench/bench_moe_layer.py --tokens 8192 --experts 4 8 --dtype bf16 --warmup 3 \
        --repeats ${MOE_REPEATS:-10} --compile
    run step_bf16_64_256 bench/bench_train_step.py --batch 64 256 --seq 128 --dtype bf16 --warmup 5 --repeats 20 \
        --eager-and-compiled --optimizer $opt --json "$OUT/step_bf16_64_256.json" --one-at-a-time \
        --models ${STEP_MODELS:-hf-albert albert-base widenet-base-e4 widenet-base-e4-compact widenet-base-e4-dropless}
    ;;
esac
