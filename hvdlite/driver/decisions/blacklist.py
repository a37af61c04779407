"""Blacklist of failed hosts and slots, with Horovod's jittered exponential cooldown."""
import random


class Blacklist:
    """Keys are host names or slot keys ("host/index"). Without a cooldown range an entry
    is permanent; with (MIN, MAX) the n-th blacklisting of a key lasts
    MIN * 2**n + U(0,1) * MIN seconds, clamped to [MIN, MAX]."""

    def __init__(self, cooldown_range=None, rng=random.random):
        self.cooldown_range = cooldown_range
        self.rng = rng
        self.until = {}  # key -> time it is usable again (None: never)
        self.count = {}  # key -> times blacklisted

    def cooldown(self, n: int) -> float:
        low, high = self.cooldown_range
        # 2**n past 1023 overflows a float; the delay is clamped to MAX long before.
        return min(max(low * 2 ** min(n, 64) + self.rng() * low, low), high)

    def add(self, key: str, now: float):
        """Blacklist key; returns the time it returns, or None if never."""
        n = self.count.get(key, 0)
        self.count[key] = n + 1
        self.until[key] = None if self.cooldown_range is None else now + self.cooldown(n)
        return self.until[key]

    def blocked(self, key: str, now: float) -> bool:
        if key not in self.until:
            return False
        until = self.until[key]
        return until is None or now < until

    def permanent(self, key: str) -> bool:
        return key in self.until and self.until[key] is None

    def expire(self, now: float) -> list:
        """Keys whose cooldown ended; they are usable again."""
        done = [k for k, until in self.until.items() if until is not None and now >= until]
        for key in done:
            del self.until[key]
        return done
