#!/usr/bin/env bash
# Start pretraining or GLUE finetuning with the `deepspeed` launcher, on this machine or on the
# nodes of a hostfile (DeepSpeed's format: `<host> slots=<GPUs>` per line; passwordless ssh + pdsh).
#
#   slurm/launcher.sh pretrain -- --model-config widenet-base-e4 --deepspeed_config ds.json \
#       --data data/wiki_books_seq128 --output-dir runs/e4
#   slurm/launcher.sh pretrain --hostfile hosts.txt --num-nodes 4 --num-gpus 8 -- <run_pretrain.py options>
#   slurm/launcher.sh finetune -- <run_glue.py options>
#
# Launcher options (before `--`; everything after it goes to the entrypoint):
#   --hostfile FILE       nodes to run on (default: this machine only)
#   --num-nodes N         the first N hosts of the hostfile
#   --num-gpus G          ranks per node (default: every GPU; on a machine without GPUs one CPU rank
#                         per core, at most 8)
#   --master-addr ADDR    rendezvous address (default: 127.0.0.1 locally; with a hostfile deepspeed
#                         asks the first host over ssh)
#   --master-port PORT    rendezvous port (default 29500)
#   --no-ssh-check        skip deepspeed's ssh probe of the first host
# Environment: PYTHON (python), DEEPSPEED (deepspeed) name the tools of your environment.
# The hostfile is checked first (hosts resolve, enough slots): a bad one fails here, naming the fix.
set -euo pipefail

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "launcher.sh: error: $*" >&2; exit 2; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$([ -f "$here/pretrain/run_pretrain.py" ] && echo "$here" || dirname "$here")
PYTHON=${PYTHON:-python}
DEEPSPEED=${DEEPSPEED:-deepspeed}

[ $# -ge 1 ] || { usage >&2; exit 2; }
case "$1" in
    pretrain) entrypoint="$repo/pretrain/run_pretrain.py" ;;
    finetune) entrypoint="$repo/finetune/run_glue.py" ;;
    -h|--help) usage; exit 0 ;;
    *) die "first argument must be 'pretrain' or 'finetune', got '$1'" ;;
esac
shift

hostfile="" num_nodes="" num_gpus="" master_addr="" master_port="" ssh_check=1
while [ $# -gt 0 ]; do
    case "$1" in
        --hostfile) hostfile=${2:?--hostfile needs a file}; shift 2 ;;
        --num-nodes) num_nodes=${2:?--num-nodes needs a number}; shift 2 ;;
        --num-gpus) num_gpus=${2:?--num-gpus needs a number}; shift 2 ;;
        --master-addr) master_addr=${2:?--master-addr needs an address}; shift 2 ;;
        --master-port) master_port=${2:?--master-port needs a port}; shift 2 ;;
        --no-ssh-check) ssh_check=0; shift ;;
        --) shift; break ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown launcher option '$1'; entrypoint options go after '--' (see --help)" ;;
    esac
done
[ -f "$entrypoint" ] || die "$entrypoint not found; run launcher.sh from a widenet-ds checkout"

ds_args=()
if [ -n "$hostfile" ]; then
    check=(--hostfile "$hostfile")
    [ -n "$num_nodes" ] && check+=(--num-nodes "$num_nodes")
    [ -n "$num_gpus" ] && check+=(--num-gpus "$num_gpus")
    "$PYTHON" -m widenet_ds.launch_env check-hostfile "${check[@]}" >/dev/null || exit 2
    ds_args+=(--hostfile "$hostfile")
    [ -n "$num_nodes" ] && ds_args+=(--num_nodes "$num_nodes")
else
    [ -z "$num_nodes" ] || [ "$num_nodes" = 1 ] || die "--num-nodes $num_nodes needs --hostfile listing the nodes"
    if [ -z "$num_gpus" ] && ! { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }; then
        # deepspeed's CPU default is one rank per NUMA node (often 1); CPU runs want one per core.
        cores=$(nproc)
        num_gpus=$(( cores < 8 ? cores : 8 ))
    fi
fi
[ -n "$num_gpus" ] && ds_args+=(--num_gpus "$num_gpus")
[ -n "$master_addr" ] && ds_args+=(--master_addr "$master_addr")
[ -n "$master_port" ] && ds_args+=(--master_port "$master_port")
[ "$ssh_check" = 0 ] && ds_args+=(--no_ssh_check)

echo "launcher.sh: $DEEPSPEED ${ds_args[*]} $entrypoint $*"
exec "$DEEPSPEED" "${ds_args[@]}" "$entrypoint" "$@"
