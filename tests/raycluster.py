"""A real Ray 2.60 cluster for tests: a head and N nodes n1..nN, each node in its own namespaces.

    cluster = RayCluster(3)          # or the module-scoped `ray_cluster` fixture (conftest.py)
    cluster.address                  # HEAD:PORT, for --ray-address / ray.init
    cluster.env                      # RAY_AUTH_MODE and RAY_ADDRESS for drivers and clients
    cluster.node_id("n2")            # the node's Ray NodeID (hex)
    cluster.kill_node("n2")          # kill -9 every process in its network namespace
    cluster.start_node("n2")         # a new raylet there (a new NodeID), until Ray lists it
    cluster.drain_node("n2")         # Ray's graceful drain (preemption), then the node stops
    cluster.partition("n2"); cluster.heal("n2")
    cluster.leftovers("n1")          # command lines of the node's processes other than Ray's
    cluster.template("n1")           # pid of the worker template serving on the node, or None
    cluster.alive()                  # the names of the nodes Ray lists alive
    cluster.reset()                  # every node alive on a raylet of its own, nothing else listed
    cluster.autoscaled(True)         # clients now see an autoscaler (the test adds the nodes)
    cluster.close()

The head runs in the root namespace on the bridge address 10.213.Y.1 (a driver on this machine
connects through the head's raylet) with 0 CPUs, so work lands on the nodes only; its Ray temp
folder is a private one. Node i is a network namespace on tests/sshhosts.py's Bridge at
10.213.Y.(10+i), entered with nsenter + unshare: a private mount namespace with a hosts file over
/etc/hosts (a node's lookup of its own name would wait on an unreachable resolver) and a tmpfs over
the head's temp folder, which nodes take from the GCS (two raylets sharing it race on socket names). RAY_AUTH_MODE is set explicitly
everywhere: a leftover ~/.ray/auth_token would turn token auth on and leave a driver without the
variable hanging. Daemons die with the test process (PDEATHSIG); whatever a killed session left
behind is removed by the next one (sshhosts' remove_stale: names carry the owner's pid).
"""
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from hvdlite import procstat
from sshhosts import NamespacedNodes, free_port, PREFIX, Bridge, _b36, _die_with_parent, remove_stale

_clusters = 0  # clusters started by this process (part of the names)
NODE_RETRIES = 2  # starts of a node's raylet that may fail while it starts
OBJECT_STORE = "--object-store-memory=80000000"  # bytes of /dev/shm per node: tests move little
RAY_DAEMONS = ("raylet", "gcs_server", "ray start", "ray::", "default_worker", "dashboard",
               "log_monitor", "runtime_env", "monitor.py", "ray/_private", "ray/autoscaler")
JOB_ACTORS = ("ray::Slot", "ray::NodeTemplate")  # Ray worker processes that are a job's (their title)


def missing():
    """Why a Ray test cluster cannot run here, or None."""
    if os.geteuid() != 0:
        return "the Ray test cluster needs root (network namespaces)"
    try:
        import ray  # noqa: F401
    except ImportError:
        return "ray is not installed (pip install 'hvdlite[ray]'; .ci/setup.sh installs it)"
    for tool in ("ip", "nsenter", "unshare", "nft"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (run .ci/install-ssh.sh as root)"
    return None



def cmdline(pid) -> str:
    """The process's command line, words joined by spaces ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def parent(pid) -> int:
    """The process's parent pid (0 once it is gone)."""
    fields = procstat.stat_fields(pid)
    return int(fields[1]) if fields else 0


class RayCluster(NamespacedNodes):
    """A head + `count` nodes of `cpus` CPUs each (and `gpus` GPUs, as Ray counts them: none
    need exist); see the module docstring."""

    def __init__(self, count: int, cpus: int = 1, start_timeout: float = 60.0, gpus: int = 0):
        reason = missing()
        if reason:
            raise RuntimeError(reason)
        global _clusters
        if _clusters == 0:
            remove_stale()
        _clusters += 1
        self.tag = f"{_b36(os.getpid())}-r{_clusters}"
        self.dir = tempfile.mkdtemp(prefix=f"hvdlite-ray-{self.tag}-")
        os.chmod(self.dir, 0o755)
        self.cpus, self.gpus, self.start_timeout = cpus, gpus, start_timeout
        self.names = [f"n{i}" for i in range(1, count + 1)]
        self.procs = {}  # "head" or node name -> Popen of its `ray start --block`
        self.bridge = None
        self.netns, self.addresses = {}, {}
        self._ids = {}  # node name -> NodeID of its current raylet
        self._gone = set()  # NodeIDs of raylets killed here (Ray may list them alive for 15 s)
        self._disturbed = set()  # names of nodes drained or cut off: reset() starts them anew
        self._touched = False  # a node was killed, stopped, started, drained or cut off since the last reset
        self._watcher = None  # the process that asks the GCS for the node table (_Watcher)
        try:
            self.bridge = Bridge(f"{PREFIX}{self.tag}", os.getpid(), second="213")
            self.head = self.bridge.address
            self.address = f"{self.head}:{free_port(self.head)}"
            for i, name in enumerate(self.names, 1):
                self.netns[name], _, self.addresses[name] = self.bridge.add(i)
            self._write_hosts()
            self._start("head", ["ray", "start", "--head", f"--node-ip-address={self.head}",
                                 f"--port={self.address.split(':')[1]}", "--num-cpus=0",
                                 "--include-dashboard=false", "--disable-usage-stats", OBJECT_STORE,
                                 f"--temp-dir={self.dir}/head", "--block"])
            self._wait("the head", lambda: self._alive_nodes() is not None)
            for name in self.names:
                self.start_node(name, wait=False)
            self._wait("the nodes", lambda: self._refresh() >= set(self.names))
            self._touched = False
        except BaseException:
            self.close()
            raise

    # ---- public -------------------------------------------------------------------
    @property
    def env(self):
        """The environment of a driver on this machine (hvdlite run, ray.init('auto'))."""
        return {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": self.address,
                "RAY_USAGE_STATS_ENABLED": "0"}

    def node_id(self, name: str) -> str:
        return self._ids[name]

    def start_node(self, name: str, wait: bool = True) -> None:
        """A raylet in the node's namespaces; with `wait`, until Ray lists it alive."""
        self._ids.pop(name, None)
        self._touched = True
        ray = os.path.join(os.path.dirname(sys.executable), "ray")
        # A node takes the head's temp folder from the GCS: a private one over it, per node.
        script = (f"mount --bind {self.hosts_file} /etc/hosts && "
                  f"mount -t tmpfs tmpfs {self.dir}/head && hostname {name} && "
                  f"exec {ray} start --address={self.address} "
                  f"--node-ip-address={self.addresses[name]} --num-cpus={self.cpus} --num-gpus={self.gpus} "
                  f"--disable-usage-stats {OBJECT_STORE} --block")
        self._start(name, ["nsenter", f"--net=/run/netns/{self.netns[name]}", "unshare", "--uts",
                           "--mount", "--propagation", "private", "sh", "-c", script])
        if wait:
            self._wait(f"node {name}", lambda: name in self._refresh())

    def kill_node(self, name: str) -> None:
        if name in self._ids:
            self._gone.add(self._ids[name])
        self._touched = True
        super().kill_node(name)

    def reset(self) -> None:
        """Back to a known cluster: each node runs an undisturbed raylet, and Ray lists alive
        exactly one node per name. A killed raylet stays listed alive until Ray notices (up to
        15 s): a job would take it for a host and fail to place its actor there. A cluster no
        node of which was touched since the last reset is known to be so already."""
        if not self._touched:
            return
        for name in self.names:
            if name in self._disturbed or name not in self.procs:
                self.heal(name)
                self.stop_node(name)
                self.start_node(name, wait=False)
        self._disturbed.clear()
        self._wait("a clean cluster", self._clean)
        self._touched = False

    def _clean(self) -> bool:
        nodes = self._alive_nodes()
        if nodes is None:
            return False
        addresses = sorted(n["NodeManagerAddress"] for n in nodes if n["NodeManagerAddress"] != self.head)
        return addresses == sorted(self.addresses.values()) and self._refresh(nodes) == set(self.names)

    def drain_node(self, name: str, deadline: int = 30) -> None:
        """Ask Ray to drain the node (preemption with a deadline); Ray itself never stops it."""
        self._disturbed.add(name)
        self._touched = True
        self.ray(["drain-node", f"--address={self.address}", f"--node-id={self.node_id(name)}",
                  "--reason=DRAIN_NODE_REASON_PREEMPTION", "--reason-message=test drain",
                  f"--deadline-remaining-seconds={deadline}"])

    def stop_node(self, name: str, timeout: float = 15.0) -> None:
        """The node's operator stops it: TERM its `ray start --block`, then whatever is left."""
        proc = self.procs.get(name)
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill_node(name)

    def partition(self, name: str) -> None:
        self._disturbed.add(name)
        self._touched = True
        super().partition(name)

    def leftovers(self, name: str):
        """Command lines of the node's processes that are not Ray's own: a job's workers and
        their children, and its actors."""
        lines = [cmdline(pid) for pid in self.node_pids(name)]
        return [line for line in lines if line and (line.startswith(JOB_ACTORS) or not any(
            d in line for d in RAY_DAEMONS) and not line.startswith("sh -c mount"))]

    def template(self, name: str):
        """The pid of the worker template serving on the node, or None: a template whose parent
        is Ray's actor (a worker it forked may show its command line too), once its socket
        listens in the node's network namespace."""
        for pid in self.node_pids(name):
            if "-m hvdlite.template --preload" in cmdline(pid) and "hvdlite.template" not in cmdline(parent(pid)):
                try:
                    with open(f"/proc/{pid}/net/unix") as f:
                        return pid if "/hvdlite-template-" in f.read() else None
                except OSError:
                    return None
        return None

    _CONFIG = ("from ray.core.generated import autoscaler_pb2 as pb\n"
               "group = pb.NodeGroupConfig(name='worker', max_count=10, resources={'CPU': 1})\n"
               "kv._internal_kv_put(b'__autoscaler_cluster_config', "
               "pb.ClusterConfig(node_group_configs=[group]).SerializeToString(), namespace=b'__autoscaler')")

    def autoscaled(self, on: bool):
        """Pose as an autoscaler (v2's or KubeRay's), or stop: its cluster config in the GCS is
        how a client tells that nodes can be added. The test adds them itself. Returns the
        bundles a client last asked an autoscaler for (request_resources), or None."""
        change = self._CONFIG if on else \
            "kv._internal_kv_del(b'__autoscaler_cluster_config', namespace=b'__autoscaler')"
        return json.loads(self._client(f"{change}\nprint(json.dumps(json.loads("
                                       "kv._internal_kv_get(b'autoscaler_resource_request') or b'null')))"))

    def _client(self, body: str) -> str:
        """Run `body` in a short-lived client of the cluster (`kv`: Ray's internal KV); its output."""
        script = ("import json, ray\nfrom ray.experimental import internal_kv as kv\n"
                  f"ray.init(address='{self.address}', logging_level='ERROR', log_to_driver=False)\n{body}")
        r = subprocess.run([sys.executable, "-c", script], env=self.env, capture_output=True,
                           text=True, timeout=60, check=True)
        return r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""

    def nodes(self):
        """ray.nodes() as a separate client sees it (this test process stays no Ray driver)."""
        return self._alive_nodes(every=True) or []

    def ray(self, args, timeout=30.0, check=True):
        return subprocess.run([os.path.join(os.path.dirname(sys.executable), "ray"), *args],
                              env=self.env, capture_output=True, text=True, timeout=timeout,
                              check=check)

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
        for name in list(self.netns):
            self.kill_node(name)
        proc = self.procs.pop("head", None)
        if proc is not None:
            proc.terminate()  # `ray start --block` ends its daemons on TERM
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, 9)  # whatever of the head's session is left
            except ProcessLookupError:
                pass
            proc.wait(5)
        self.release()

    # ---- setup --------------------------------------------------------------------
    def _write_hosts(self):
        self.hosts_file = os.path.join(self.dir, "hosts")
        with open(self.hosts_file, "w") as f:
            f.write(f"127.0.0.1 localhost\n{self.head} {socket.gethostname()}\n")
            f.writelines(f"{self.addresses[n]} {n}\n" for n in self.names)

    def _start(self, name, argv):
        log = open(os.path.join(self.dir, f"{name}.out"), "ab")
        # PDEATHSIG: a test process killed outright takes its daemons along
        self.procs[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                            env=self.env, start_new_session=True,
                                            preexec_fn=_die_with_parent)
        log.close()

    # ray.nodes() as the GCS tells, asked of one long-lived process (see _Watcher): a client
    # started per question imported Ray (0.7 CPU-s alone) and joined as a driver each time.
    def _alive_nodes(self, every=False):
        """ray.nodes() (the fields tests read), or None while the head does not answer."""
        try:  # a GCS that does not listen yet would keep the watcher's first question 15 s
            socket.create_connection(self.address.rsplit(":", 1), 1.0).close()
        except OSError:
            return None
        if self._watcher is None:
            self._watcher = _Watcher(self.address, self.env, os.path.join(self.dir, "watcher.out"))
        nodes = self._watcher.ask()
        if self._watcher.proc.poll() is not None:  # it gave no answer: the next look starts another
            self._watcher = None
        return None if nodes is None else nodes if every else [n for n in nodes if n["Alive"]]

    def alive(self):
        """The names of the nodes Ray lists alive now."""
        return self._refresh()

    def _refresh(self, nodes=None):
        """The names of the nodes Ray lists alive (now, or in `nodes`), their NodeIDs noted."""
        by_address = {a: name for name, a in self.addresses.items()}
        alive = set()
        for n in (self._alive_nodes() or []) if nodes is None else nodes:
            name = by_address.get(n["NodeManagerAddress"])
            if name is not None and n["NodeID"] not in self._gone:
                self._ids[name] = n["NodeID"]
                alive.add(name)
        return alive

    def _wait(self, what, ready):
        deadline = time.monotonic() + self.start_timeout
        retries = {}
        while time.monotonic() < deadline:
            for name, proc in list(self.procs.items()):
                if proc.poll() is None:
                    continue
                # On a loaded machine a raylet may give up waiting for the GCS: once more.
                if name != "head" and retries.get(name, 0) < NODE_RETRIES:
                    retries[name] = retries.get(name, 0) + 1
                    self.kill_node(name)
                    self.start_node(name, wait=False)
                    continue
                raise RuntimeError(f"{name} exited with {proc.returncode} while starting:\n"
                                   + self._tail(name))
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"{what} not ready after {self.start_timeout:g} s:\n" + self._tail("head"))

    def _tail(self, name):
        try:
            with open(os.path.join(self.dir, f"{name}.out"), errors="replace") as f:
                return f.read()[-2000:]
        except OSError:
            return ""



class _Watcher:
    """One process that answers each question with the GCS's node table as JSON (null while
    the GCS does not answer): a client of the GCS only, no Ray driver (no job, no worker)."""

    SCRIPT = ("import json, sys\n"
              "from ray._private.internal_api import get_state_from_address\n"
              "state = get_state_from_address(sys.argv[1])\n"
              "keys = ('NodeID', 'Alive', 'NodeManagerAddress', 'Resources', 'DeathReason', 'DeathReasonMessage')\n"
              "for _ in sys.stdin:\n"
              "    try:\n"
              "        nodes = [{k: n[k] for k in keys if k in n} for n in state.node_table()]\n"
              "    except Exception:  # the GCS does not answer (yet)\n"
              "        nodes = None\n"
              "    print(json.dumps(nodes), flush=True)\n")
    TIMEOUT = 30.0  # seconds one answer may take

    def __init__(self, address, env, log):
        with open(log, "ab") as err:
            self.proc = subprocess.Popen([sys.executable, "-c", self.SCRIPT, address], env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                         start_new_session=True, preexec_fn=_die_with_parent)

    def ask(self):
        """The node table, or None: the GCS did not answer it, or the watcher gave no answer
        within TIMEOUT (then it is ended)."""
        try:
            self.proc.stdin.write(b"?\n")
            self.proc.stdin.flush()
            ready, _, _ = select.select([self.proc.stdout], [], [], self.TIMEOUT)
            return json.loads(self.proc.stdout.readline() if ready else b"")
        except (OSError, ValueError):
            self.close()
            return None

    def close(self):
        self.proc.kill()
        self.proc.wait(5)
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:  # a write the watcher never read: nothing to keep
                pass
