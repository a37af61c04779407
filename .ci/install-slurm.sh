#!/usr/bin/env bash
# Debian's Slurm 22.05 and munge for the test cluster (tests/slurmcluster.py): slurmctld, slurmd,
# the client commands (srun, salloc, scontrol, ...) and munged. The packages start no daemon
# here; the tests run their own in network namespaces. Idempotent; without root it says what is
# missing and leaves the Slurm tests to skip.
set -euo pipefail
missing=0
for tool in slurmctld slurmd srun scontrol /usr/sbin/munged; do
    command -v "$tool" >/dev/null 2>&1 || missing=1
done
[ "$missing" -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "install-slurm: not root, Slurm not installed; the Slurm tests will be skipped" >&2
    exit 0
fi
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
    slurmctld slurmd slurm-client munge
