#!/usr/bin/env bash
# `./launcher.sh setup --gpu [--prebuild-ops[=OPS]]`: the set-up of a Linux GPU node (docs/gpu.md). The pinned
# torch as a CUDA build, the pinned DeepSpeed built against it (so it records that torch, its CUDA and the
# accelerator), widenet-ds; then the CUDA toolkit the op builds need checked by DeepSpeed's own rule, the ops the
# jobs will build, and `ds_report`. --prebuild-ops builds DeepSpeed ops into the install with DeepSpeed's own
# DS_BUILD_* switches (default fused_lamb,fused_adam), so no job compiles at its start.
# Environment: WIDENET_VENV (.venv); WIDENET_TORCH_INDEX: a package index of other CUDA builds of torch (one for an
# older driver, docs/gpu.md); TORCH_CUDA_ARCH_LIST: the GPUs' compute capabilities for --prebuild-ops (default: the
# GPUs this node shows; needed where it shows none); CUDA_HOME: the toolkit (default: torch's search, nvcc on PATH).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${WIDENET_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
say() { echo "[setup --gpu] $*" >&2; }
die() { say "$*"; exit 2; }

PREBUILD=""
for arg in "$@"; do
  case "$arg" in
    --prebuild-ops) PREBUILD="fused_lamb,fused_adam" ;;
    --prebuild-ops=*) PREBUILD="${arg#*=}" ;;
    *) die "unknown option '$arg'; usage: ./launcher.sh setup --gpu [--prebuild-ops[=fused_lamb,fused_adam,...]]" ;;
  esac
done
[[ -z "$PREBUILD" || "$PREBUILD" =~ ^[a-z_]+(,[a-z_]+)*$ ]] ||
  die "--prebuild-ops=$PREBUILD: give DeepSpeed's op names, comma-separated (ds_report lists them), e.g. fused_lamb,fused_adam"
[[ "$(uname -s)" == Linux ]] || die "the GPU set-up is for Linux GPU nodes (CUDA builds of torch); this is $(uname -s)"
pin() { sed -n "s/^ *\"$1==\([^\"]*\)\",.*/\1/p" "$ROOT/pyproject.toml"; }
TORCH="$(pin torch)" DEEPSPEED="$(pin deepspeed)"
[[ -n "$TORCH" && -n "$DEEPSPEED" ]] || die "pyproject.toml pins no torch==/deepspeed== (found '$TORCH', '$DEEPSPEED')"

command -v python3.11 >/dev/null 2>&1 && BASE_PY=python3.11 || BASE_PY=python3
[[ -x "$PY" ]] || { say "creating $VENV"; "$BASE_PY" -m venv "$VENV"; }
# DeepSpeed is built below in this environment itself (--no-build-isolation): its build tools first
"$PY" -m pip install --quiet --upgrade pip setuptools wheel ninja

# torch: `===` takes the registry's own build of the pin, a CUDA build on Linux, never a local `+cpu` build that a
# find-links folder or a CPU set-up offers; another index (PyTorch's, per CUDA version) labels its builds `+cuXYZ`.
if [[ -n "${WIDENET_TORCH_INDEX:-}" ]]; then torch_req=("torch==$TORCH" --index-url "$WIDENET_TORCH_INDEX")
else torch_req=("torch===$TORCH"); fi
if "$PY" -W ignore -c "import torch, sys; sys.exit(torch.version.cuda is not None)" 2>/dev/null; then
  say "replacing the CPU build of torch in $VENV"; "$PY" -m pip uninstall --quiet -y torch
fi
say "installing ${torch_req[*]} (a CUDA build: a few GB)"
"$PY" -m pip install --quiet "${torch_req[@]}"
TORCH_CUDA="$("$PY" -W ignore -c "import torch; print(torch.version.cuda or '')")"
[[ -n "$TORCH_CUDA" ]] || die "the torch installed ($("$PY" -W ignore -c "import torch; print(torch.__version__)")) is a CPU \
build; set WIDENET_TORCH_INDEX to an index of CUDA builds, or remove the pip option that offers a CPU one"
GPUS="$("$PY" -W ignore -c "import torch; print(torch.cuda.device_count())")"
say "torch $("$PY" -W ignore -c "import torch; print(torch.__version__)"), built with CUDA $TORCH_CUDA; GPUs visible here: $GPUS"
# Where this node shows no GPU (a login node), DeepSpeed would take its CPU accelerator: build and report for CUDA.
[[ "$GPUS" != 0 ]] || export DS_ACCELERATOR=cuda

# DeepSpeed from its source against this torch (with build isolation it builds against none and records a CPU
# accelerator); --no-cache-dir: a wheel pip built earlier, without these switches, is not reused.
ds_install() { "$PY" -m pip install --quiet --no-build-isolation --no-cache-dir "$@" "deepspeed==$DEEPSPEED"; }
say "installing deepspeed==$DEEPSPEED (ops built at their first use) and widenet-ds"
DS_BUILD_OPS=0 ds_install
"$PY" -m pip install --quiet -e "$ROOT"

# The toolkit every op build uses, at install or at a job's start (scripts/gpu_toolkit.py: DeepSpeed's CUDA check,
# the headers and library the build needs); each problem is said with its fix.
TOOLKIT_OK=1
"$PY" -W ignore "$ROOT/scripts/gpu_toolkit.py" || TOOLKIT_OK=0

if [[ -n "$PREBUILD" ]]; then
  [[ "$TOOLKIT_OK" == 1 ]] || die "--prebuild-ops needs a toolkit that builds the ops: see the lines above"
  "$PY" -W ignore - "${PREBUILD//,/ }" <<'EOF' || die "--prebuild-ops=$PREBUILD: see the line above"
import contextlib, sys
with contextlib.redirect_stdout(sys.stderr):
    from deepspeed.ops.op_builder.all_ops import ALL_OPS
unknown = [op for op in sys.argv[1].split() if op not in ALL_OPS]
if unknown:
    print(f"[setup --gpu] not DeepSpeed ops: {' '.join(unknown)}; its ops: {' '.join(sorted(ALL_OPS))}", file=sys.stderr)
sys.exit(bool(unknown))
EOF
  if [[ -z "${TORCH_CUDA_ARCH_LIST:-}" ]]; then
    [[ "$GPUS" != 0 ]] || die "this node shows no GPU: set TORCH_CUDA_ARCH_LIST to the compute capabilities of the \
compute nodes' GPUs (e.g. 8.0 A100, 9.0 H100/H200, 10.0 B200; several: \"8.0;9.0\")"
    TORCH_CUDA_ARCH_LIST="$("$PY" -c "import torch; print(';'.join(sorted({'%d.%d' % torch.cuda.get_device_capability(i)
for i in range(torch.cuda.device_count())})))")"
  fi
  export TORCH_CUDA_ARCH_LIST
  switches=()
  for op in ${PREBUILD//,/ }; do switches+=("DS_BUILD_${op^^}=1"); done
  log="$VENV/deepspeed-build.log"
  say "pre-building ${PREBUILD//,/ } for compute capabilities $TORCH_CUDA_ARCH_LIST: ${switches[*]} (minutes; $log)"
  env DS_BUILD_OPS=0 "${switches[@]}" "$PY" -m pip install -v --no-build-isolation --no-cache-dir --force-reinstall \
    --no-deps "deepspeed==$DEEPSPEED" > "$log" 2>&1 || { tail -n 40 "$log" >&2; die "the pre-build failed: $log"; }
  "$PY" - "${PREBUILD//,/ }" <<'EOF' || { tail -n 40 "$log" >&2; die "DeepSpeed skipped an op asked for: $log"; }
import sys
from deepspeed.git_version_info import installed_ops
missing = [op for op in sys.argv[1].split() if not installed_ops.get(op)]
print(f"[setup --gpu] pre-built: {' '.join(op for op in sys.argv[1].split() if op not in missing) or 'none'}"
      + (f"; not built: {' '.join(missing)} (DeepSpeed's log says why)" if missing else ""), file=sys.stderr)
sys.exit(bool(missing))
EOF
fi

"$PY" "$ROOT/scripts/gpu_ops.py" >&2
say "ds_report (DeepSpeed's own report: each op's 'installed' column says pre-built, 'compatible' buildable here):"
"$VENV/bin/ds_report" >&2
sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1 > "$VENV/.widenet-setup"  # `./launcher.sh setup` then stands
