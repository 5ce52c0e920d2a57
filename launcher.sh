#!/usr/bin/env bash
# widenet-ds launcher: set-up, the demo, pretraining/finetuning through the deepspeed launcher,
# checkpoint conversion and the tests. `./launcher.sh --help` lists everything.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${WIDENET_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
# The tools of the environment: overridable to run under another one (a cluster module, a container).
PYTHON="${PYTHON:-$PY}"
DEEPSPEED="${DEEPSPEED:-$VENV/bin/deepspeed}"
export WIDENET_SHARED_DATA="${WIDENET_SHARED_DATA:-$ROOT/../shared/data}"

usage() {
  cat <<'EOF'
usage: ./launcher.sh <command> [options]

commands:
  setup                 create .venv and install widenet-ds with its pinned packages (idempotent)
  demo                  the main job: set up, prepare the embedded corpus, pretrain a small WideNet on
                        2 local CPU ranks with expert parallelism 2, finetune it on SST-2, print scores
  vision-demo           set up, install Fashion-MNIST (Debian package, root), train ViT-WideNet-tiny on it
                        on 2 CPU ranks with expert parallelism 2 (a few minutes), print test accuracy
  vision [L] -- ARGS    run vision/run_classify.py (image classification) under the deepspeed launcher
  pretrain [L] -- ARGS  run pretrain/run_pretrain.py under the deepspeed launcher
  finetune [L] -- ARGS  run finetune/run_glue.py (or --squad: finetune/run_squad.py) likewise
  convert ARGS          widenet-ds convert ARGS (to-folder, reshard, to-albert, from-albert)
  test [PYTEST ARGS]    set up (packages, Slurm for the cluster tests) and run the test suite
  -h, --help            this text

launch options [L] for pretrain/finetune (before `--`):
  --hostfile FILE       nodes to run on, deepspeed's format ("host slots=N" per line; passwordless ssh +
                        pdsh); checked first: hosts must resolve and have the slots asked for
  --num-nodes N         the first N hosts of the hostfile
  --num-gpus G          ranks per node (default: every GPU; without GPUs one CPU rank per core, at most 8)
  --master-addr ADDR    rendezvous address (default: 127.0.0.1 locally; deepspeed asks the first host)
  --master-port PORT    rendezvous port (default 29500)
  --no-ssh-check        skip deepspeed's ssh probe of the first host
Everything after `--` goes to the entrypoint unchanged (quoted as given).
Environment: PYTHON, DEEPSPEED name other tools than .venv's; WIDENET_SHARED_DATA the shared data.
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
  # deepspeed_launch <entrypoint> [launch options] [-- entrypoint options]
  local entrypoint="$1"; shift
  local hostfile="" num_nodes="" num_gpus="" master_addr="" master_port="" ssh_check=1
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --hostfile) hostfile="${2:?--hostfile needs a file}"; shift 2 ;;
      --num-nodes) num_nodes="${2:?--num-nodes needs a number}"; positive_int "$1" "$2"; shift 2 ;;
      --num-gpus|--num-ranks) num_gpus="${2:?$1 needs a number}"; positive_int "$1" "$2"; shift 2 ;;
      --master-addr) master_addr="${2:?--master-addr needs an address}"; shift 2 ;;
      --master-port) master_port="${2:?--master-port needs a port}"; shift 2 ;;
      --no-ssh-check) ssh_check=0; shift ;;
      --) shift; break ;;
      *) echo "launcher.sh: error: unknown launch option '$1'; entrypoint options go after '--'" >&2; exit 2 ;;
    esac
  done
  local ds_args=()
  if [[ -n "$hostfile" ]]; then
    local check=(--hostfile "$hostfile")
    [[ -n "$num_nodes" ]] && check+=(--num-nodes "$num_nodes")
    [[ -n "$num_gpus" ]] && check+=(--num-gpus "$num_gpus")
    # Unresolvable hosts or too few slots fail here, naming the fix, before any rank starts.
    "$PYTHON" -m widenet_ds.runtime.launch_env check-hostfile "${check[@]}" >/dev/null || exit 2
    ds_args+=(--hostfile "$hostfile")
    [[ -n "$num_nodes" ]] && ds_args+=(--num_nodes "$num_nodes")
  else
    if [[ -n "$num_nodes" && "$num_nodes" != 1 ]]; then
      echo "launcher.sh: error: --num-nodes $num_nodes needs --hostfile listing the nodes" >&2; exit 2
    fi
    if [[ -z "$num_gpus" ]] && ! { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }; then
      # deepspeed's CPU default is one rank per NUMA node (often 1); CPU runs want one per core.
      local cores; cores=$(nproc)
      num_gpus=$(( cores < 8 ? cores : 8 ))
    fi
  fi
  [[ -n "$num_gpus" ]] && ds_args+=(--num_gpus "$num_gpus")
  if [[ -z "${OMP_NUM_THREADS:-}" && -n "$num_gpus" ]] && ! command -v nvidia-smi >/dev/null; then
    # CPU ranks: share the cores instead of every rank starting one thread per core.
    local threads=$(( $(nproc) / num_gpus ))
    export OMP_NUM_THREADS=$(( threads > 0 ? threads : 1 ))
  fi
  [[ -n "$master_addr" ]] && ds_args+=(--master_addr "$master_addr")
  [[ -n "$master_port" ]] && ds_args+=(--master_port "$master_port")
  [[ "$ssh_check" == 0 ]] && ds_args+=(--no_ssh_check)
  # The runner's and launch.py's bookkeeping (cmd =, WORLD INFO, spawned ...) is not for users; errors stay.
  ds_args+=(--log_level="${WIDENET_DEEPSPEED_LOG_LEVEL:-critical}")
  if [[ -z "${DS_ACCELERATOR:-}" ]] && ! { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }; then
    export DS_ACCELERATOR=cpu  # chosen, not guessed: no "unable to detect an accelerator" warning per process
  fi
  echo "launcher.sh: $DEEPSPEED ${ds_args[*]} $entrypoint $*"
  # Not exec: this shell stays the PID a user or scheduler signals, and relays SIGTERM/SIGINT/SIGUSR1 to
  # the ranks (deepspeed's runner would die alone on one node, leaving them training; see
  # widenet_ds/runtime/signals.py). The ranks then save, agree to stop and exit 0.
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  "$DEEPSPEED" "${ds_args[@]}" "$entrypoint" "$@" &
  local runner=$!
  trap "relay_signal TERM $runner" TERM
  trap "relay_signal TERM $runner" INT
  trap "relay_signal USR1 $runner" USR1
  local rc
  while true; do
    rc=0
    wait "$runner" || rc=$?
    # wait returns early (status > 128) when a trapped signal arrives; the runner is then still there.
    kill -0 "$runner" 2>/dev/null || break
  done
  trap - TERM INT USR1
  # 2 is a user error the ranks printed once; anything else gets a line (their own output is above).
  if [[ "$rc" != 0 && "$rc" != 2 ]]; then
    echo "launcher.sh: the run ended with exit status $rc (a rank failed; its messages are above)" >&2
  fi
  return "$rc"
}

relay_signal() {
  "$PYTHON" -m widenet_ds.runtime.signals forward "$1" "$2" || kill "-$1" "$2" 2>/dev/null || true
}

positive_int() {
  # positive_int <option> <value>: refuse what deepspeed would take silently (0 ranks runs 1)
  if ! [[ "$2" =~ ^[0-9]+$ ]] || (( 10#$2 < 1 )); then
    echo "launcher.sh: error: $1 '$2' must be a whole number >= 1" >&2; exit 2
  fi
}

ensure_venv() {
  # pretrain/finetune/convert in an existing environment start at once; set it up otherwise.
  [[ -x "$DEEPSPEED" ]] || setup
}

demo() {
  setup
  local run="${WIDENET_DEMO_DIR:-$ROOT/runs/demo}"
  local sst2="$WIDENET_SHARED_DATA/glue/SST-2"
  mkdir -p "$run"
  echo "[demo] 1/3 preparing the embedded default corpus -> $run/data" >&2
  "$VENV/bin/widenet-ds" prepare-data --default-corpus --tokenizer train --vocab-size 8000 \
    --seq-length 128 --output "$run/data" --workers 2 --seed 1
  echo "[demo] 2/3 pretraining widenet-tiny-e4 on 2 CPU ranks, expert parallel 2" >&2
  local vocab
  vocab="$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$run/data/manifest.json")"
  "$VENV/bin/widenet-ds" model-config widenet-tiny-e4 --set vocab_size="$vocab" \
    --output "$run/model.json"
  ( deepspeed_launch "$ROOT/pretrain/run_pretrain.py" --num-gpus 2 -- \
    --model-config "$run/model.json" --deepspeed_config "$ROOT/ds_configs/cpu_small.json" \
    --data "$run/data" --output-dir "$run/pretrain" --max-steps "${WIDENET_DEMO_STEPS:-300}" --ep-size 2 \
    --save-interval 100 --eval-interval 100 --resume )
  # SST-2: the local GLUE copy when given, else HF `glue/sst2` when the hub answers, else stop here (exit 0:
  # the pretraining is done and reported) and say what to provide.
  local sst2_data="" sst2_from=""
  if [[ -d "$sst2" ]]; then
    sst2_data="$sst2"; sst2_from="$sst2"
  else
    echo "[demo] SST-2 not found at $sst2; trying HF datasets glue/sst2" >&2
    if timeout 300 "$PY" -c 'import datasets; datasets.load_dataset("glue", "sst2", split="validation")' \
        >/dev/null 2>&1; then
      sst2_data="hf"; sst2_from="HF datasets glue/sst2"
    fi
  fi
  if [[ -n "$sst2_data" ]]; then
    echo "[demo] 3/3 finetuning on SST-2 ($sst2_from)" >&2
    ( deepspeed_launch "$ROOT/finetune/run_glue.py" --num-gpus 2 -- \
      --task sst2 --data "$sst2_data" --init-from "$run/pretrain" --tokenizer "$run/data" --output-dir "$run/sst2" \
      --deepspeed_config "$ROOT/ds_configs/finetune_cpu_small.json" --allow-recipe-mismatch \
      --max-steps "${WIDENET_DEMO_FT_STEPS:-200}" --max-train-examples 6000 --max-seq-length 64 --resume )
  fi
  "$PY" - "$run" <<'PY'
import json, sys
from pathlib import Path
run = Path(sys.argv[1])
rows = [json.loads(line) for line in (run / "pretrain" / "metrics.jsonl").read_text().splitlines() if line.strip()]
train = [r for r in rows if "train/mlm_loss" in r]
valid = [r for r in rows if "valid/mlm_loss" in r]
print("\n== widenet-ds demo ==")
print(f"pretraining ({train[-1]['step']} steps, widenet-tiny-e4, 2 ranks, ep 2): MLM loss "
      f"{train[0]['train/mlm_loss']:.3f} -> {train[-1]['train/mlm_loss']:.3f}"
      + (f", held-out MLM loss {valid[-1]['valid/mlm_loss']:.3f}" if valid else ""))
if (run / "sst2" / "results.json").is_file():
    result = json.loads((run / "sst2" / "results.json").read_text())
    print(f"SST-2 dev accuracy {result['median']['dev']['acc']:.4f} "
          f"(majority class {result['baseline']['dev']['acc']:.4f})")
print(f"outputs in {run}")
PY
  local report_runs=("$run/pretrain")
  if [[ -n "$sst2_data" ]]; then report_runs+=("$run/sst2"); fi
  "$VENV/bin/widenet-ds" report "${report_runs[@]}" --output "$run/report" --title "widenet-ds demo"
  echo "[demo] open the report: file://$run/report/index.html"
  if [[ -z "$sst2_data" ]]; then
    echo "[demo] skipped the finetuning step: no SST-2 at $sst2 and HF datasets glue/sst2 could not be" \
         "downloaded. To finetune, put GLUE's SST-2 folder (train.tsv, dev.tsv) at \$WIDENET_SHARED_DATA/glue/SST-2" \
         "(WIDENET_SHARED_DATA defaults to ../shared/data), or give this machine access to the HF hub, then run" \
         "./launcher.sh demo again (the finished pretraining is reused)."
  fi
}

install_fashion_mnist() {
  # Debian's dataset-fashion-mnist (MIT): the vision path's offline default data set.
  [[ -d /usr/share/datasets/fashion-mnist ]] && return 0
  if [[ "$(id -u)" != "0" ]]; then
    echo "[setup] not root: cannot install Debian's dataset-fashion-mnist; run 'sudo apt-get install" \
         "dataset-fashion-mnist' or pass --data-dir with the Fashion-MNIST IDX files" >&2
    return 1
  fi
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist; } >&2
}

vision_demo() {
  setup
  install_fashion_mnist || exit 1
  local run="${WIDENET_VISION_DEMO_DIR:-$ROOT/runs/vision-demo}"
  echo "[vision-demo] training widenet-vit-tiny on Fashion-MNIST, 2 CPU ranks, expert parallel 2 -> $run" >&2
  ( deepspeed_launch "$ROOT/vision/run_classify.py" --num-gpus 2 -- \
    --model-config widenet-vit-tiny --dataset fashion-mnist --deepspeed_config "$ROOT/ds_configs/vision_cpu_small.json" \
    --output-dir "$run" --ep-size 2 --max-steps "${WIDENET_VISION_DEMO_STEPS:-600}" --save-interval 200 \
    --eval-interval 200 --max-eval-examples 2000 --log-interval 50 --workers 1 --flip --resume )
  "$PY" - "$run" <<'PY'
import json, sys
from pathlib import Path
run = Path(sys.argv[1])
result = json.loads((run / "results.json").read_text())
print("\n== widenet-ds vision demo ==")
print(f"widenet-vit-tiny, {result['step']} steps on Fashion-MNIST (2 ranks, ep 2): test accuracy "
      f"{result['test/accuracy']:.4f} on the first 2000 test images (chance 0.1)")
print(f"outputs in {run}")
PY
}

run_tests() {
  setup
  if [[ "$(id -u)" == "0" ]]; then
    bash "$ROOT/scripts/install_slurm.sh" >&2 || echo "[test] Slurm install failed; Slurm tests will skip" >&2
    bash "$ROOT/scripts/install_chromium.sh" >&2 || echo "[test] Chromium install failed; the report's browser test will skip" >&2
  fi
  install_fashion_mnist || echo "[test] Fashion-MNIST not installed; its test will skip" >&2
  cd "$ROOT"
  "$PY" -m pytest "$@"
}

cmd="${1:-}"
[[ $# -gt 0 ]] && shift
case "$cmd" in
  setup) setup ;;
  demo) demo ;;
  vision-demo) vision_demo ;;
  vision) ensure_venv; deepspeed_launch "$ROOT/vision/run_classify.py" "$@" ;;
  pretrain) ensure_venv; deepspeed_launch "$ROOT/pretrain/run_pretrain.py" "$@" ;;
  finetune)
    ensure_venv
    script="$ROOT/finetune/run_glue.py"
    if [[ "${1:-}" == "--squad" ]]; then script="$ROOT/finetune/run_squad.py"; shift; fi
    deepspeed_launch "$script" "$@" ;;
  convert) ensure_venv; "$VENV/bin/widenet-ds" convert "$@" ;;
  test) run_tests "$@" ;;
  -h|--help|help|"") usage ;;
  *) echo "launcher.sh: unknown command '$cmd'" >&2; usage >&2; exit 2 ;;
esac
