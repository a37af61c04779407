"""Who is in the next world and with which rank: pure functions over ordered hosts."""
from dataclasses import dataclass
from typing import Optional

from hvdlite.driver.decisions.assignment import assign


@dataclass(frozen=True)
class Candidate:
    """A worker waiting to join the next world."""
    worker: str  # incarnation id
    slot: str  # "host/index"
    hostname: str
    commit: int  # commits its training state holds
    previous_rank: Optional[int] = None  # its rank in the last world; None if it was not in it


def slot_index(slot: str) -> int:
    return int(slot.rsplit("/", 1)[1])


def host_of(slot: str) -> str:
    return slot.rsplit("/", 1)[0]


def _priority(host_order):
    position = {h: i for i, (h, _) in enumerate(host_order)}

    def key(c: Candidate):
        # The newest commit first, then the last world's members by their old rank, then
        # host order and slot number (never alphabetical: "h/10" is not before "h/2").
        return (-c.commit, c.previous_rank is None, c.previous_rank or 0,
                position.get(c.hostname, len(position)), c.hostname, slot_index(c.slot))
    return key


def best_holder(host_order, candidates) -> Candidate:
    """The candidate the next world's rank 0 must be: it holds the newest commit."""
    return min(candidates, key=_priority(host_order))


def state_source(host_order, candidates, usable) -> Optional[Candidate]:
    """A candidate on a slot the next world cannot keep (blacklisted, or gone from discovery)
    that holds a newer commit than every usable one: the best of them, which the next world
    syncs from before it leaves. None when a usable candidate holds the newest commit."""
    top = max((c.commit for c in usable), default=-1)
    holders = [c for c in candidates if c.commit > top]
    return best_holder(host_order, holders) if holders else None


def plan_world(host_order, candidates, max_np=None):
    """Ranks for the next world: [(worker, WorldInfo)] in rank order.

    Hosts keep their order (survivors first, new hosts last: the caller's host_order), except
    that the best holder's host goes first so that rank 0 holds the newest commit.
    """
    if not candidates:
        return []
    priority = _priority(host_order)
    by_host = {}
    for c in sorted(candidates, key=priority):
        by_host.setdefault(c.hostname, []).append(c)
    best = best_holder(host_order, candidates).hostname
    order = [h for h, _ in host_order if h in by_host and h != best]
    order += sorted(h for h in by_host if h != best and h not in order)
    slots = assign([(h, len(by_host[h])) for h in [best] + order], max_np)
    taken = {}
    plan = []
    for slot in slots:
        index = taken.get(slot.hostname, 0)
        taken[slot.hostname] = index + 1
        plan.append((by_host[slot.hostname][index].worker, slot))
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


def prospective_places(host_order, blocked, max_np=None) -> dict:
    """slot -> WorldInfo of the world the usable slots would form now, in host order: what
    Horovod tells a worker in its environment at launch."""
    usable = []
    for host, slots in host_order:
        if not blocked(host):
            indices = [i for i in range(slots) if not blocked(f"{host}/{i}")]
            if indices:
                usable.append((host, indices))
    places = {}
    for info in assign([(h, len(indices)) for h, indices in usable], max_np):
        indices = dict(usable)[info.hostname]
        places[f"{info.hostname}/{indices[info.local_rank]}"] = info
    return places
