"""Keys due at a time, found without a walk over every key: a tick of a job of thousands of
workers looks only at the workers whose time came."""
import heapq
import math

# Rules compare `now - since > limit`; a time kept as `since + limit` may round a hair later
# than that: keys are handed out this much early, and the caller's check decides.
SLACK = 1e-6


class Deadlines:
    """Each key's earliest time. A key's time may only be brought forward here: a key whose
    time moved later (a heartbeat came) is handed out at its old time, and the caller sets it
    again after checking it."""

    def __init__(self):
        self._heap = []  # (time, key), with stale entries of keys set again earlier
        self.times = {}  # key -> its time in _heap (the earliest of its entries there)

    def at(self, key, when):
        """`key` is due at `when` (None: at no time), or earlier if it already was."""
        if when is not None and when < self.times.get(key, math.inf):
            self.times[key] = when
            heapq.heappush(self._heap, (when, key))

    def due(self, now) -> list:
        """Takes out and returns the keys due by `now`, earliest first."""
        keys = []
        while self._heap and self._heap[0][0] <= now + SLACK:
            when, key = heapq.heappop(self._heap)
            if self.times.get(key) == when:
                del self.times[key]
                keys.append(key)
        return keys
