"""Real sshd test hosts: one sshd per host, each in its own network namespace on a private bridge.

    hosts = TestHosts(3)            # host-1..host-3, or use the `ssh_hosts` fixture factory
    hosts.ssh_config                # ssh_config file: Host host-N -> HostName/Port/User/keys
    hosts.run("host-1", ["ps", "-eo", "pid,args"])   # inside that host's namespaces
    hosts.partition("host-1"); hosts.heal("host-1")  # nftables drop inside its namespace
    hosts.kill_all("host-1"); hosts.start("host-1")  # the host dies / comes back
    hosts.close()

Layout (namespace mode, needs root, iproute2 and unshare): a bridge `hvt-<tag>b` with address
10.X.Y.1/24 (`driver_address`: the rendezvous server must bind to it, a server on 127.0.0.1 is
unreachable from the hosts), host N at 10.X.Y.(10+N) in namespace `hvt-<tag>-hN`, its sshd
started by `unshare --pid --uts --mount --mount-proc --fork --kill-child`, so the host has its
own hostname and process list and killing the `unshare` process kills every process of the
host. Inside the host's mount namespace root's ~/.bashrc is hidden (bind-mounted /dev/null):
it costs ~0.3 s per ssh exec on this machine (`hide_bashrc=False` keeps it).

Without namespaces (not root, or `ip netns` fails) the hosts fall back to sshd on 127.X.Y.(10+N)
with their own ports: all hosts then share the network, so `partition` raises; `mode` and
`fallback_reason` say so and a warning is printed.

Names carry the owning pid (`<tag>` = base-36 pid + group number), so a new session removes
namespaces, links and processes left by sessions whose process is gone, and parallel sessions
use different names and subnets. Traffic stays on the bridge or loopback: the namespaces have
no default route.
"""
import ctypes
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings

SSHD = "/usr/sbin/sshd"
PREFIX = "hvt-"
NFT_PARTITION = (
    "table inet partition {\n"
    " chain i { type filter hook input priority 0; policy drop; iif \"lo\" accept; }\n"
    " chain o { type filter hook output priority 0; policy drop; oif \"lo\" accept; }\n"
    "}\n")

TEMP_DIRS = ("hvdlite-sshhosts-", "hvdlite-slurm-", "hvdlite-ray-")  # + <tag>: removed once the owner is gone
_groups = 0  # host groups created by this process (part of the names)


def missing_tools():
    """Why SSH test hosts cannot run here, or None."""
    if not os.access(SSHD, os.X_OK):
        return f"sshd is not installed ({SSHD} missing; run .ci/install-ssh.sh as root)"
    if shutil.which("ssh-keygen") is None:
        return "ssh-keygen is not installed (openssh-client; run .ci/install-ssh.sh as root)"
    return None


def _die_with_parent():
    """preexec_fn: SIGKILL this child when the test process dies, however it dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _b36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


def _owner_pid(name: str):
    """The pid encoded in one of our names (`hvt-<b36pid>-...`), or None."""
    parts = name[len(PREFIX):].split("-")
    try:
        return int(parts[0], 36)
    except ValueError:
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _running(pid: int) -> bool:
    """pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=check)


def _children(pid: int):
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            # the command name may contain spaces and parentheses: split after the last ')'
            if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
                kids.append(int(entry))
    return kids


def _tree(pid: int):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(_children(p))
    return out


def remove_stale():
    """Delete namespaces, links, processes and temp dirs of earlier sessions whose process is gone."""
    tmp = tempfile.gettempdir()
    for entry in os.listdir(tmp):
        for kind in TEMP_DIRS:
            if entry.startswith(kind):
                pid = _owner_pid(PREFIX + entry[len(kind):])
                if pid is not None and not _alive(pid):
                    shutil.rmtree(os.path.join(tmp, entry), ignore_errors=True)
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return
    try:
        netns = _ip("netns", "list", check=False).stdout.split("\n")
        links = _ip("-o", "link", "show", check=False).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return
    for line in netns:
        name = line.split(" ")[0]
        pid = _owner_pid(name) if name.startswith(PREFIX) else None
        if pid is not None and not _alive(pid):
            for p in _ip("netns", "pids", name, check=False).stdout.split():
                try:
                    os.kill(int(p), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _ip("netns", "del", name, check=False)
    for line in links:
        fields = line.split(": ")
        if len(fields) < 2:
            continue
        name = fields[1].split("@")[0]
        pid = _owner_pid(name) if name.startswith(PREFIX) else None
        if pid is not None and not _alive(pid):
            _ip("link", "del", name, check=False)


def new_tag(kind: str = "") -> str:
    """`<b36 pid>-<kind><n>`, a part of names unique to this process and group of hosts; the
    first call removes what sessions whose process is gone left behind."""
    global _groups
    if _groups == 0:
        remove_stale()
    _groups += 1
    return f"{_b36(os.getpid())}-{kind}{_groups}"


def _used_subnets():
    try:
        out = _ip("-o", "-4", "route", "show", "table", "all", check=False).stdout
        out += _ip("-o", "-4", "addr", "show", check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    used = set()
    for word in out.split():
        if word.startswith("10."):
            parts = word.split("/")[0].split(".")
            if len(parts) >= 3:
                used.add(tuple(parts[:3]))
    return used


SUBNET_LOCK = os.path.join(tempfile.gettempdir(), "hvdlite-test-subnets.lock")
RESERVED = {"212", "213"}  # 10.212/16: the Slurm test cluster, 10.213/16: the Ray one


def _pick_subnet(seed: int, second=None):
    """A 10.X.Y.0/24 not on any route or interface of this machine; X is `second` when given,
    else any 200-253 other than the ranges RESERVED for other clusters."""
    used = _used_subnets()
    for i in range(4000):
        k = (seed + i * 7919) % (54 * 256)
        cand = ("10", second or str(200 + k // 256), str(k % 256))
        if cand not in used and (second or cand[1] not in RESERVED):
            return ".".join(cand)
    raise RuntimeError("no free 10.x.y.0/24 subnet for the test bridge")


def free_port(address) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


class NamespacedNodes:
    """What a test cluster with one network namespace per node (`self.netns`) and a daemon
    per node (`self.procs`) does to a node as a whole."""

    def node_pids(self, name: str):
        out = _ip("netns", "pids", self.netns[name], check=False).stdout
        return [int(p) for p in out.split()]

    def kill_node(self, name: str) -> None:
        """The node dies: SIGKILL every process in its namespace, again until none is left
        (a dying daemon may still fork)."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pids = self.node_pids(name)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)
        proc = self.procs.pop(name, None)
        if proc is not None:
            proc.wait(10)

    def freeze(self, name: str, sig=signal.SIGSTOP) -> None:
        """Every process of the node stopped (SIGCONT: thawed); its kernel still answers."""
        for pid in self.node_pids(name):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def partition(self, name: str) -> None:
        """The node's link goes dead (a cable, a switch port): every packet into and out of its
        namespace is dropped (loopback inside it still works), so no FIN or RST reaches anyone."""
        self._nft(name, ["-f", "-"], NFT_PARTITION)

    def heal(self, name: str) -> None:
        self._nft(name, ["delete", "table", "inet", "partition"], None)

    def _nft(self, name, args, text):
        subprocess.run(["nsenter", f"--net=/run/netns/{self.netns[name]}", "nft", *args],
                       input=text, capture_output=True, text=True, timeout=10, check=text is not None)

    def release(self) -> None:
        """The last step of close(): the bridge and the cluster's folder go."""
        if self.bridge is not None:
            self.bridge.close()
            self.bridge = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _lock(file, timeout):
    """flock(file) exclusively, or RuntimeError after `timeout` seconds (a holder that hangs
    must fail the test, not wedge every later one)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{file.name} stayed locked for {timeout} s") from None
            time.sleep(0.05)


class Bridge:
    """A bridge `<prefix>b` at SUBNET.1/24 in the root namespace (`address`; SUBNET is
    _pick_subnet(seed, second)), and per host a
    network namespace `<prefix>-hN` whose eth0 is SUBNET.(10+N), joined by veth `<prefix>vN`.
    The namespaces have no default route: traffic stays on the bridge."""

    def __init__(self, prefix: str, seed: int, second=None):
        self.name, self.prefix = f"{prefix}b", prefix
        self.members = []  # (netns, veth)
        # One session at a time picks a free subnet and takes it (parallel test workers,
        # other checkouts): the pick sees only subnets already on an interface.
        with open(SUBNET_LOCK, "a") as lock:
            _lock(lock, timeout=60)
            self.subnet = _pick_subnet(seed, second)
            self.address = f"{self.subnet}.1"
            _ip("link", "add", self.name, "type", "bridge")
            try:
                _ip("addr", "add", f"{self.address}/24", "dev", self.name)
                _ip("link", "set", self.name, "up")
            except BaseException:
                self.close()
                raise

    def add(self, i: int):
        """(netns, veth, address) of host i, created and up."""
        netns, veth = f"{self.prefix}-h{i}", f"{self.prefix}v{i}"
        address = f"{self.subnet}.{10 + i}"
        self.members.append((netns, veth))
        _ip("netns", "add", netns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
        _ip("link", "set", veth, "master", self.name, "up")
        _ip("-n", netns, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", netns, "link", "set", "eth0", "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        return netns, veth, address

    def close(self):
        # the veth explicitly: deleting the namespace removes it only ~1 s later
        for netns, veth in self.members:
            _ip("link", "del", veth, check=False)
            _ip("netns", "del", netns, check=False)
        _ip("link", "del", self.name, check=False)


def _wait_banner(addr: str, port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((addr, port), timeout=1.0) as s:
                s.settimeout(1.0)
                if s.recv(64).startswith(b"SSH-2.0-"):
                    return True
        except OSError:
            pass
        time.sleep(0.02)
    return False


class TestHost:
    def __init__(self, name, address, port, netns, vethname, hostdir):
        self.name, self.address, self.port, self.netns, self.veth, self.dir = \
            name, address, port, netns, vethname, hostdir
        self.proc = None       # the unshare (or sshd) process in the root pid namespace
        self.log = None

    def init_pid(self):
        """Root-namespace pid of the host's pid 1 (sshd), child of unshare."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        kids = _children(self.proc.pid)
        return kids[0] if kids else None


class TestHosts:
    """N real sshd hosts named host-1..host-N; see the module docstring."""
    __test__ = False  # not a pytest test class

    def __init__(self, count: int, hide_bashrc: bool = True, force_loopback: bool = False,
                 start_timeout: float = 10.0, sshd_options: dict = None):
        reason = missing_tools()
        if reason:
            raise RuntimeError(reason)
        self.tag = new_tag()
        self.hide_bashrc = hide_bashrc
        self.sshd_options = dict(sshd_options or {})  # extra sshd_config lines, e.g. MaxSessions
        self.start_timeout = start_timeout
        self.dir = tempfile.mkdtemp(prefix=f"hvdlite-sshhosts-{self.tag}-")
        self.hosts = {}
        self.bridge = None
        self.fallback_reason = None
        self.closed = False
        try:
            self._keys()
            self.mode = "loopback" if force_loopback else "netns"
            if force_loopback:
                self.fallback_reason = "loopback requested"
            else:
                self.fallback_reason = self._namespace_problem()
            if self.fallback_reason is None:
                try:
                    self._make_bridge(count)
                except Exception as e:  # namespaces half-work: tidy up and use loopback
                    self._teardown_network()
                    self.fallback_reason = f"network namespaces failed: {e}"
            if self.fallback_reason is not None:
                self.mode = "loopback"
                if not force_loopback:
                    msg = f"SSH test hosts on 127.x loopback, not namespaces: {self.fallback_reason}"
                    warnings.warn(msg)
                    print(msg, file=sys.stderr)
                self._make_loopback(count)
            self.unshare = self._can_unshare()
            for name in self.hosts:
                self._configure(name)
            self._write_client_files()
            for name in self.hosts:
                self.start(name)
        except BaseException:
            self.close()
            raise

    # ---- public -------------------------------------------------------------------
    @property
    def names(self):
        return list(self.hosts)

    @property
    def addresses(self):
        return {name: h.address for name, h in self.hosts.items()}

    def port(self, name):
        return self.hosts[name].port

    def start(self, name: str) -> None:
        """Start (or restart after kill_all) the host's sshd; returns once it answers."""
        h = self.hosts[name]
        if h.proc is not None and h.proc.poll() is None:
            return
        config = os.path.join(h.dir, "sshd_config")
        inner = f"exec {SSHD} -D -e -f {config}"
        if self.unshare:
            setup = f"hostname {name}"
            if self.hide_bashrc and os.path.isfile(os.path.expanduser("~/.bashrc")):
                setup += f"; mount --bind /dev/null {os.path.expanduser('~/.bashrc')} || true"
            cmd = ["unshare", "--pid", "--uts", "--mount", "--mount-proc", "--fork", "--kill-child",
                   "sh", "-c", f"{setup}; {inner}"]
        else:
            cmd = [SSHD, "-D", "-e", "-f", config]
        if h.netns:
            cmd = ["ip", "netns", "exec", h.netns, *cmd]
        h.log = open(os.path.join(h.dir, "sshd.log"), "ab")
        # Own session: a Ctrl-C of the test run reaches the host only through close(). If the
        # test process is killed outright, PDEATHSIG takes the host (unshare's children) along.
        h.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=h.log, stderr=h.log,
                                  start_new_session=True, preexec_fn=_die_with_parent)
        if not _wait_banner(h.address, h.port, self.start_timeout):
            with open(os.path.join(h.dir, "sshd.log"), "rb") as f:
                log = f.read().decode(errors="replace")[-2000:]
            self.kill_all(name)
            raise RuntimeError(f"sshd of {name} did not answer on {h.address}:{h.port}:\n{log}")

    def kill_all(self, name: str) -> None:
        """SIGKILL every process of the host, its sshd included (the host 'dies')."""
        h = self.hosts[name]
        if h.proc is None:
            return
        init = h.init_pid() if self.unshare else None
        if self.unshare:
            # unshare --kill-child: its death kills the namespace's pid 1, and with it the host
            pids = [h.proc.pid]
        else:
            pids = list(reversed(_tree(h.proc.pid)))
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            h.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        if init is not None:
            # pid 1 of a pid namespace exits only after every other member is gone
            deadline = time.monotonic() + 5
            while _running(init) and time.monotonic() < deadline:
                time.sleep(0.01)
        if h.log:
            h.log.close()
            h.log = None
        h.proc = None

    def run(self, name: str, command, timeout: float = 10.0, input=None, check=False):
        """Run `command` (argv list or shell string) inside the host: its network, pid, mount
        and uts namespaces. Returns CompletedProcess with text output."""
        h = self.hosts[name]
        argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
        if self.unshare:
            pid = h.init_pid()
            if pid is None:
                raise RuntimeError(f"{name} is not running")
            flags = ["-p", "-m", "-u"] + (["-n"] if h.netns else [])
            argv = ["nsenter", "-t", str(pid), *flags, "--", *argv]
        elif h.netns:
            argv = ["ip", "netns", "exec", h.netns, *argv]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input,
                              check=check)

    def processes(self, name: str):
        """[(pid, pgid, args)] of the host's processes other than its sshd listener (pid 1),
        pids as the host sees them. Without pid namespaces: the processes below its sshd."""
        h = self.hosts[name]
        if self.unshare:
            if h.init_pid() is None:
                return []
            out = self.run(name, ["ps", "-ww", "-eo", "pid=,pgid=,args="]).stdout
            procs = []
            for line in out.splitlines():
                pid, pgid, args = line.split(None, 2)
                if pid != "1" and not args.startswith("ps -ww -eo"):
                    procs.append((int(pid), int(pgid), args))
            return procs
        if h.proc is None:
            return []
        procs = []
        for pid in _tree(h.proc.pid)[1:]:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    args = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                procs.append((pid, os.getpgid(pid), args))
            except (OSError, ProcessLookupError):
                pass
        return procs

    def partition(self, name: str) -> None:
        """Drop every packet into and out of the host (loopback inside it still works)."""
        self._need_netns("partition")
        self.run(name, ["nft", "-f", "-"], input=NFT_PARTITION, check=True)

    def heal(self, name: str) -> None:
        self._need_netns("heal")
        self.run(name, ["nft", "delete", "table", "inet", "partition"], check=False)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for name in list(self.hosts):
            try:
                self.kill_all(name)
            except Exception:
                pass
        self._teardown_network()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- setup --------------------------------------------------------------------
    def _need_netns(self, what):
        if self.mode != "netns":
            raise RuntimeError(f"{what} needs namespace hosts; these run on loopback "
                               f"({self.fallback_reason})")

    def _keys(self):
        self.identity_file = os.path.join(self.dir, "id_ed25519")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hvdlite-test-client",
                        "-f", self.identity_file], check=True, timeout=30)
        self.known_hosts = os.path.join(self.dir, "known_hosts")
        self.ssh_config = os.path.join(self.dir, "ssh_config")
        self.user = os.environ.get("USER") or __import__("getpass").getuser()

    def _namespace_problem(self):
        if os.geteuid() != 0:
            return "not root"
        for tool in ("ip", "unshare", "nsenter"):
            if shutil.which(tool) is None:
                return f"{tool} is not installed"
        if shutil.which("nft") is None:
            return "nft is not installed (nftables)"
        return None

    def _can_unshare(self):
        if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("nsenter") is None:
            return False
        r = subprocess.run(["unshare", "--pid", "--uts", "--mount", "--mount-proc", "--fork",
                            "--kill-child", "true"], capture_output=True, timeout=10)
        return r.returncode == 0

    def _make_bridge(self, count):
        self.bridge = Bridge(f"{PREFIX}{self.tag}", os.getpid() * 31 + _groups)
        self.driver_address = self.bridge.address
        for i in range(1, count + 1):
            name = f"host-{i}"
            netns, veth, address = self.bridge.add(i)
            self.hosts[name] = TestHost(name, address, 22, netns, veth, os.path.join(self.dir, name))

    def _make_loopback(self, count):
        self.hosts = {}
        self.driver_address = "127.0.0.1"
        seed = os.getpid() * 31 + _groups
        base = f"127.{1 + seed % 250}.{(seed // 250) % 250}"
        for i in range(1, count + 1):
            address = f"{base}.{10 + i}"
            with socket.socket() as s:
                s.bind((address, 0))
                port = s.getsockname()[1]
            name = f"host-{i}"
            self.hosts[name] = TestHost(name, address, port, None, None, os.path.join(self.dir, name))

    def _configure(self, name):
        h = self.hosts[name]
        os.makedirs(h.dir, exist_ok=True)
        key = os.path.join(h.dir, "host_ed25519")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", key],
                       check=True, timeout=30)
        with open(self.identity_file + ".pub") as f:
            client_pub = f.read()
        with open(os.path.join(h.dir, "authorized_keys"), "w") as f:
            f.write(client_pub)
        with open(os.path.join(h.dir, "sshd_config"), "w") as f:
            f.write(f"ListenAddress {h.address}\nPort {h.port}\nHostKey {key}\n"
                    f"PidFile {h.dir}/sshd.pid\nAuthorizedKeysFile {h.dir}/authorized_keys\n"
                    "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                    "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nUseDNS no\n"
                    "PrintMotd no\nPrintLastLog no\n")
            options = {"MaxStartups": 200, "MaxSessions": 100, **self.sshd_options}
            f.write("".join(f"{k} {v}\n" for k, v in options.items()))
        with open(key + ".pub") as f:
            h.host_key = " ".join(f.read().split()[:2])

    def _write_client_files(self):
        with open(self.known_hosts, "w") as f:
            for h in self.hosts.values():
                where = h.address if h.port == 22 else f"[{h.address}]:{h.port}"
                f.write(f"{where} {h.host_key}\n")
        with open(self.ssh_config, "w") as f:
            for h in self.hosts.values():
                f.write(f"Host {h.name}\n  HostName {h.address}\n  Port {h.port}\n  User {self.user}\n"
                        f"  IdentityFile {self.identity_file}\n  UserKnownHostsFile {self.known_hosts}\n"
                        "  StrictHostKeyChecking yes\n\n")

    def _teardown_network(self):
        if self.bridge:
            self.bridge.close()
            self.bridge = None
