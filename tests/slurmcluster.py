"""A real Slurm 22.05 cluster for tests: munged, slurmctld and N slurmd nodes n1..nN.

    cluster = SlurmCluster(4)        # or the module-scoped `slurm_cluster` fixture below
    cluster.env                      # environment for srun/salloc/sbatch/scontrol (SLURM_CONF)
    cluster.run(["sinfo", "-N"])     # a Slurm client command against this cluster
    cluster.kill_node("n2")          # kill -9 every process in the node's network namespace
    cluster.start_node("n2")         # slurmd again (ReturnToService=2 takes the node back)
    cluster.free()                   # after a test: no job listed, nothing left, every slurmd up
    cluster.leftovers("n1")          # processes on the node other than its slurmd
    cluster.close()

Each node is a network namespace on a bridge (tests/sshhosts.py's Bridge) at 10.212.Y.(10+i),
the controller at 10.212.Y.1 in the root namespace; 10.212/16 is this cluster's range (the Ray
test cluster uses 10.213/16, the SSH hosts neither). A node's slurmd runs with its own hostname
and a hosts file naming the controller and every node, bind-mounted over /etc/hosts in a private
mount namespace (its own hostname lookup would otherwise wait on an unreachable resolver). The
node is entered with nsenter + unshare, not `ip netns exec`: that remounts /sys, hiding
/sys/fs/cgroup, and slurmd then refuses to start. munged has its own key and socket, slurmctld
its own port, so two sessions' clusters never meet. Daemons die with the test process
(PDEATHSIG); whatever a killed session left behind is removed by the next one (sshhosts'
new_tag: names carry the owner's pid).
"""
import os
import shutil
import socket
import subprocess
import tempfile
import time

import pytest

from sshhosts import NamespacedNodes, free_port, PREFIX, Bridge, _die_with_parent, new_tag

SLURMCTLD, SLURMD, MUNGED = "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged"
CLIENTS = ("srun", "salloc", "sbatch", "scontrol", "scancel", "sinfo", "squeue")


def missing():
    """Why a Slurm test cluster cannot run here, or None."""
    if os.geteuid() != 0:
        return "the Slurm test cluster needs root (network namespaces, slurmd)"
    for path in (SLURMCTLD, SLURMD, MUNGED):
        if not os.access(path, os.X_OK):
            return f"{path} is not installed (run .ci/install-slurm.sh as root)"
    for tool in CLIENTS + ("ip", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (run .ci/install-slurm.sh as root)"
    return None



class SlurmCluster(NamespacedNodes):
    """munged + slurmctld + `count` slurmd nodes; see the module docstring."""

    def __init__(self, count: int, slurmd_timeout: int = 30, start_timeout: float = 20.0):
        reason = missing()
        if reason:
            raise RuntimeError(reason)
        self.tag = new_tag("s")
        self.dir = tempfile.mkdtemp(prefix=f"hvdlite-slurm-{self.tag}-")
        os.chmod(self.dir, 0o755)  # munged wants its socket's folders searchable by all
        self.start_timeout, self.slurmd_timeout = start_timeout, slurmd_timeout
        self.names = [f"n{i}" for i in range(1, count + 1)]
        self.procs = {}  # daemon name -> Popen
        self.bridge = None
        self.netns, self.addresses = {}, {}
        try:
            self.bridge = Bridge(f"{PREFIX}{self.tag}", os.getpid(), second="212")
            self.controller = self.bridge.address
            for i, name in enumerate(self.names, 1):
                self.netns[name], _, self.addresses[name] = self.bridge.add(i)
            self._write_files()
            self._start_munged()
            self._start("slurmctld", [SLURMCTLD, "-D", "-f", self.conf])
            self._wait("slurmctld", lambda: "UP" in self.run(["scontrol", "ping"], check=False).stdout)
            for name in self.names:
                self.start_node(name, wait=False)
            self._wait("the slurmd nodes", lambda: self.idle() == set(self.names))
        except BaseException:
            self.close()
            raise

    # ---- public -------------------------------------------------------------------
    @property
    def env(self):
        return {**os.environ, "SLURM_CONF": self.conf}

    def run(self, argv, timeout=30.0, check=True, **kwargs):
        """A Slurm client command against this cluster (text output)."""
        return subprocess.run(argv, env={**self.env, **kwargs.pop("env", {})}, capture_output=True,
                              text=True, timeout=timeout, check=check, **kwargs)

    def idle(self):
        out = self.run(["sinfo", "-h", "-N", "-t", "idle", "-o", "%N"], check=False).stdout
        return set(out.split())

    def start_node(self, name: str, wait: bool = True) -> None:
        """(Re)start the node's slurmd in its namespaces; with `wait`, until the node is idle."""
        script = (f"mount --bind {self.hosts_file} /etc/hosts && hostname {name} && "
                  f"exec {SLURMD} -D -f {self.conf}")
        self._start(name, ["nsenter", f"--net=/run/netns/{self.netns[name]}", "unshare", "--uts",
                           "--mount", "--propagation", "private", "sh", "-c", script])
        if wait:
            self.run(["scontrol", "update", f"nodename={name}", "state=resume"], check=False)
            self._wait(f"slurmd of {name}", lambda: name in self.idle())

    def jobs(self):
        """The jobs Slurm lists (pending, running or completing): `ID STATE NODES` lines."""
        return self.run(["squeue", "-h", "-o", "%i %T %N"], check=False).stdout.split("\n")[:-1]

    def free(self, timeout: float = 30.0) -> None:
        """Back to every node free, after a test: slurmd restarted where a test killed it, every
        job cancelled and waited for until Slurm lists none, nothing left on the nodes. A node's
        slurmd killed while it ends a job leaves the node COMPLETING until slurmctld's periodic
        resend of the terminate request (60 s here; MessageTimeout and KillWait do not shorten
        it): the next allocation of the node waits that long. So nodes are restarted, never
        killed, here."""
        for name in self.names:
            if name not in self.procs or self.procs[name].poll() is not None:
                self.start_node(name)
        listed = self.jobs()
        if listed:
            self.run(["scancel", *(line.split()[0] for line in listed)], check=False)
        deadline = time.monotonic() + timeout
        while listed or any(self.leftovers(n) for n in self.names):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the nodes not free {timeout:g} s after the test: jobs {listed}, processes "
                    f"{ {n: self.leftovers(n) for n in self.names} }, nodes "
                    f"{self.run(['sinfo', '-h', '-N', '-o', '%N %T'], check=False).stdout.split()}")
            time.sleep(0.1)
            listed = self.jobs()

    def leftovers(self, name: str):
        """Command lines of the node's processes other than its slurmd."""
        keep = self.procs.get(name)
        out = []
        for pid in self.node_pids(name):
            if keep is not None and pid == keep.pid:
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    out.append(f.read().replace(b"\0", b" ").decode(errors="replace").strip())
            except OSError:
                pass
        return out

    def log(self, filename: str) -> str:
        """A file of the cluster's log folder: DAEMON.log (Slurm's own), DAEMON.out (its output)."""
        try:
            with open(os.path.join(self.dir, "log", filename), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def close(self) -> None:
        for name in list(self.netns):
            self.kill_node(name)
        for daemon in ("slurmctld", "munged"):
            proc = self.procs.pop(daemon, None)
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        self.release()

    # ---- setup --------------------------------------------------------------------
    def _write_files(self):
        d = self.dir
        for sub in ("log", "state", "spool", "munge"):
            os.makedirs(os.path.join(d, sub), mode=0o755, exist_ok=True)
        self.munge_socket = os.path.join(d, "munge", "socket")
        key = os.path.join(d, "munge", "key")
        with open(os.open(key, os.O_WRONLY | os.O_CREAT, 0o400), "wb") as f:
            f.write(os.urandom(1024))
        # slurmctld checks that SlurmctldHost names this machine
        self.controller_name = socket.gethostname().split(".")[0]
        self.hosts_file = os.path.join(d, "hosts")
        with open(self.hosts_file, "w") as f:
            f.write(f"127.0.0.1 localhost\n{self.controller} {self.controller_name}\n")
            f.writelines(f"{self.addresses[n]} {n}\n" for n in self.names)
        nodes = f"n[1-{len(self.names)}]"
        self.conf = os.path.join(d, "slurm.conf")
        with open(self.conf, "w") as f:
            f.write(f"""ClusterName=hvdlite{self.tag.replace('-', '')}
SlurmctldHost={self.controller_name}({self.controller})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
SlurmctldPort={free_port(self.controller)}
SlurmdPort=6818
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdTimeout={self.slurmd_timeout}
MessageTimeout=10
KillWait=5
NodeName={nodes} NodeAddr={','.join(self.addresses[n] for n in self.names)} CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes={nodes} Default=YES MaxTime=INFINITE State=UP
""")

    def _start(self, name, argv):
        log = open(os.path.join(self.dir, "log", f"{name}.out"), "ab")
        # PDEATHSIG: a test process killed outright takes its daemons along
        self.procs[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                            env=self.env, start_new_session=True,
                                            preexec_fn=_die_with_parent)
        log.close()

    def _start_munged(self):
        m = os.path.join(self.dir, "munge")
        self._start("munged", [MUNGED, "-F", "--force", f"--key-file={m}/key",
                               f"--socket={self.munge_socket}", f"--pid-file={m}/pid",
                               f"--log-file={m}/log", f"--seed-file={m}/seed"])
        self._wait("munged", lambda: os.path.exists(self.munge_socket))

    def _wait(self, what, ready):
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode} while starting:\n"
                                       + self._tail(name))
            if ready():
                return
            time.sleep(0.05)
        raise RuntimeError(f"{what} not ready after {self.start_timeout:g} s:\n"
                           + self._tail("slurmctld"))

    def _tail(self, name):
        return (self.log(name + ".out") + self.log(name + ".log"))[-3000:]


@pytest.fixture(scope="module")
def slurm_cluster():
    """Four Slurm nodes n1..n4 shared by a test module; skips with the reason when the cluster
    cannot run here."""
    reason = missing()
    if reason:
        pytest.skip(reason)
    cluster = SlurmCluster(4)
    try:
        yield cluster
    finally:
        cluster.close()
