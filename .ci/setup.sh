#!/usr/bin/env bash
# Everything the tests need on a fresh machine: OpenSSH and network tools for the SSH test
# hosts, then hvdlite with its test dependencies (torch pinned to the CPU build on disk).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f .ci/install-ssh.sh ]; then bash .ci/install-ssh.sh; fi
python3 -m pip install -q -e '.[test]'
