"""Starting workers on many SSH hosts at once, against one host after another, same run.

    python bench/ssh_launch.py [--hosts 8] [--trials 3]

On --hosts sshd test hosts in network namespaces (tests/sshhosts.py, needs root), with a new
SSH connection to every host in every trial (as at a job's start), the SSH launcher's
launch() of one worker per host: on a pool of the driver's size (executor.LAUNCH_THREADS,
as `hvdlite run` starts its hosts) and one host after another. Prints, per way, the median
time until every worker runs, and the ratio parallel/serial: what parallel launching saves
here, where the 2 cores share every host's SSH handshake.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from sshhosts import TestHosts  # noqa: E402

from hvdlite.driver.executor import LAUNCH_THREADS  # noqa: E402
from hvdlite.driver.launchers.ssh import SSHHost, SSHSettings, launch  # noqa: E402

WORKER = [sys.executable, "-c", "print('up', flush=True)"]


class Quiet:
    """A RankOutput that drops the worker's lines."""
    label = "0"

    def line(self, stream, text):
        pass


def trial(names, ssh_config, cwd, parallel: bool) -> float:
    """Seconds from the first launch() to the last worker running, fresh connections."""
    hosts = [SSHHost(name, SSHSettings(ssh_config=ssh_config)) for name in names]
    env = {k: v for k, v in os.environ.items() if k.startswith("PYTHON")}

    def start(host):
        return launch(host, WORKER, env, cwd, Quiet())
    try:
        began = time.monotonic()
        if parallel:
            with ThreadPoolExecutor(LAUNCH_THREADS) as pool:
                workers = list(pool.map(start, hosts))
        else:
            workers = [start(host) for host in hosts]
        took = time.monotonic() - began
        for worker in workers:
            if worker.wait(30) != 0:
                raise RuntimeError(f"a worker on {worker.hostname} failed")
            worker.finish_output()
        return took
    finally:
        for host in hosts:
            host.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hosts", type=int, default=8)
    p.add_argument("--trials", type=int, default=3)
    args = p.parse_args()
    with TestHosts(args.hosts) as hosts, tempfile.TemporaryDirectory() as cwd:
        serial, parallel = [], []
        for _ in range(args.trials):  # interleaved: both see the same load
            serial.append(trial(hosts.names, hosts.ssh_config, cwd, parallel=False))
            parallel.append(trial(hosts.names, hosts.ssh_config, cwd, parallel=True))
    s, par = statistics.median(serial), statistics.median(parallel)
    print(f"hosts={args.hosts} serial_s={s:.3f} parallel_s={par:.3f} ratio={par / s:.2f}x "
          f"(one host's launch {s / args.hosts:.3f} s; {args.trials} trials; load {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
