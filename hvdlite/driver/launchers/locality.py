"""Whether a host name is this machine: its slots then run as local processes, without SSH."""
import socket

from hvdlite.driver.launchers.ssh.config import SSHError, _default_ssh_config, _ssh_lookup


def _local_addresses() -> set:
    """IPv4 and IPv6 addresses of this machine's interfaces (in this network namespace)."""
    addresses = set()
    try:
        with open("/proc/net/fib_trie") as f:
            last = None
            for line in f:
                line = line.strip()
                if line.startswith("|--"):
                    last = line[3:].strip()
                elif line.startswith("/32 host LOCAL") and last:
                    addresses.add(last)
    except OSError:
        pass
    try:
        with open("/proc/net/if_inet6") as f:
            for line in f:
                raw = line.split()[0]
                addresses.add(socket.inet_ntop(socket.AF_INET6, bytes.fromhex(raw)))
    except (OSError, ValueError):
        pass
    return addresses


def _is_loopback(address: str) -> bool:
    return address.startswith("127.") or address in ("::1", "::ffff:127.0.0.1")


def is_local(hostname: str, ssh_config="default") -> bool:
    """True when `hostname` is this machine, so its slots run as local processes without SSH:
    the name (or its HostName in the ssh config) resolves to a loopback address or to an
    address of one of this machine's interfaces. Unresolvable names are not local."""
    if ssh_config == "default":
        ssh_config = _default_ssh_config()
    try:
        name = _ssh_lookup(hostname, ssh_config).get("hostname", hostname)
    except SSHError:
        name = hostname
    try:
        resolved = {info[4][0] for info in socket.getaddrinfo(name, None)}
    except (socket.gaierror, UnicodeError):
        return False
    resolved = {a.split("%")[0] for a in resolved}
    if any(_is_loopback(a) for a in resolved):
        return True
    local = _local_addresses()
    return any(a in local or (a.startswith("::ffff:") and a[7:] in local) for a in resolved)
