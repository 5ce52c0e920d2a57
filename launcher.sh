#!/usr/bin/env bash
# widenet-ds launcher: set-up (the virtual environment must exist before Python does), the tests, and the
# demos; every other command is `widenet-ds` (widenet_ds/cli.py). `./launcher.sh --help` lists them.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${WIDENET_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
WDS="$VENV/bin/widenet-ds"
export WIDENET_SHARED_DATA="${WIDENET_SHARED_DATA:-$(dirname "$ROOT")/shared/data}"

usage() {
  cat <<'EOF'
usage: ./launcher.sh <command> [options]
  setup                  create .venv and install widenet-ds with its pinned packages (idempotent)
  demo [OPTIONS]         set up, then `widenet-ds demo`: pretrain widenet-tiny-e4 on the embedded corpus on 2 CPU
                         ranks (expert parallelism 2), finetune it on SST-2, print the scores, write a report
  vision-demo [OPTIONS]  set up, install Fashion-MNIST (Debian package, as root), then `widenet-ds vision-demo`
  test [PYTEST ARGS]     set up, install Slurm, Chromium and Fashion-MNIST (as root), then run the tests
  pretrain|vision [L] -- ARGS      widenet-ds launch pretrain|classify [L] -- ARGS (L: `widenet-ds launch --help`)
  finetune [--squad] [L] -- ARGS   widenet-ds launch glue (--squad: squad) [L] -- ARGS
  anything else          widenet-ds with the same arguments (launch, convert, report, ...)
Environment: WIDENET_VENV (default .venv), WIDENET_SHARED_DATA (default ../shared/data), WIDENET_TEST_WORKERS
(pytest workers of `test`, default 2).
EOF
}

setup() {
  local stamp="$VENV/.widenet-setup" want
  want="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
  [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] && return 0
  echo "[setup] creating $VENV and installing packages (first run: a few minutes)" >&2
  command -v python3.11 >/dev/null 2>&1 && BASE_PY=python3.11 || BASE_PY=python3
  "$BASE_PY" -m venv "$VENV"
  "$PY" -m pip install --quiet --upgrade pip
  # torch first, pinned: an unpinned `torch` from another package would pull the multi-GB CUDA build.
  "$PY" -m pip install --quiet "torch==2.13.0"
  "$PY" -m pip install --quiet -e "$ROOT[test]"
  install_tcmalloc || true
  echo "$want" > "$stamp"
}

install_tcmalloc() {
  # Debian's libtcmalloc-minimal4: the allocator `widenet-ds launch` gives CPU ranks where it is installed
  # (widenet_ds/runtime/host_allocator.py); without it they get glibc's malloc, tuned.
  "$PY" -c "import ctypes.util, sys; sys.exit(ctypes.util.find_library('tcmalloc_minimal') is None)" && return 0
  if [[ "$(id -u)" != "0" ]]; then
    echo "[setup] not root: cannot install tcmalloc for CPU runs; 'sudo apt-get install libtcmalloc-minimal4'" \
         "makes them use less memory (optional)" >&2
    return 1
  fi
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libtcmalloc-minimal4; } >&2
}

install_fashion_mnist() {
  # Debian's dataset-fashion-mnist (MIT): the vision path's offline default data set.
  [[ -d /usr/share/datasets/fashion-mnist ]] && return 0
  if [[ "$(id -u)" != "0" ]]; then
    echo "[setup] not root: cannot install Debian's dataset-fashion-mnist; run 'sudo apt-get install" \
         "dataset-fashion-mnist' or pass the folder of the Fashion-MNIST IDX files as classify's --data" >&2
    return 1
  fi
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist; } >&2
}

run_tests() {
  setup
  if [[ "$(id -u)" == "0" ]]; then
    bash "$ROOT/scripts/install_slurm.sh" >&2 || echo "[test] Slurm install failed; Slurm tests will skip" >&2
    bash "$ROOT/scripts/install_cluster_tools.sh" >&2 || echo "[test] sshd/pdsh install failed; the 2-node cluster tests will skip" >&2
    bash "$ROOT/scripts/install_chromium.sh" >&2 || echo "[test] Chromium install failed; the report's browser test will skip" >&2
    install_tcmalloc || echo "[test] tcmalloc install failed; CPU ranks get glibc's malloc, tuned; its test will skip" >&2
  fi
  install_fashion_mnist || echo "[test] Fashion-MNIST not installed; its test will skip" >&2
  cd "$ROOT"
  # Two pytest workers, a test file each at a time (its module fixtures built once): on 2 cores a serial
  # suite left ~37% of the CPU idle (one-rank runs, start-ups, waits); `-n 0` runs serially (pdb, -s).
  "$PY" -m pytest -n "${WIDENET_TEST_WORKERS:-2}" --dist loadfile "$@"
}

cmd="${1:-}"; shift || true
# exec: widenet-ds becomes this PID, the one a user or scheduler signals (`widenet-ds launch` relays it).
case "$cmd" in
  setup) setup ;;
  test) run_tests "$@" ;;
  demo) setup; exec "$WDS" demo --output "$ROOT/runs/demo" "$@" ;;
  vision-demo) setup; install_fashion_mnist || exit 1; exec "$WDS" vision-demo --output "$ROOT/runs/vision-demo" "$@" ;;
  -h|--help|help|"") usage; if [[ -x "$WDS" ]]; then echo; "$WDS" --help; fi ;;
  *)
    [[ -x "$WDS" ]] || setup
    case "$cmd" in
      pretrain) exec "$WDS" launch pretrain "$@" ;;
      finetune) if [[ "${1:-}" == "--squad" ]]; then shift; exec "$WDS" launch squad "$@"; fi
                exec "$WDS" launch glue "$@" ;;
      vision) exec "$WDS" launch classify "$@" ;;
      *) exec "$WDS" "$cmd" "$@" ;;
    esac ;;
esac
