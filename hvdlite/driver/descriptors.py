"""The driver's file descriptors: its soft limit raised to the hard one, and the KV server's
connection caps derived from the limit, so strangers' connections can never take the
descriptors that launches (pipes, sockets) and --output-filename files need."""
import resource

# Connections the KV server may hold at most, however high the limit.
MAX_UNAUTHENTICATED = 4096  # not authenticated yet; the oldest goes for a new one
MAX_CONNECTIONS = 16384
RESERVE = 64  # descriptors kept from connections at least (the driver's own files, launches)


def raise_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns the soft limit now in force.
    Workers inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:  # Linux caps descriptors at fs.nr_open whatever it says
        try:
            with open("/proc/sys/fs/nr_open") as f:
                target = int(f.read())
        except (OSError, ValueError):
            return soft
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError):
            pass  # the limit stays; the caps below follow it
    return soft


def connection_caps(limit=None):
    """(unauthenticated, total) connections for a soft limit (the current one by default):
    a quarter of the descriptors (at least RESERVE) stay free for everything else, and
    strangers may hold at most half of the rest, so workers always find room."""
    if limit is None:
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if limit == resource.RLIM_INFINITY:
        return MAX_UNAUTHENTICATED, MAX_CONNECTIONS
    total = min(MAX_CONNECTIONS, max(2, limit - max(RESERVE, limit // 4)))
    return min(MAX_UNAUTHENTICATED, max(1, total // 2)), total
