#!/bin/sh
# Prints the hosts available now, one host:slots per line. Point HOSTS_FILE at a file and edit
# it while the job runs to watch hvdlite scale up and down. Without it, the demo's schedule:
# this machine with 2 slots, and a third once the job (the `hvdlite run` that runs this script)
# is DEMO_GROW_AFTER seconds old, so that a worker joins while the example trains.
if [ -n "$HOSTS_FILE" ]; then cat "$HOSTS_FILE"; exit; fi
pid=$PPID
while [ "$pid" -gt 1 ] && ! tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q "hvdlite"; do
  pid=$(ps -o ppid= -p "$pid" | tr -d ' ')
done
age=$(ps -o etimes= -p "$pid" 2>/dev/null | tr -d ' ')
if [ "${age:-0}" -ge "${DEMO_GROW_AFTER:-20}" ]; then echo localhost:3; else echo localhost:2; fi
