#!/usr/bin/env bash
# What the 2-node test cluster needs (tests/support/netns_cluster.py): sshd and pdsh (ip, unshare and nsenter come with
# iproute2 and util-linux); the tests start one sshd per node themselves.
exec bash "$(dirname "$0")/install_debian_tools.sh" install_cluster_tools "/usr/sbin/sshd ssh ssh-keygen pdsh ip unshare nsenter" \
    openssh-server openssh-client pdsh iproute2 util-linux
