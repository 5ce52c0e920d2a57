#!/usr/bin/env bash
# widenet-ds launcher: set-up, the demo, pretraining/finetuning through the deepspeed launcher,
# checkpoint conversion and the tests. `./launcher.sh --help` lists everything.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${WIDENET_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
export WIDENET_SHARED_DATA="${WIDENET_SHARED_DATA:-$ROOT/../shared/data}"

usage() {
  cat <<'EOF'
usage: ./launcher.sh <command> [options]

commands:
  setup                 create .venv and install widenet-ds with its pinned packages (idempotent)
  demo                  the main job: set up, prepare the embedded corpus, pretrain a small WideNet on
                        2 local CPU ranks with expert parallelism 2, finetune it on SST-2, print scores
  pretrain [L] -- ARGS  run pretrain/run_pretrain.py under the deepspeed launcher
  finetune [L] -- ARGS  run finetune/run_glue.py (or --squad: finetune/run_squad.py) likewise
  convert ARGS          widenet-ds convert ARGS (to-folder, reshard, to-albert, from-albert)
  test [PYTEST ARGS]    set up (packages, Slurm for the cluster tests) and run the test suite
  -h, --help            this text

launch options [L] for pretrain/finetune:
  --hostfile FILE       deepspeed hostfile ("host slots=N" per line); checked before launching
  --num-ranks N         local ranks (default: all local devices; 2 CPU ranks on a CPU machine)
  --include/--exclude/--master_addr/--master_port VALUE   passed to the deepspeed launcher
Everything after `--` goes to the entrypoint unchanged (quoted as given).
EOF
}

setup() {
  local stamp="$VENV/.widenet-setup"
  local want
  want="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    return 0
  fi
  echo "[setup] creating $VENV and installing packages (first run: a few minutes)" >&2
  command -v python3.11 >/dev/null 2>&1 && BASE_PY=python3.11 || BASE_PY=python3
  "$BASE_PY" -m venv "$VENV"
  "$PY" -m pip install --quiet --upgrade pip
  # torch first, pinned: an unpinned `torch` from another package would pull the multi-GB CUDA build.
  "$PY" -m pip install --quiet "torch==2.13.0"
  "$PY" -m pip install --quiet -e "$ROOT[test]"
  echo "$want" > "$stamp"
}

deepspeed_launch() {
  # deepspeed_launch <script> <launcher/launch options...> -- <script args...>
  local script="$1"; shift
  local launch=() hostfile="" ranks=""
  while [[ $# -gt 0 && "$1" != "--" ]]; do
    case "$1" in
      --hostfile) hostfile="$2"; shift 2 ;;
      --num-ranks) ranks="$2"; shift 2 ;;
      --include|--exclude|--master_addr|--master_port|--num_nodes) launch+=("$1" "$2"); shift 2 ;;
      *) echo "launcher.sh: unknown launch option $1 (script arguments go after --)" >&2; exit 2 ;;
    esac
  done
  [[ "${1:-}" == "--" ]] && shift
  if [[ -n "$hostfile" ]]; then
    "$PY" -m widenet_ds.launch_env check-hostfile --hostfile "$hostfile" ${ranks:+--num-ranks "$ranks"}
    launch+=(--hostfile "$hostfile")
  fi
  if [[ -n "$ranks" ]]; then
    launch+=(--num_gpus "$ranks")
  elif [[ -z "$hostfile" ]] && ! "$PY" -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    launch+=(--num_gpus 2)  # CPU machine: two local ranks stand in for devices
  fi
  PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$VENV/bin/deepspeed" "${launch[@]}" "$script" "$@"
}

demo() {
  setup
  local run="${WIDENET_DEMO_DIR:-$ROOT/runs/demo}"
  local sst2="$WIDENET_SHARED_DATA/glue/SST-2"
  mkdir -p "$run"
  echo "[demo] 1/3 preparing the embedded default corpus -> $run/data" >&2
  "$VENV/bin/widenet-ds" prepare-data --default-corpus --tokenizer train --vocab-size 8000 \
    --seq-length 128 --output "$run/data" --workers 2 --seed 1
  echo "[demo] 2/3 pretraining widenet-small-e4 on 2 CPU ranks, expert parallel 2" >&2
  deepspeed_launch "$ROOT/pretrain/run_pretrain.py" --num-ranks 2 -- \
    --preset widenet-small-e4 --moe-ep-size 2 --deepspeed_config "$ROOT/ds_configs/cpu_small.json" \
    --data "$run/data" --output-dir "$run/pretrain" --max-steps "${WIDENET_DEMO_STEPS:-300}" \
    --save-interval 100 --eval-interval 100
  if [[ ! -d "$sst2" ]]; then
    echo "[demo] SST-2 not found at $sst2: set WIDENET_SHARED_DATA to a folder with glue/SST-2" \
         "(train.tsv, dev.tsv); skipping the finetune step." >&2
    exit 1
  fi
  echo "[demo] 3/3 finetuning on SST-2 ($sst2)" >&2
  deepspeed_launch "$ROOT/finetune/run_glue.py" --num-ranks 2 -- \
    --task sst2 --data "$sst2" --init "$run/pretrain" --output-dir "$run/sst2" \
    --deepspeed_config "$ROOT/ds_configs/finetune_cpu_small.json" --max-steps "${WIDENET_DEMO_FT_STEPS:-150}" \
    --max-train-examples 4000
}

run_tests() {
  setup
  if [[ "$(id -u)" == "0" ]]; then
    bash "$ROOT/scripts/install_slurm.sh" >&2 || echo "[test] Slurm install failed; Slurm tests will skip" >&2
  fi
  cd "$ROOT"
  "$PY" -m pytest "$@"
}

cmd="${1:-}"
[[ $# -gt 0 ]] && shift
case "$cmd" in
  setup) setup ;;
  demo) demo ;;
  pretrain) setup; deepspeed_launch "$ROOT/pretrain/run_pretrain.py" "$@" ;;
  finetune)
    setup
    script="$ROOT/finetune/run_glue.py"
    if [[ "${1:-}" == "--squad" ]]; then script="$ROOT/finetune/run_squad.py"; shift; fi
    deepspeed_launch "$script" "$@" ;;
  convert) setup; "$VENV/bin/widenet-ds" convert "$@" ;;
  test) run_tests "$@" ;;
  -h|--help|help|"") usage ;;
  *) echo "launcher.sh: unknown command '$cmd'" >&2; usage >&2; exit 2 ;;
esac
