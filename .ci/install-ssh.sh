#!/usr/bin/env bash
# Debian tools the tests use: OpenSSH server/client, nftables and iproute2 for the SSH test
# hosts (tests/sshhosts.py); tcpdump for the capture that checks no secret crosses the network;
# chromium to render the job timeline (tests/test_observe.py).
# Idempotent, needs root: apt runs only when one of the tools is missing.
set -euo pipefail
missing=0
for tool in /usr/sbin/sshd ssh ssh-keygen nft ip tcpdump chromium; do
    command -v "$tool" >/dev/null 2>&1 || missing=1
done
if [ "$missing" -eq 1 ]; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        openssh-server openssh-client nftables iproute2 tcpdump chromium
fi
# sshd refuses to start without its privilege separation directory.
mkdir -p -m 0755 /run/sshd
