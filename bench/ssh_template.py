"""A worker started on an SSH host, plainly against forked from the host's template, same run.

    python bench/ssh_template.py [--trials 5]

On one sshd test host in a network namespace (tests/sshhosts.py, needs root), times the SSH
launcher's launch() -> the worker's line after `import torch` and building an SGD optimizer
(what a joining Horovod-style worker pays before it can join), launched plainly and through
the host's template (default preload). Prints medians and the ratio template/plain
(target <= 0.5x, as for local joins in bench/elastic.py).
"""
import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from sshhosts import TestHosts  # noqa: E402

from hvdlite.driver.launchers.ssh import SSHHost, SSHSettings, launch  # noqa: E402
from hvdlite.driver.launchers.ssh.template import RemoteTemplates  # noqa: E402
from hvdlite.driver.launchers.template import SayOnce  # noqa: E402
from hvdlite.template import DEFAULT_PRELOAD  # noqa: E402

WORKER = "import torch\ntorch.optim.SGD(torch.nn.Linear(4, 4).parameters(), lr=0.1)\nprint('ready', flush=True)\n"


class Until:
    """A RankOutput that notes when the worker printed `ready`."""
    label = "0"

    def __init__(self):
        self.ready = threading.Event()

    def line(self, stream, text):
        if text.startswith("ready"):
            self.ready.set()


def trial(host, script, env, cwd, socket_path):
    output = Until()
    start = time.monotonic()
    worker = launch(host, [sys.executable, script], env, cwd, output, template=socket_path)
    ok = output.ready.wait(120)
    took = time.monotonic() - start
    worker.wait(30)
    worker.finish_output()
    expected = "ssh" if socket_path is None else "template"
    return took if ok and worker.started == expected else None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=5)
    args = p.parse_args()
    env = {k: v for k, v in os.environ.items() if k.startswith("PYTHON")}
    with TestHosts(1) as hosts, tempfile.TemporaryDirectory() as cwd:
        script = os.path.join(cwd, "worker.py")
        with open(script, "w") as f:
            f.write(WORKER)
        host = SSHHost("host-1", SSHSettings(ssh_config=hosts.ssh_config))
        said = []
        templates = RemoteTemplates(DEFAULT_PRELOAD, SayOnce(said.append))
        try:
            argv = [sys.executable, script]
            templates.socket(host, argv, env, cwd, start=True)
            deadline = time.monotonic() + 180
            while templates.socket(host, argv, env, cwd, start=False) is None and not said \
                    and time.monotonic() < deadline:
                time.sleep(0.1)
            socket_path = templates.socket(host, argv, env, cwd, start=False)
            if socket_path is None:
                sys.exit(f"bench: the template did not start: {said or 'timed out'}")
            plain, forked = [], []
            for _ in range(args.trials):  # interleaved: both see the same load
                plain.append(trial(host, script, env, cwd, None))
                forked.append(trial(host, script, env, cwd, socket_path))
        finally:
            templates.close()
            host.close()
    report("plain launch ", plain)
    report("from template", forked)
    ok_plain, ok_forked = [v for v in plain if v is not None], [v for v in forked if v is not None]
    if ok_plain and ok_forked:
        print(f"ratio template/plain: {statistics.median(ok_forked) / statistics.median(ok_plain):.2f}x "
              f"(target <= 0.5x); load {os.getloadavg()[0]:.2f}")


def report(label, values):
    ok = sorted(v for v in values if v is not None)
    failed = len(values) - len(ok)
    if not ok:
        print(f"{label}: no successful trial ({failed} failed)")
        return
    print(f"{label}: launch -> torch imported and an SGD built: median {statistics.median(ok):.2f} s, "
          f"max {ok[-1]:.2f} s over {len(ok)} trials" + (f", {failed} failed" if failed else ""))


if __name__ == "__main__":
    main()
