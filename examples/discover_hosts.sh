#!/bin/sh
# Prints the hosts available now, one host:slots per line. Point HOSTS_FILE at a file and edit
# it while the job runs to watch hvdlite scale up and down. Without it, the demo's schedule,
# set by how far training got, not by the clock, so that it shows on any machine however slow:
# this machine with 2 slots, and a third once the job reached commit DEMO_GROW_AT (default 30;
# hvdlite gives every run of this script HVDLITE_NEWEST_COMMIT). examples/elastic_train.py's
# second worker kills itself after commit 22, so its survivor goes on alone, then a worker joins.
if [ -n "$HOSTS_FILE" ]; then cat "$HOSTS_FILE"; exit; fi
if [ "${HVDLITE_NEWEST_COMMIT:-0}" -ge "${DEMO_GROW_AT:-30}" ]; then echo localhost:3; else echo localhost:2; fi
