"""Slot assignment: pure functions from ordered hosts, or ranked slots, to per-rank world info."""
from hvdlite.worker.world import WorldInfo


def assign(hosts, max_np=None):
    """Fill ranks host by host, in the given order, up to max_np.

    hosts: ordered (hostname, slots) pairs."""
    counts = []
    remaining = sum(n for _, n in hosts) if max_np is None else max_np
    for name, slots in hosts:
        take = min(slots, remaining)
        if take > 0:
            counts.append((name, take))
            remaining -= take
    return place([(name, index) for name, n in counts for index in range(n)])


def place(ranked):
    """WorldInfo of each (hostname, slot index) in rank order: its rank is its position.

    local_rank orders a host's slots by their index (a host's ranks need not be contiguous
    once ranks stay put across failures); cross_rank of a slot is the index of its host among
    the hosts that have that local_rank, hosts ordered by their lowest rank; cross_size is
    how many such hosts there are."""
    by_host = {}  # hostname -> its slot indices, hosts in order of their lowest rank
    for name, index in ranked:
        by_host.setdefault(name, []).append(index)
    local = {name: {index: i for i, index in enumerate(sorted(indices))} for name, indices in by_host.items()}
    hosts_with_local_rank = {}  # local_rank -> hosts having it, in order
    for name, indices in by_host.items():
        for local_rank in range(len(indices)):
            hosts_with_local_rank.setdefault(local_rank, []).append(name)
    slots = []
    for rank, (name, index) in enumerate(ranked):
        local_rank = local[name][index]
        peers = hosts_with_local_rank[local_rank]
        slots.append(WorldInfo(rank, len(ranked), local_rank, len(by_host[name]), peers.index(name),
                               len(peers), name))
    return slots
