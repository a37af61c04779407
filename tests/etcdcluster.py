"""A real three-member etcd 3.4 cluster on sshd test hosts (tests/sshhosts.py), for the drivers' store.

    cluster = EtcdCluster(hosts)     # members on host-1..host-3, or the `etcd_cluster` fixture
    cluster.url                      # etcd://10.X.Y.11:2379,...: what --driver-store takes
    cluster.kill("host-1")           # kill -9 of that member
    cluster.start("host-1")          # back, from its data folder, until it answers healthy
    cluster.close()

Each member runs in its host's network namespace (nsenter --net: the process is etcd itself, so
its pid is the one killed) and listens on the host's bridge address, clients on 2379 and peers on
2380; its data folder lies in the hosts' folder, removed with them. The hosts beyond the members
are free for drivers: `hosts.partition(name)` cuts one off from the members. Members die with
the test process (PDEATHSIG) and by pid at close().
"""
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request

from sshhosts import _die_with_parent

ETCD = "/usr/bin/etcd"


def missing():
    """Why an etcd test cluster cannot run here, or None."""
    if os.geteuid() != 0:
        return "the etcd test cluster needs root (network namespaces)"
    if not os.access(ETCD, os.X_OK):
        return f"{ETCD} is not installed (Debian's etcd-server; run .ci/install-etcd.sh as root)"
    if shutil.which("nsenter") is None:
        return "nsenter is not installed (util-linux)"
    return None


class EtcdCluster:
    def __init__(self, hosts, members: int = 3, start_timeout: float = 30.0):
        self.hosts = hosts
        self.names = hosts.names[:members]
        self.start_timeout = start_timeout
        self.dir = os.path.join(hosts.dir, "etcd")
        self.procs = {}
        self.address = {name: hosts.addresses[name] for name in self.names}
        self.peers = ",".join(f"{name}=http://{self.address[name]}:2380" for name in self.names)
        try:
            for name in self.names:
                self._spawn(name)
            self._wait(self.names)
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        return "etcd://" + ",".join(f"{self.address[name]}:2379" for name in self.names)

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def start(self, name: str) -> None:
        self._spawn(name)
        self._wait([name])

    def healthy(self, name: str) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.address[name]}:2379/health", timeout=1) as r:
                return json.loads(r.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def log(self, name: str) -> str:
        with open(os.path.join(self.dir, f"{name}.log"), errors="replace") as f:
            return f.read()

    def close(self) -> None:
        for name in list(self.procs):
            self.kill(name)

    def _spawn(self, name):
        os.makedirs(self.dir, exist_ok=True)
        a = self.address[name]
        argv = ["nsenter", f"--net=/run/netns/{self.hosts.hosts[name].netns}", ETCD,
                "--name", name, "--data-dir", os.path.join(self.dir, name),
                "--listen-client-urls", f"http://{a}:2379", "--advertise-client-urls", f"http://{a}:2379",
                "--listen-peer-urls", f"http://{a}:2380", "--initial-advertise-peer-urls", f"http://{a}:2380",
                "--initial-cluster", self.peers, "--initial-cluster-token", self.hosts.tag,
                "--initial-cluster-state", "new", "--pre-vote", "--logger", "zap", "--log-level", "warn"]
        with open(os.path.join(self.dir, f"{name}.log"), "ab") as log:
            self.procs[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                                start_new_session=True, preexec_fn=_die_with_parent)

    def _wait(self, names):
        """Until every member of `names` answers healthy (the cluster has a leader)."""
        deadline = time.monotonic() + self.start_timeout
        waiting = list(names)
        while waiting:
            for name in waiting:
                if self.procs[name].poll() is not None:
                    raise RuntimeError(f"etcd on {name} exited with {self.procs[name].returncode}:\n"
                                       + self.log(name)[-3000:])
            waiting = [name for name in waiting if not self.healthy(name)]
            if waiting and time.monotonic() > deadline:
                raise RuntimeError(f"etcd not healthy on {', '.join(waiting)} after "
                                   f"{self.start_timeout:g} s:\n" + self.log(waiting[0])[-3000:])
            if waiting:
                time.sleep(0.05)
