"""Which address the rendezvous server binds to and advertises to workers."""
import fcntl
import socket
import struct

SIOCGIFADDR = 0x8915


class NetworkError(Exception):
    """No usable address for the rendezvous server; the message is for the user."""


def interface_address(name: str) -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError as e:
            raise NetworkError(f"--network-interface {name}: no IPv4 address ({e.strerror})") from None
    return socket.inet_ntoa(packed[20:24])


def route_address(host: str) -> str:
    """This machine's address on the route to `host` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return s.getsockname()[0]
    except OSError as e:
        raise NetworkError(f"cannot find a route to {host}: {e}") from None


def rendezvous_address(bind_address, network_interface, remote_hosts) -> str:
    if bind_address:
        return bind_address
    if network_interface:
        return interface_address(network_interface)
    if remote_hosts:
        return route_address(remote_hosts[0])
    return "127.0.0.1"

