"""What loading a checkpoint may cost, in proportion to its file (torch-free).

A pickle's opcodes are a few bytes each, but what they build need not be: a tuple that holds
the one before it twice doubles the cost of hashing it per level, a tuple nested a million
deep overflows the C stack when hashed, and an argument stored once can be fed again and again
to a constructor that copies it. So the unpickler (trusted.py) charges a Budget as it goes:

- memory: what each object it builds takes (sys.getsizeof: CPython's own count, a container's
  table included; an array's or tensor's data counted in full, shared or not), each memo entry,
  each item a container grows by; before a constructor is called, what its arguments take
  (a copying constructor makes about as much) must still be left;
- work: hashing a key costs its expanded size (a tuple's elements, shared ones counted each
  time they are reached), and a key whose hash was seen k times before costs k times that
  (the comparisons of colliding keys); quadratic arithmetic on big ints costs its square;
- depth: a tuple nested deeper than MAX_DEPTH is refused where it is made (hashing recurses
  in C without a check); lists and dicts cannot be hashed, and everything else that walks
  them (repr, ==, pickling) stops at Python's recursion limit.

The bound, for a file of S bytes: memory charged <= MEMORY_PER_BYTE * S + ALLOWANCE, work
charged <= WORK_PER_BYTE * S + ALLOWANCE. Past either, the load ends with OverBudget, a
refusal like any other (the worker names the file and exits UNLOADABLE).
`bench/fuzz_checkpoint.py --structured` holds the real peak memory and CPU time of every case
to this bound (see its docstring for the seconds per MB it measured).
"""
import sys

from hvdlite.worker.rebuild import Untrusted

MEMORY_PER_BYTE = 32  # a dict of small str -> int pickles at ~20x; real states with arrays at ~2x
WORK_PER_BYTE = 64
ALLOWANCE = 64 << 20  # bytes and units: what any file may take, a small one's state included
MAX_DEPTH = 200  # tuples in tuples; a real state's keys nest a few deep
MEMO_ENTRY = 100  # bytes of the memo's dict per entry (its int key included)


_SCALARS = (str, int, float, bytes, bool, type(None), complex)


class OverBudget(Untrusted):
    """Loading the file would take more memory or work than its size allows."""


def size(obj) -> int:
    """Bytes an object holds: its own (its table, for a container) and an array's data."""
    try:
        own = sys.getsizeof(obj)
    except TypeError:  # an object whose __sizeof__ is not callable this way
        own = 64
    if type(obj).__name__ in ("ndarray", "Tensor", "Parameter", "memoryview", "PickleBuffer"):
        own += getattr(obj, "nbytes", 0) or 0
    return own


class Budget:
    def __init__(self, file_bytes: int):
        self.file_bytes = file_bytes
        # the reader's own copies of the file (read, BytesIO, a frame) count against it too
        self.memory_left = (MEMORY_PER_BYTE - 3) * file_bytes + ALLOWANCE
        self.work_left = WORK_PER_BYTE * file_bytes + ALLOWANCE
        self._shapes = {}  # id -> (tuple or frozenset, expanded size, depth), held so ids stay theirs
        self._seen = {}  # hash -> keys with that hash inserted so far
        self._filled = {}  # id -> (dict, the work its keys cost): what copying it costs again

    def memory(self, n: int) -> None:
        self.memory_left -= n
        if self.memory_left < 0:
            self._over("memory")

    def room(self, n: int) -> None:
        """Refuse before a constructor that could build n bytes runs, if they are not left."""
        if n > self.memory_left:
            self._over("memory")

    def work(self, n: int) -> None:
        self.work_left -= n
        if self.work_left < 0:
            self._over("work (hashing, comparing, arithmetic)")

    def _over(self, what: str):
        mib = self.file_bytes / (1 << 20)
        limit = (MEMORY_PER_BYTE if what == "memory" else WORK_PER_BYTE) * mib + ALLOWANCE / (1 << 20)
        raise OverBudget(f"loading it would take more {what} than a file of {mib:.1f} MiB may "
                         f"({limit:.0f} Mi{'B' if what == 'memory' else ' units'}): it is built to exhaust its reader")

    # ---- what hashing costs ----------------------------------------------------------
    def weight(self, obj) -> int:
        """The work of hashing obj once (tuples' hashes are not cached: each use costs it all)."""
        kind = type(obj)
        if kind is tuple or kind is frozenset or isinstance(obj, tuple):  # torch.Size too
            found = self._shapes.get(id(obj))
            return found[1] if found is not None else 1 + len(obj)
        if kind is int:
            return 1 + obj.bit_length() // 1024
        return 1

    def depth(self, obj) -> int:
        found = self._shapes.get(id(obj)) if type(obj) is tuple else None
        return found[2] if found is not None else 1

    def made_tuple(self, made: tuple) -> None:
        """Note a tuple's expanded size and depth; refuse it if nested too deep."""
        if not made:
            return
        shapes = self._shapes
        for item in made:  # most tuples hold only scalars: weight() and depth() know them unnoted
            kind = type(item)
            if (kind is int and item.bit_length() >= 1024) or (kind not in _SCALARS and (
                    id(item) in shapes or isinstance(item, tuple))):
                break
        else:
            return
        weight, depth = 1, 0
        for item in made:
            weight += self.weight(item)
            depth = max(depth, self.depth(item))
        if depth + 1 > MAX_DEPTH:
            raise OverBudget(f"it nests tuples more than {MAX_DEPTH} deep, which hashing them would overflow")
        self._shapes[id(made)] = (made, weight, depth + 1)
        self.memory(MEMO_ENTRY)

    def made_frozenset(self, made: frozenset) -> None:
        # its hash is cached, from its items' stored hashes: as cheap as its size, at any depth
        self._shapes[id(made)] = (made, 1 + len(made), 1)
        self.memory(MEMO_ENTRY)

    def hashing(self, keys, into=None) -> None:
        """Charge inserting `keys` into the dict or set `into`: each key's hash, and for each
        key seen with the same hash before, a comparison as costly as the hash."""
        seen, total = self._seen, 0
        for key in keys:
            weight = self.weight(key)
            self.work(weight)
            h = hash(key)  # after the charge: the charge refuses an exponential one first
            before = seen.get(h, 0)
            seen[h] = before + 1
            if before:
                self.work(before * weight)
            else:
                self.memory(MEMO_ENTRY)
            total += weight * (1 + before)
        if into is not None:
            held = self._filled.get(id(into))
            if held is None:
                self.memory(MEMO_ENTRY)
            self._filled[id(into)] = (into, total + (held[1] if held else 0))

    def copying(self, filled) -> None:
        """Charge building a dict again from `filled` (Counter(d)): its keys' work again."""
        held = self._filled.get(id(filled))
        self.work(held[1] if held is not None else 1 + len(filled))

    def arithmetic(self, *numbers) -> None:
        """Charge quadratic arithmetic (gcd, base conversion) on these ints."""
        for n in numbers:
            if type(n) is int:
                limbs = n.bit_length() // 64
                self.work(1 + limbs * limbs // 16)
