#!/usr/bin/env python3
"""Discovery keyed on training progress: discover.py SCHEDULE PROGRESS_FILE [--runs].

SCHEDULE is a JSON list of [from_step, [lines...]]; the script prints the lines of the last
entry whose from_step the job's committed progress has reached. With --runs the key is how
many times the script ran instead: each run adds one to the number in PROGRESS_FILE first.
A line "FAIL" makes the script exit 1, "HANG" makes it sleep, anything else is printed as is.
"""
import json
import sys
import time

schedule = json.loads(open(sys.argv[1]).read())
try:
    progress = int(open(sys.argv[2]).read() or 0)
except (FileNotFoundError, ValueError):
    progress = 0
if sys.argv[3:] == ["--runs"]:
    progress += 1
    with open(sys.argv[2], "w") as f:
        f.write(str(progress))
lines = [entry for start, entry in schedule if start <= progress][-1]
for line in lines:
    if line == "FAIL":
        sys.exit(1)
    if line == "HANG":
        time.sleep(600)
    print(line)
