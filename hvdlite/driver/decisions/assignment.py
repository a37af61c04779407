"""Slot assignment: a pure function from ordered hosts to per-rank world info."""
from hvdlite.worker.world import WorldInfo


def assign(hosts, max_np=None):
    """Fill ranks host by host, in the given order, up to max_np.

    hosts: ordered (hostname, slots) pairs. cross_rank of a slot is the index of its host
    among the hosts that have that local_rank; cross_size is how many such hosts there are.
    """
    counts = []
    remaining = sum(n for _, n in hosts) if max_np is None else max_np
    for name, slots in hosts:
        take = min(slots, remaining)
        if take > 0:
            counts.append((name, take))
            remaining -= take
    size = sum(n for _, n in counts)
    hosts_with_local_rank = {}  # local_rank -> hosts having it, in order
    for name, n in counts:
        for local_rank in range(n):
            hosts_with_local_rank.setdefault(local_rank, []).append(name)
    slots, rank = [], 0
    for name, n in counts:
        for local_rank in range(n):
            peers = hosts_with_local_rank[local_rank]
            slots.append(WorldInfo(rank, size, local_rank, n, peers.index(name), len(peers), name))
            rank += 1
    return slots
