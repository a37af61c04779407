"""Which address the rendezvous server binds to, and which one each worker is told."""
import fcntl
import socket
import struct

from hvdlite.errors import HvdliteError

SIOCGIFADDR = 0x8915
ANY = "0.0.0.0"
LOOPBACK = "127.0.0.1"


class NetworkError(HvdliteError):
    """No usable address for the rendezvous server; the message is for the user."""


def interface_address(name: str) -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError as e:
            raise NetworkError(f"--network-interfaces {name}: no IPv4 address ({e.strerror})") from None
    return socket.inet_ntoa(packed[20:24])


def route_address(host: str) -> str:
    """This machine's address on the route to `host` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return s.getsockname()[0]
    except OSError as e:
        raise NetworkError(f"cannot find a route to {host}: {e}") from None


def bind_address(bind, interfaces, remote_possible: bool) -> str:
    """--rendezvous-addr, else the first of --network-interfaces with an address, else every
    interface when a remote host may join (hosts discovered later must reach the server;
    requests are authenticated), else loopback."""
    if bind:
        return bind
    errors = []
    for name in interfaces or []:
        try:
            return interface_address(name)
        except NetworkError as e:
            errors.append(str(e))
    if errors:
        raise NetworkError("; ".join(errors))
    return ANY if remote_possible else LOOPBACK


def advertised_address(bound: str, local: bool, route_to_host) -> str:
    """The address a worker is told: the bound one, or on a server bound to every interface,
    loopback for a local worker and the route's address for a remote one."""
    if bound != ANY:
        return bound
    return LOOPBACK if local else route_to_host()
