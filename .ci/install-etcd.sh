#!/usr/bin/env bash
# Debian's etcd-server 3.4 for the drivers' store tests (tests/etcdcluster.py: three members in
# network namespaces, started by the tests). Idempotent; without root it says what is missing and
# leaves the etcd tests to skip. Under systemd the package starts and enables a system etcd on
# 127.0.0.1:2379; the tests need none, so one this script installed is stopped and disabled.
set -euo pipefail
[ -x /usr/bin/etcd ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "install-etcd: not root, etcd not installed; the etcd store tests will be skipped" >&2
    exit 0
fi
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends etcd-server
if [ -d /run/systemd/system ]; then
    systemctl disable --now etcd >/dev/null 2>&1 || true
fi
