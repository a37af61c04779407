#!/bin/sh
# Prints the hosts available now, one host:slots per line. Point HOSTS_FILE at a file and edit
# it while the job runs to watch hvdlite scale up and down.
if [ -n "$HOSTS_FILE" ]; then cat "$HOSTS_FILE"; else echo localhost:2; fi
