#!/usr/bin/env bash
# A single-node Slurm (slurmctld, slurmd, sbatch/srun) and munge from Debian's packages, for the Slurm tests;
# tests/support/slurm_cluster.py and tests/support/netns_slurm.py bring the daemons up themselves.
exec bash "$(dirname "$0")/install_debian_tools.sh" install_slurm "slurmctld slurmd sbatch srun scontrol sinfo munged" \
    slurmctld slurmd slurm-client munge
