"""What OpenSSH would use to reach a host: address, port, user, keys, known hosts."""
import getpass
import os
from dataclasses import dataclass, field

from hvdlite.errors import HvdliteError

ACCEPT_FLAG = "--ssh-accept-unknown-hosts"


def _default_ssh_config():
    path = os.path.expanduser("~/.ssh/config")
    return path if os.path.isfile(path) else None


@dataclass
class SSHSettings:
    port: int = None                  # None: the ssh config's Port, else 22
    identity_file: str = None         # tried first, before the ssh config's IdentityFile
    accept_unknown_hosts: bool = False  # False: host key must be in known_hosts (RejectPolicy)
    ssh_config: str = field(default_factory=_default_ssh_config)  # None: no ssh config
    connect_timeout: float = 10.0     # TCP connect, banner, auth and channel opening, each
    dead_after: float = 3.0           # TCP_USER_TIMEOUT: unacknowledged data this long = dead
    keepalive_interval: float = 1.0   # SSH keepalive and TCP keepalive probe interval


class SSHError(HvdliteError):
    """A connection or launch failure; str() is a one-line message for the user."""


@dataclass
class HostConfig:
    name: str               # as the user wrote it (hostfile, discovery)
    address: str            # HostName from the ssh config, else the name
    port: int
    user: str
    identity_files: list    # existing private key files, in order
    known_hosts: list       # user then global known_hosts files
    accept_unknown: bool
    identities_only: bool

    @property
    def where(self) -> str:
        shown = self.name if self.address == self.name else f"{self.name} ({self.address})"
        return f"{self.user}@{shown} port {self.port}"


def _ssh_lookup(name: str, config_path) -> dict:
    if not config_path or not os.path.isfile(config_path):
        return {}
    import paramiko  # (here: a local job's driver, and a worker, run where paramiko is missing)
    try:
        return paramiko.SSHConfig.from_path(config_path).lookup(name)
    except Exception as e:
        raise SSHError(f"cannot read ssh config {config_path}: {e}") from None


def host_config(name: str, settings: SSHSettings) -> HostConfig:
    """What OpenSSH would use for `name`, from the settings and the ssh config."""
    opts = _ssh_lookup(name, settings.ssh_config)
    for unsupported in ("proxycommand", "proxyjump"):
        if opts.get(unsupported, "none").lower() != "none":
            raise SSHError(f"{name}: {unsupported} in {settings.ssh_config} is not supported by "
                           f"hvdlite; list a directly reachable host name")
    port = settings.port or int(opts.get("port", 22))
    identities = []
    if settings.identity_file:
        path = os.path.expanduser(settings.identity_file)
        if not os.path.isfile(path):
            raise SSHError(f"SSH identity file {settings.identity_file} does not exist")
        identities.append(path)
    for path in opts.get("identityfile", []):
        path = os.path.expanduser(path)
        if os.path.isfile(path) and path not in identities:
            identities.append(path)
    user_files = opts.get("userknownhostsfile", "~/.ssh/known_hosts ~/.ssh/known_hosts2")
    global_files = opts.get("globalknownhostsfile", "/etc/ssh/ssh_known_hosts /etc/ssh/ssh_known_hosts2")
    known = [os.path.expanduser(p) for p in (user_files + " " + global_files).split()]
    strict = opts.get("stricthostkeychecking", "ask").lower()
    return HostConfig(
        name=name, address=opts.get("hostname", name), port=port,
        user=opts.get("user") or getpass.getuser(), identity_files=identities, known_hosts=known,
        accept_unknown=settings.accept_unknown_hosts or strict in ("no", "off", "accept-new"),
        identities_only=opts.get("identitiesonly", "no").lower() == "yes")
