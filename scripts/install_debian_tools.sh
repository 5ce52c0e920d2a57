#!/usr/bin/env bash
# `install_debian_tools.sh NAME "TOOL ..." PACKAGE ...`: install Debian PACKAGEs unless every TOOL is on PATH
# already (idempotent), then check that every TOOL is there. Needs root (CI runs as root). The packages' own
# daemons are not started (policy-rc.d): the tests start theirs with generated configs. --no-install-recommends
# keeps out mail servers and docs. Used by install_slurm.sh, install_cluster_tools.sh and install_chromium.sh.
set -euo pipefail
name=$1
read -r -a needed <<< "$2"
shift 2
missing=()
for tool in "${needed[@]}"; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ "${#missing[@]}" -eq 0 ]; then
    echo "$name: ${needed[*]} already installed"
    exit 0
fi
echo "$name: missing ${missing[*]}; installing $*"
if [ "$(id -u)" -ne 0 ]; then
    echo "$name: must run as root (apt-get install); re-run with sudo" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy"
    chmod +x "$policy"
    created_policy=1
fi
trap 'if [ "$created_policy" -eq 1 ]; then rm -f "$policy"; fi' EXIT
apt-get install -y -q --no-install-recommends "$@"
for tool in "${needed[@]}"; do
    command -v "$tool" >/dev/null 2>&1 || { echo "$name: $tool still missing after install" >&2; exit 1; }
done
echo "$name: done"
