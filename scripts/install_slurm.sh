#!/usr/bin/env bash
# Install a single-node Slurm (slurmctld, slurmd, sbatch/srun) and munge from Debian's packages.
# Idempotent: does nothing when every tool is already on PATH. Needs root (CI runs as root).
# Used by CI before `pytest -m slurm`; tests/slurm_cluster.py brings the daemons up itself.
set -euo pipefail

needed=(slurmctld slurmd sbatch srun scontrol sinfo munged)
missing=()
for tool in "${needed[@]}"; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ "${#missing[@]}" -eq 0 ]; then
    echo "install_slurm: slurm and munge already installed"
    exit 0
fi
echo "install_slurm: missing ${missing[*]}; installing slurmctld slurmd slurm-client munge"

if [ "$(id -u)" -ne 0 ]; then
    echo "install_slurm: must run as root (apt-get install); re-run with sudo" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -q
# --no-install-recommends keeps out mail servers and docs; policy-rc.d stops the packages from
# starting system-wide daemons: the tests start their own with a generated config.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy"
    chmod +x "$policy"
    created_policy=1
fi
trap 'if [ "$created_policy" -eq 1 ]; then rm -f "$policy"; fi' EXIT
apt-get install -y -q --no-install-recommends slurmctld slurmd slurm-client munge

for tool in "${needed[@]}"; do
    command -v "$tool" >/dev/null 2>&1 || { echo "install_slurm: $tool still missing after install" >&2; exit 1; }
done
echo "install_slurm: done ($(slurmctld -V))"
