"""Pure decisions of an elastic job: who is in the next world, and whether to go on."""
from dataclasses import dataclass

from hvdlite.driver.assignment import assign


@dataclass(frozen=True)
class Candidate:
    """A worker ready to join the next world."""
    key: str  # its slot, "host/index"
    hostname: str
    commit: int  # commits its training state holds
    previous_rank: int = None  # its rank in the last world; None for a new worker


def _priority(c: Candidate):
    # Survivors holding the newest commit first, then by their old rank; new workers last.
    return (c.previous_rank is None, -c.commit, c.previous_rank or 0, c.key)


def best_survivor(candidates) -> Candidate:
    """The candidate the next world's rank 0 should be: the newest commit, then the old rank."""
    return min(candidates, key=_priority)


def plan_world(host_order, candidates, max_np=None):
    """Ranks for the next world: [(key, WorldInfo)] in rank order.

    The host of the best survivor goes first so that rank 0 holds the newest commit and is
    never a new worker while a survivor exists; other hosts keep their order.
    """
    by_host = {}
    for c in sorted(candidates, key=_priority):
        by_host.setdefault(c.hostname, []).append(c)
    order = [h for h, _ in host_order if h in by_host]
    if candidates:
        best = best_survivor(candidates).hostname
        order = [best] + [h for h in order if h != best]
    slots = assign([(h, len(by_host[h])) for h in order], max_np)
    taken = {}
    plan = []
    for slot in slots:
        index = taken.get(slot.hostname, 0)
        taken[slot.hostname] = index + 1
        plan.append((by_host[slot.hostname][index].key, slot))
    return plan


def free_slots(host_order, occupied, blocked, limit):
    """Slot keys of host_order that no live worker occupies and that are not blocked,
    at most `limit` of them, host by host."""
    free = []
    for host, slots in host_order:
        for index in range(slots):
            key = f"{host}/{index}"
            if len(free) >= limit:
                return free
            if key not in occupied and not blocked(key) and not blocked(host):
                free.append(key)
    return free
