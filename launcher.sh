#!/usr/bin/env bash
# widenet-ds launcher: set-up (the virtual environment must exist before Python does), the tests, and the
# demos; every other command is `widenet-ds` (widenet_ds/cli.py). `./launcher.sh --help` lists them.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${WIDENET_VENV:-$ROOT/.venv}"; PY="$VENV/bin/python" WDS="$VENV/bin/widenet-ds"
export WIDENET_SHARED_DATA="${WIDENET_SHARED_DATA:-$(dirname "$ROOT")/shared/data}"

usage() { cat <<'EOF_USAGE'
usage: ./launcher.sh <command> [options]
  setup [--gpu [--prebuild-ops]]  create .venv, install widenet-ds and its pins (idempotent); --gpu: docs/gpu.md
  demo [OPTIONS]         set up, then `widenet-ds demo`: pretrain widenet-tiny-e4 on the embedded corpus on 2 CPU
                         ranks (expert parallelism 2), finetune it on SST-2, print the scores, write a report
  vision-demo [OPTIONS]  set up, install Fashion-MNIST (Debian package, as root), then `widenet-ds vision-demo`
  test [--fast] [ARGS]   set up, install Slurm, Chromium, Fashion-MNIST (as root), run the tests; --fast: lane 1
  TASK [L] -- ARGS       widenet-ds launch TASK [L] -- ARGS (L: `widenet-ds launch --help`); TASK: any task of
                         `widenet-ds train --help`; also `vision` (classify), `finetune` (glue), `finetune --squad`
  anything else          widenet-ds with the same arguments (launch, convert, report, ...; a task: launch TASK)
Environment (default): WIDENET_VENV (.venv), WIDENET_SHARED_DATA (../shared/data), WIDENET_TEST_WORKERS (3; --fast: 2)
EOF_USAGE
}

setup() {
  local stamp="$VENV/.widenet-setup" want
  want="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
  [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] && return 0
  command -v python3.11 >/dev/null 2>&1 && BASE_PY=python3.11 || BASE_PY=python3
  echo "[setup] 1/4 creating $VENV (a first set-up takes a few minutes)" >&2; "$BASE_PY" -m venv "$VENV"
  pip_step 2/4 "pip itself" --upgrade pip
  pip_step 3/4 "torch 2.13.0, pinned, first (else a package would pull its multi-GB CUDA build)" "torch==2.13.0"
  pip_step 4/4 "widenet-ds from this checkout (editable) and its pinned packages" -e "$ROOT[test]"
  install_tcmalloc || true; echo "$want" > "$stamp"
}

pip_step() {  # N/M WHAT ARGS: the step's line, then pip's own progress (its bars on a terminal), no setuptools notice
  echo "[setup] $1 $2" >&2; shift 2; PYTHONWARNINGS="ignore:Editable installation" "$PY" -m pip install "$@" >&2; }
apt_install() {  # PACKAGE HINT: a Debian package, installed as root; anyone else is told how
  [[ "$(id -u)" == "0" ]] || { echo "[setup] not root: cannot install $1; 'sudo apt-get install $1' $2" >&2; return 1; }
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1"; } >&2
}
install_tcmalloc() {  # the allocator `widenet-ds launch` gives CPU ranks (launch/host_allocator.py)
  "$PY" -c "import ctypes.util, sys; sys.exit(ctypes.util.find_library('tcmalloc_minimal') is None)" ||
    apt_install libtcmalloc-minimal4 "makes CPU runs use less memory (optional)"
}
install_fashion_mnist() {  # Debian's dataset-fashion-mnist (MIT): the vision path's offline default data
  [[ -d /usr/share/datasets/fashion-mnist ]] ||
    apt_install dataset-fashion-mnist "or pass the folder of the Fashion-MNIST IDX files as classify's --data"
}

run_tests() {  # --fast: lane 1 (docs/testing.md), which needs neither Slurm, the 2-node cluster nor a browser
  setup; local lane=(-rfEs) tools="slurm cluster_tools chromium" workers=3  # -rfEs: skips say why; fast lane: 2 workers
  [[ "${1:-}" == --fast ]] && shift && lane=(-m "not (multirank or slow or slurm or cluster)" -rfEs) && tools="" && workers=2
  if [[ "$(id -u)" == "0" ]]; then
    for tool in $tools; do  # Slurm; sshd + pdsh (the 2-node cluster); the report's browser
      bash "$ROOT/scripts/install_$tool.sh" >&2 || echo "[test] $tool install failed; its tests will skip" >&2; done
    install_tcmalloc || echo "[test] tcmalloc install failed; CPU ranks get glibc's malloc, tuned; its test will skip" >&2
  fi
  install_fashion_mnist || echo "[test] Fashion-MNIST not installed; its test will skip" >&2
  # A file per worker at a time, slow files first (tests/conftest.py); a third worker fills the whole suite's waits.
  cd "$ROOT" && "$PY" -m pytest -n "${WIDENET_TEST_WORKERS:-$workers}" --dist loadfile --no-loadscope-reorder "${lane[@]}" "$@"
}

cmd="${1:-}"; shift || true
# exec: widenet-ds becomes this PID, the one a user or scheduler signals (`widenet-ds launch` relays it).
case "$cmd" in
  setup) [[ "${1:-}" == --gpu ]] && shift && exec bash "$ROOT/scripts/setup_gpu.sh" "$@"; setup ;;
  test) run_tests "$@" ;;
  demo|vision-demo) setup; [[ "$cmd" == demo ]] || install_fashion_mnist || exit 1
    exec "$WDS" "$cmd" --output "$ROOT/runs/$cmd" "$@" ;;
  -h|--help|help|"") usage; if [[ -x "$WDS" ]]; then echo; "$WDS" --help; fi ;;
  *) [[ -x "$WDS" ]] || setup
    [[ "$cmd" == vision ]] && cmd=classify
    [[ "$cmd" == finetune ]] && { [[ "${1:-}" == --squad ]] && shift && cmd=squad || cmd=glue; }
    exec "$WDS" "$cmd" "$@" ;;  # a task's name launches it (widenet_ds/cli.py reads the task table)
esac
