#!/usr/bin/env bash
# The GPU set-up of docs/gpu.md proven as far as a Linux machine with the CUDA toolkit (nvcc) and no GPU allows:
#   1. `./launcher.sh setup --gpu --prebuild-ops=fused_lamb` into a venv of its own: torch's CUDA build from the
#      package registry, DeepSpeed built against it with DeepSpeed's FusedLamb compiled in (DS_BUILD_FUSED_LAMB=1),
#      DeepSpeed's CUDA check, the ops the jobs build, ds_report;
#   2. the pre-built op loaded as a job loads it, and the GPU code in it (cuobjdump);
#   3. the same op JIT-built at first use, as a job on an install without the pre-build builds it, with the lines
#      widenet-ds prints meanwhile (engine/extensions.py announce_op_builds), into a fresh folder.
# A few GB of downloads and minutes of nvcc: run by hand (not in CI), e.g.
#   WIDENET_VENV=/tmp/venv-gpu TORCH_CUDA_ARCH_LIST=9.0 bash scripts/check_gpu_install.sh 2>&1 | tee gpu-check.log
# With no GPU to detect, DeepSpeed is told its accelerator (DS_ACCELERATOR=cuda, as the set-up does) and nvcc the
# compute capability to build for (TORCH_CUDA_ARCH_LIST, default 9.0: H100/H200).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
: "${WIDENET_VENV:?set WIDENET_VENV to a venv of its own: the check installs a CUDA build of torch (GBs) into it}"
export WIDENET_VENV TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
PY="$WIDENET_VENV/bin/python"
step() { echo "== $* ($(date -u +%H:%M:%S) UTC, ${SECONDS} s in)"; }

step "machine: $(uname -m), $(nproc) cores; $(nvcc --version | tail -n 1); GPUs: $(nvidia-smi -L 2>/dev/null | wc -l)"
step "1. ./launcher.sh setup --gpu --prebuild-ops=fused_lamb"
if ! "$ROOT/launcher.sh" setup --gpu --prebuild-ops=fused_lamb; then
  # Where the toolkit check said what the build lacks (a toolkit of NVIDIA's pip packages, an nvcc wrapper on PATH):
  # its fixes, as a user would apply them, then the same command again.
  export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
  CPATH="$(ls -d "$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")"/nvidia/cu*/include | head -n 1)"
  export CPATH
  step "1b. the same with the toolkit check's fixes: CUDA_HOME=$CUDA_HOME CPATH=$CPATH"
  "$ROOT/launcher.sh" setup --gpu --prebuild-ops=fused_lamb
fi
[[ -n "$(nvidia-smi -L 2>/dev/null)" ]] || export DS_ACCELERATOR=cuda

step "2. the pre-built FusedLamb, loaded as DeepSpeed's FusedLamb optimizer loads it"
so="$("$PY" - <<'EOF'
import contextlib, sys
import torch
with contextlib.redirect_stdout(sys.stderr):
    import deepspeed
    from deepspeed.git_version_info import accelerator_name, installed_ops, torch_info
    from deepspeed.ops.op_builder import FusedLambBuilder
    module = FusedLambBuilder().load()
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), deepspeed {deepspeed.__version__}; DeepSpeed built "
      f"with accelerator {accelerator_name!r}, {torch_info}; pre-built ops: "
      f"{' '.join(op for op, built in installed_ops.items() if built)}", file=sys.stderr)
print(module.__file__)
EOF
)"
echo "$so"
if command -v cuobjdump >/dev/null; then cuobjdump --list-elf "$so" | sed 's/^/  /'
else  # a toolkit without cuobjdump: the GPU code's section, and the architecture nvcc compiled it for
  readelf -SW "$so" | grep nv_fatbin | sed 's/^/  /'
  fatbin="$(mktemp)"
  objcopy -O binary --only-section=.nv_fatbin "$so" "$fatbin"
  echo "  compiled for: $(strings -a "$fatbin" | grep -o -- '-arch sm_[0-9]*a\?' | sort -u | tr '\n' ' ')"
  rm -f "$fatbin"
fi

step "3. FusedLamb JIT-built at first use (an install without the pre-build) into a fresh TORCH_EXTENSIONS_DIR"
extensions="$(mktemp -d)"
trap 'rm -rf "$extensions"' EXIT
TORCH_EXTENSIONS_DIR="$extensions" "$PY" - <<'EOF'
import contextlib, os, sys, time
from pathlib import Path
with contextlib.redirect_stdout(sys.stderr):
    from deepspeed.ops.op_builder import FusedLambBuilder
from widenet_ds.engine.extensions import announce_op_builds
announce_op_builds(lambda line: print(f"widenet-ds: {line}", flush=True))
start = time.monotonic()
builder = FusedLambBuilder()
builder.jit_load(verbose=False)
built = sorted(str(p) for p in Path(os.environ["TORCH_EXTENSIONS_DIR"]).rglob("*.so"))
print(f"JIT-built in {time.monotonic() - start:.0f} s: {' '.join(built)}")
EOF
step "done"
