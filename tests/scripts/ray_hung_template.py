"""A Ray driver's launcher on one node whose template hangs (tests/test_ray.py).

    RAY_ADDRESS=HOST:PORT python ray_hung_template.py NODE_ID

Launches a worker (this script with --sleep: a command a template can fork), which starts the
node's template; stops the template once it is ready (SIGSTOP), launches twice more and prints
one JSON line: what the launcher said, how each worker started, whether the stopped template is
gone and the pid of the template serving afterwards.
"""
import json
import os
import signal
import sys
import time

from hvdlite import procstat
from hvdlite.driver.launchers.ray import RayLauncher
from hvdlite.driver.output import RankOutput
from hvdlite.driver.settings import Settings

WORKER = [sys.executable, os.path.abspath(__file__), "--sleep"]
# A spawn client waits half of it for the template's answer. The launch's actor may need a new
# Ray worker process first: at 4 s that did not fit once under CI's load ("no room for its actor").
START_TIMEOUT = 10.0


def wait(what, timeout=30.0):
    """what()'s first true value within `timeout` seconds, else None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.1)
    return None


def main(node):
    said, workers, hung = [], [], None  # every line said, not once each: a second one shows
    launcher = RayLauncher(Settings(command=WORKER, launcher="ray", preload=("json",), start_timeout=START_TIMEOUT,
                                    cpus_per_slot=0.25), said.append)  # room for three on a 1-CPU node

    def serving():
        template = launcher._templates.templates.get(node)
        return template.pid if template is not None and template.socket else None

    def launch():
        start = time.monotonic()
        workers.append(launcher.start(node, dict(os.environ), RankOutput(str(len(workers))), joining=True))
        return round(time.monotonic() - start, 1)

    try:
        launch()  # plainly: the node's template starts
        hung = wait(serving, 60)
        os.kill(hung, signal.SIGSTOP)
        seconds = [launch(), launch()]
        gone = bool(wait(lambda: procstat.state(hung) in procstat.GONE))
        after = wait(lambda: serving() not in (None, hung) and serving())
        print(json.dumps({"said": said, "started": [w.started for w in workers], "seconds": seconds,
                          "hung_gone": gone, "hung": hung, "after": after}), flush=True)
    finally:
        if hung is not None:  # a stopped template never exits by itself
            try:
                os.kill(hung, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for worker in workers:
            worker.stop(grace=0.2)
        launcher.close()


if __name__ == "__main__":
    if sys.argv[1] == "--sleep":
        print("up", flush=True)
        time.sleep(300)
    else:
        main(sys.argv[1])
