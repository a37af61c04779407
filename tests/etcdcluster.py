"""A real three-member etcd 3.4 cluster on sshd test hosts (tests/sshhosts.py), for the drivers' store;
and SecureEtcd, one member with TLS, client certificates and auth on loopback.

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
import base64
import datetime
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
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


class SecureEtcd:
    """One etcd member on loopback as production runs it: TLS (certificates made here), client
    certificates required (--client-cert-auth), auth on with user `hvd` (password PASSWORD)
    allowed the keys under /hvdlite only, and tokens that expire after `token_ttl` seconds idle.
    No root needed. `env` is what a driver is given (etcdctl's variables), `dir` has the files:
    ca.pem, other-ca.pem (trusted by nobody), client.pem and client-key.pem."""
    PASSWORD = "s3cret-of-hvd"

    def __init__(self, folder: str, token_ttl: int = 1, start_timeout: float = 30.0):
        self.dir = folder
        os.makedirs(folder, exist_ok=True)
        _certificates(folder)
        client, peer = _free_ports(2)
        self.url = f"etcds://127.0.0.1:{client}"
        self.env = {"ETCDCTL_CACERT": self.path("ca.pem"), "ETCDCTL_CERT": self.path("client.pem"),
                    "ETCDCTL_KEY": self.path("client-key.pem"), "ETCDCTL_USER": "hvd",
                    "ETCDCTL_PASSWORD": self.PASSWORD}
        self._gateway = f"https://127.0.0.1:{client}"
        self._tls = ssl.create_default_context(cafile=self.path("ca.pem"))
        self._tls.load_cert_chain(self.path("client.pem"), self.path("client-key.pem"))
        argv = [ETCD, "--name", "m", "--data-dir", self.path("data"),
                "--listen-client-urls", self._gateway, "--advertise-client-urls", self._gateway,
                "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                "--initial-cluster", f"m=http://127.0.0.1:{peer}",
                "--cert-file", self.path("server.pem"), "--key-file", self.path("server-key.pem"),
                "--trusted-ca-file", self.path("ca.pem"), "--client-cert-auth",
                "--auth-token-ttl", str(token_ttl), "--logger", "zap", "--log-level", "warn"]
        with open(self.path("etcd.log"), "ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         start_new_session=True, preexec_fn=_die_with_parent)
        try:
            self._wait(start_timeout)
            self.call("/v3/auth/user/add", {"name": "root", "password": "root-" + self.PASSWORD})
            self.call("/v3/auth/user/grant", {"user": "root", "role": "root"})
            self.call("/v3/auth/role/add", {"name": "hvdlite"})
            self.call("/v3/auth/role/grant", {"name": "hvdlite", "perm": {
                "permType": "READWRITE", "key": _b64(b"/hvdlite"), "range_end": _b64(b"/hvdlitf")}})
            self.call("/v3/auth/user/add", {"name": "hvd", "password": self.PASSWORD})
            self.call("/v3/auth/user/grant", {"user": "hvd", "role": "hvdlite"})
            self.call("/v3/auth/enable", {})
        except BaseException:
            self.close()
            raise

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def call(self, path: str, body: dict, token: str = None):
        """(HTTP status, answer) of one gateway request, straight: no hvdlite code in between."""
        request = urllib.request.Request(self._gateway + path, data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json",
                                                  **({"Authorization": token} if token else {})})
        try:
            with urllib.request.urlopen(request, timeout=5, context=self._tls) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def _wait(self, timeout):
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.call("/v3/kv/range", {"key": _b64(b"/")})[0] == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                with open(self.path("etcd.log"), errors="replace") as f:
                    raise RuntimeError(f"etcd with TLS did not answer (exit {self.proc.poll()}):\n{f.read()[-3000:]}")
            time.sleep(0.05)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _free_ports(count: int):
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _certificates(folder: str) -> None:
    """A CA and what it signed: the member's certificate (for 127.0.0.1) and a client's without
    a CommonName (etcd's gateway refuses one with a CN while auth is on); another CA nobody
    trusts. EC keys: made in milliseconds."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)] if cn else [])

    def issue(cn, key, issuer, issuer_key, ca=False, extensions=()):
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(name(issuer))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        for extension in extensions:
            builder = builder.add_extension(extension, critical=False)
        return builder.sign(issuer_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)

    def write(file, data):
        with open(os.path.join(folder, file), "wb") as f:
            f.write(data)

    def key(file=None):
        k = ec.generate_private_key(ec.SECP256R1())
        if file:
            write(file, k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()))
        return k

    ca, other = key(), key()
    write("ca.pem", issue("hvdlite test CA", ca, "hvdlite test CA", ca, ca=True))
    write("other-ca.pem", issue("another CA", other, "another CA", other, ca=True))
    use = x509.ExtendedKeyUsage
    write("server.pem", issue("etcd member", key("server-key.pem"), "hvdlite test CA", ca, extensions=(
        x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
        use([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]))))
    write("client.pem", issue(None, key("client-key.pem"), "hvdlite test CA", ca,
                              extensions=(use([ExtendedKeyUsageOID.CLIENT_AUTH]),)))
