#!/usr/bin/env bash
# Install what the 2-node test cluster needs (tests/netns_cluster.py): sshd and pdsh from Debian's packages
# (ip, unshare and nsenter come with iproute2 and util-linux). Idempotent; needs root (CI runs as root).
# policy-rc.d keeps the package from starting a system-wide sshd: the tests start one per node themselves.
set -euo pipefail

needed=(/usr/sbin/sshd ssh ssh-keygen pdsh ip unshare nsenter)
missing=()
for tool in "${needed[@]}"; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ "${#missing[@]}" -eq 0 ]; then
    echo "install_cluster_tools: sshd, pdsh, ip, unshare and nsenter already installed"
    exit 0
fi
echo "install_cluster_tools: missing ${missing[*]}; installing openssh-server openssh-client pdsh iproute2 util-linux"
if [ "$(id -u)" -ne 0 ]; then
    echo "install_cluster_tools: must run as root (apt-get install); re-run with sudo" >&2
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
apt-get install -y -q --no-install-recommends openssh-server openssh-client pdsh iproute2 util-linux
for tool in "${needed[@]}"; do
    command -v "$tool" >/dev/null 2>&1 || { echo "install_cluster_tools: $tool still missing after install" >&2; exit 1; }
done
echo "install_cluster_tools: done"
