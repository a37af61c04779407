"""Who is in the next world and with which rank: pure functions over ordered hosts."""
from dataclasses import dataclass, replace
from typing import Optional

from hvdlite.driver.decisions.assignment import assign, place


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


def _seniority(host_order):
    """The last world's members by their old rank, then host order and slot number (never
    alphabetical: "h/10" is not before "h/2")."""
    position = {h: i for i, (h, _) in enumerate(host_order)}
    return lambda c: (c.previous_rank is None, c.previous_rank or 0,
                      position.get(c.hostname, len(position)), c.hostname, slot_index(c.slot))


def best_holder(host_order, candidates) -> Candidate:
    """The candidate the next world syncs its state from (its root): the newest commit, then
    seniority."""
    senior = _seniority(host_order)
    return min(candidates, key=lambda c: (-c.commit, senior(c)))


def state_source(host_order, candidates, usable) -> Optional[Candidate]:
    """A candidate on a slot the next world cannot keep (blacklisted, or gone from discovery)
    that holds a newer commit than every usable one: the best of them, which the next world
    syncs from before it leaves. None when a usable candidate holds the newest commit."""
    top = max((c.commit for c in usable), default=-1)
    holders = [c for c in candidates if c.commit > top]
    return best_holder(host_order, holders) if holders else None


def plan_world(host_order, candidates, max_np=None, last_ranks=None):
    """Ranks for the next world: [(worker, WorldInfo)] in rank order, each told the root, the
    rank of the best holder, which every rank syncs the state from. Ranks stay put:

    - members: the best holder, then the last world's members by their old rank, then the
      others in host order and slot number, up to max_np;
    - when every member of the last world fits (its old rank is below the new size), each
      keeps its rank; a newcomer on a slot whose last worker held a rank now free takes it
      back, and the other newcomers fill the free ranks lowest first (a spare slot takes the
      rank of the worker it replaces), so a same-size world keeps its rank -> slot order;
    - otherwise (the world shrank past a member) the last world's members take ranks 0..k-1
      in their old order, and the newcomers follow.

    last_ranks: slot -> rank in the last world formed.
    """
    if not candidates:
        return []
    best, senior = best_holder(host_order, candidates), _seniority(host_order)
    members = sorted(candidates, key=lambda c: (c is not best, senior(c)))[:max_np]
    stayed = sorted((c for c in members if c.previous_rank is not None), key=senior)
    newcomers = sorted((c for c in members if c.previous_rank is None), key=senior)
    size = len(members)
    if stayed and stayed[-1].previous_rank >= size:
        ranked = stayed + newcomers
    else:
        ranked = [None] * size
        for c in stayed:
            ranked[c.previous_rank] = c
        rest = []
        for c in newcomers:
            rank = (last_ranks or {}).get(c.slot)
            if rank is not None and rank < size and ranked[rank] is None:
                ranked[rank] = c
            else:
                rest.append(c)
        free = iter([r for r, c in enumerate(ranked) if c is None])
        for c in rest:
            ranked[next(free)] = c
    root = ranked.index(best)
    places = place([(c.hostname, slot_index(c.slot)) for c in ranked])
    return [(c.worker, replace(info, root=root)) for c, info in zip(ranked, places)]


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
