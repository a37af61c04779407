"""Changes between two discovered host lists, and the order hosts keep across them."""
from dataclasses import dataclass


@dataclass(frozen=True)
class HostChange:
    added: tuple  # host names new in the list, or with more slots
    removed: tuple  # host names gone from the list, or with fewer slots
    resized: tuple = ()  # (name, old slots, new slots) of hosts in both lists

    @property
    def kind(self):
        if self.added and self.removed:
            return "mixed"
        return "added" if self.added else "removed" if self.removed else None


def diff(old, new) -> HostChange:
    before, after = dict(old), dict(new)
    added = tuple(h for h, n in new if n > before.get(h, 0))
    removed = tuple(h for h, n in old if n > after.get(h, 0))
    resized = tuple((h, before[h], n) for h, n in new if before.get(h, n) != n)
    return HostChange(added, removed, resized)


def reorder(old, new):
    """Hosts of `new`, the ones already known first in their old order, new ones last."""
    slots = dict(new)
    known = [(h, slots[h]) for h, _ in old if h in slots]
    seen = {h for h, _ in old}
    return known + [(h, n) for h, n in new if h not in seen]
