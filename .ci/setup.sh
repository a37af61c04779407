#!/usr/bin/env bash
# Everything the tests need on a fresh machine: OpenSSH and network tools for the SSH test
# hosts, Slurm and munge for the Slurm test cluster, etcd for the drivers' store, then hvdlite with its test dependencies
# (torch pinned to the CPU build on disk), Lightning, transformers and Accelerate, and Ray 2.60 for the --ray tests (tests/raycluster.py).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f .ci/install-ssh.sh ]; then bash .ci/install-ssh.sh; fi
if [ -f .ci/install-slurm.sh ]; then bash .ci/install-slurm.sh; fi
if [ -f .ci/install-etcd.sh ]; then bash .ci/install-etcd.sh; fi
# Headless Chromium renders the docs' front page and the job timeline in tests (skipped without).
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ]; then
    { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium; } \
      || echo "setup: could not install chromium; the page rendering tests will be skipped" >&2
  else
    echo "setup: not root, no chromium; the page rendering tests will be skipped" >&2
  fi
fi
# Re-runs skip pip while this checkout is installed with every requirement met (.ci/installed.py).
python3 -E .ci/installed.py --extras test,ray,lightning,transformers || python3 -m pip install -q -e '.[test,ray,lightning,transformers]'
# The numpy backend's workers run on pygloo, whose wheels exist for CPython 3.8-3.10 only:
# a torch-free venv in .venv-pygloo/ (gitignored), when such an interpreter exists.
pygloo_python() {
  for py in python3.10 python3.9 python3.8 "$(pyenv root 2>/dev/null)"/versions/3.{10,9,8}.*/bin/python; do
    if "$py" -c 'import sys; assert (3, 8) <= sys.version_info < (3, 11)' 2>/dev/null; then
      echo "$py"; return
    fi
  done
}
py=$(pygloo_python)
if [ -n "$py" ]; then
  [ -x .venv-pygloo/bin/python ] || "$py" -m venv .venv-pygloo
  if ! .venv-pygloo/bin/python -E .ci/installed.py pygloo numpy cloudpickle; then
    .venv-pygloo/bin/python -m pip install -q pygloo numpy cloudpickle
    .venv-pygloo/bin/python -m pip install -q -e .
  fi
else
  echo "setup: no Python 3.8-3.10 interpreter; the numpy backend's tests will be skipped" >&2
fi
