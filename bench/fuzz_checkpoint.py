"""Fuzz the checkpoint loader: mutated real checkpoints and random opcode streams, each sealed
with valid checksums (so the unpickler is reached) or, some, damaged as whole files; or, with
--structured, well-formed pickles of the allowed constructors built to exhaust a reader
(values shared and fed again and again to copying constructors, tuples holding the one before
twice, nesting 100,000 deep, colliding keys, lengths past the file's end), which noise never
finds.

    python bench/fuzz_checkpoint.py --cases 100000 [--seed 1] [--start 0] [--structured]

Every case is loaded by checkpoints.load in a child process (a crash there is counted, its case
said, and a new child goes on after it). Per case: the load returns or refuses with an
exception whose cause is one line; an accepted state is walked in full and freed (an array
of bad pointers crashes there); no class of the allow list, numpy's, torch's or the trusted
one changed, nor numpy's own dtypes; the peak of traced memory stays within BOUND x the
file's bytes + 1 MiB (the child runs under a 4 GiB address-space limit, so a bomb is a
MemoryError, counted); structured cases are held to the loader's own bound (loadbudget.py:
memory, and CPU_FIXED + CPU_PER_MB seconds). Each case runs under a CPU limit (RLIMIT_CPU, set
before it): one past it is a hang, its case said, and a new child goes on after it.
The last line: cases, refusals, accepted, crashes, hangs, classes_changed, over_bound, peak RSS.
"""
import argparse
import collections
import json
import os
import pickle
import random
import resource
import struct
import subprocess
import sys
import time
import traceback
import tracemalloc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

BOUND = 256  # bytes of memory a load may take per byte of its file (an EMPTY_SET opcode: ~220)
LINEAGE = "0" * 20
# The loader's time bound, seconds on this 2-core VM under load: the budget's allowance lets even
# a small file build 64 MiB or spend 64 Mi units of work, which took up to 2.8 s here.
CPU_FIXED, CPU_PER_MB = 4.0, 20.0
HANG = 30  # seconds of CPU after which a case is a hang


class Config:  # a class the fuzzed loader trusts
    def __init__(self, lr):
        self.lr = lr


def real_states():
    """(pickle bytes, buffers) of states as hvdlite writes them."""
    import datetime
    import decimal
    import fractions
    import numpy as np
    import torch
    from hvdlite.worker import checkpoints
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(2, 3)).sum().backward()
    optimizer.step()
    states = [
        {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 3},
        {"a": np.arange(6.0).reshape(2, 3), "b": np.array(["x", "yz"]), "o": np.array([1, "a", None], dtype=object),
         "s": np.float32(2.5), "be": np.arange(3, dtype=">i4"), "t": np.arange(8.0)[::2], "bool": np.ones(2, bool)},
        {"values": {"step": 7, "seen": [1, 2, 3], "cfg": Config(0.1)}, "c": collections.Counter("aab"),
         "d": collections.defaultdict(list, k=[1]), "q": collections.deque([1, 2], maxlen=4),
         "when": datetime.datetime(2026, 1, 2, tzinfo=datetime.timezone.utc), "f": fractions.Fraction(1, 3),
         "dec": decimal.Decimal("1.25"), "r": range(5), "sl": slice(1, 9, 2), "z": 1 + 2j,
         "set": {1, 2}, "fs": frozenset({3}), "ba": bytearray(b"xy"), "by": b"raw"},
        {"p": torch.nn.Parameter(torch.ones(3)), "i": torch.arange(4), "h": torch.ones(2, dtype=torch.bfloat16),
         "bt": torch.tensor([True, False]), "e": torch.empty(0, 3), "dt": torch.float16, "dev": torch.device("cpu"),
         "size": torch.Size([2, 3])},
    ]
    found = []
    for state in states:
        import io
        data, buffers = io.BytesIO(), []
        checkpoints._Pickler(data, protocol=5, buffer_callback=buffers.append).dump(state)
        found.append((data.getvalue(), [bytes(b.raw()) for b in buffers]))
    return found


NAMES = [("numpy", "ndarray"), ("numpy", "dtype"), ("numpy._core.multiarray", "_reconstruct"),
         ("numpy._core.multiarray", "scalar"), ("numpy._core.numeric", "_frombuffer"),
         ("hvdlite.worker.rebuild", "tensor"), ("hvdlite.worker.checkpoints", "_tensor"),
         ("torch._utils", "_rebuild_parameter"), ("torch", "Size"), ("torch", "device"), ("torch", "float32"),
         ("builtins", "bytes"), ("builtins", "list"), ("builtins", "range"), ("builtins", "slice"),
         ("builtins", "complex"), ("builtins", "set"), ("builtins", "bytearray"), ("builtins", "getattr"),
         ("collections", "Counter"), ("collections", "OrderedDict"), ("collections", "defaultdict"),
         ("collections", "deque"), ("fractions", "Fraction"), ("decimal", "Decimal"), ("datetime", "datetime"),
         ("datetime", "timedelta"), ("datetime", "timezone"), ("__main__", "Config"), ("os", "system")]
TEXTS = ["O8", "O", "V16", "f4", "<f8", ">i4", "U0", "S0", "U5", "i4,f4", "M8", "(2,)f4", "float32", "bool",
         "qint8", "__class__", "C", "F", "|", "<", "a", "most_common", "__setstate__", "cpu", "1e999999999", ""]
OPS = [pickle.REDUCE, pickle.BUILD, pickle.NEWOBJ, pickle.NEWOBJ_EX, pickle.SETITEM, pickle.SETITEMS,
       pickle.APPEND, pickle.APPENDS, pickle.ADDITEMS, pickle.TUPLE, pickle.TUPLE1, pickle.TUPLE2, pickle.TUPLE3,
       pickle.LIST, pickle.DICT, pickle.FROZENSET, pickle.MARK, pickle.POP, pickle.POP_MARK, pickle.DUP,
       pickle.MEMOIZE, pickle.EMPTY_LIST, pickle.EMPTY_DICT, pickle.EMPTY_SET, pickle.EMPTY_TUPLE, pickle.NONE,
       pickle.NEWTRUE, pickle.NEWFALSE, pickle.NEXT_BUFFER, pickle.READONLY_BUFFER, pickle.STOP, pickle.INST,
       pickle.OBJ, pickle.EXT1, pickle.BINPERSID, pickle.STACK_GLOBAL, pickle.GLOBAL]


def _text(s: str) -> bytes:
    raw = s.encode()
    return pickle.SHORT_BINUNICODE + bytes([len(raw)]) + raw


def _int(n: int) -> bytes:
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return pickle.LONG1 + bytes([len(raw)]) + raw


def _atom(rng) -> bytes:
    """One push of a value or a name."""
    pick = rng.random()
    if pick < 0.25:
        module, name = rng.choice(NAMES)
        return _text(module) + _text(name) + pickle.STACK_GLOBAL
    if pick < 0.45:
        return _int(rng.choice([0, 1, 2, 3, 8, 16, -1, 255, 10 ** 12, 2 ** 63, -2 ** 31, rng.randrange(1 << 20)]))
    if pick < 0.6:
        return _text(rng.choice(TEXTS))
    if pick < 0.72:
        n = rng.choice([0, 1, 8, 16, 24, rng.randrange(64)])
        return pickle.SHORT_BINBYTES + bytes([n]) + bytes(rng.randrange(256) for _ in range(n))
    if pick < 0.8:
        return rng.choice([pickle.LONG_BINGET, pickle.LONG_BINPUT]) + rng.randrange(1 << 32).to_bytes(4, "little")
    if pick < 0.85:
        return pickle.BINGET + bytes([rng.randrange(8)])
    if pick < 0.88:
        return pickle.FRAME + rng.randrange(1 << 64).to_bytes(8, "little")
    return rng.choice(OPS)


def random_stream(rng):
    body = b"".join(_atom(rng) for _ in range(rng.randrange(2, 60)))
    buffers = [bytes(rng.randrange(256) for _ in range(rng.choice([0, 8, 16]))) for _ in range(rng.randrange(3))]
    return pickle.PROTO + b"\x05" + body + pickle.STOP, buffers


def mutated(rng, reals):
    data, buffers = rng.choice(reals)
    data, buffers = bytearray(data), list(buffers)
    for _ in range(rng.randrange(1, 5)):
        pick, at = rng.random(), rng.randrange(len(data) + 1)
        if pick < 0.3 and data:
            data[min(at, len(data) - 1)] = rng.randrange(256)
        elif pick < 0.5:
            data[at:at] = _atom(rng)
        elif pick < 0.65:
            del data[at:at + rng.randrange(1, 16)]
        elif pick < 0.8:
            other = rng.choice(reals)[0]
            start = rng.randrange(len(other))
            data[at:at] = other[start:start + rng.randrange(1, 64)]
        elif pick < 0.9 and buffers:
            i = rng.randrange(len(buffers))
            buffers[i] = buffers[i][:rng.randrange(len(buffers[i]) + 1)] + bytes(rng.randrange(3) * 8)
        else:
            data[at:at] = data[rng.randrange(len(data)):][:rng.randrange(1, 32)]
    return bytes(data), buffers


def one_case(rng, reals):
    """(file bytes written to fd, sealed or not)."""
    pick = rng.random()
    if pick < 0.5:
        return mutated(rng, reals), True
    if pick < 0.9:
        return random_stream(rng), True
    return mutated(rng, reals), False  # the whole file then damaged: the checksums must refuse


# ---- structured cases: well-formed pickles of the allowed constructors ---------------------
# Values are built, memoized and then shared: fed again and again to copying constructors,
# nested in tuples that hold the one before twice, nested deep, used as keys, given big sizes.
class _Build:
    def __init__(self, rng):
        self.rng, self.memo = rng, []  # memo: the kind of each memoized value

    def keep(self, code: bytes, kind: str) -> bytes:
        self.memo.append(kind)
        return code + pickle.MEMOIZE

    def ref(self, *kinds) -> bytes:
        found = [i for i, k in enumerate(self.memo) if not kinds or k in kinds]
        if not found:
            return self.atom()
        i = self.rng.choice(found)
        return pickle.BINGET + bytes([i]) if i < 256 else pickle.LONG_BINGET + i.to_bytes(4, "little")

    def atom(self) -> bytes:
        rng, pick = self.rng, self.rng.random()
        if pick < 0.3:
            return _int(rng.choice([0, 7, -1, 2 ** 61 - 1 + 7, 10 ** rng.randrange(1, 400), rng.randrange(1 << 64)]))
        if pick < 0.5:
            raw = ("k" * rng.choice([1, 3, 40, 2000]) + str(rng.randrange(1000))).encode()
            return pickle.BINUNICODE + len(raw).to_bytes(4, "little") + raw
        if pick < 0.6:
            n = rng.choice([0, 8, 64, 4096])
            return pickle.BINBYTES + n.to_bytes(4, "little") + bytes(n)
        if pick < 0.7:
            return pickle.BINFLOAT + struct.pack(">d", rng.choice([0.5, float("nan"), float("inf"), 1e300]))
        if pick < 0.8:
            return rng.choice([pickle.NONE, pickle.NEWTRUE, pickle.NEWFALSE, pickle.EMPTY_TUPLE])
        return self.ref()

    def call(self, module: str, name: str, *args: bytes) -> bytes:
        return _text(module) + _text(name) + pickle.STACK_GLOBAL + pickle.MARK + b"".join(args) + pickle.TUPLE \
            + pickle.REDUCE

    def value(self, depth=0) -> bytes:
        """Code that pushes one value, memoized."""
        rng = self.rng
        pick = rng.random() if depth < 4 else 0.0
        if pick < 0.15:
            return self.keep(self.atom(), "atom")
        if pick < 0.3:
            items = [self.value(depth + 1) if rng.random() < 0.3 else self.ref() for _ in range(rng.randrange(0, 5))]
            return self.keep(pickle.MARK + b"".join(items) + pickle.TUPLE, "tuple")
        if pick < 0.38:  # a chain: each tuple holds the one before twice (hashing doubles per level)
            code = self.keep(self.atom(), "atom")
            for _ in range(rng.choice([2, 10, 40, 80])):
                code += pickle.POP + self.keep(self.ref_last() * 2 + pickle.TUPLE2, "tuple")
            return code
        if pick < 0.43:  # deep nesting
            return self.keep(pickle.NONE + pickle.TUPLE1 * rng.choice([10, 150, 300, 5000, 100_000]), "tuple")
        if pick < 0.55:
            items = b"".join(self.ref("atom", "tuple") + self.ref() for _ in range(rng.randrange(0, 8)))
            return self.keep(pickle.EMPTY_DICT + pickle.MARK + items + pickle.SETITEMS, "dict")
        if pick < 0.63:
            items = b"".join(self.ref() for _ in range(rng.choice([0, 3, 50, 3000])))
            return self.keep(pickle.EMPTY_LIST + pickle.MARK + items + pickle.APPENDS, "list")
        if pick < 0.68:
            items = b"".join(self.ref("atom", "tuple") for _ in range(rng.randrange(0, 6)))
            return self.keep(pickle.MARK + items + (pickle.FROZENSET if rng.random() < 0.5 else pickle.TUPLE), "tuple")
        if pick < 0.8:  # a copying constructor fed a shared argument, many times
            pick = rng.random()
            if pick < 0.3:
                one = self.call("collections", "deque", self.ref("list", "tuple"))
            elif pick < 0.5:
                one = self.call("collections", "Counter", self.ref("dict"))
            elif pick < 0.65:
                one = self.call("hvdlite.worker.rebuild", "tensor", _text("float32"),
                                pickle.MARK + _int(rng.choice([1, 2, 1024])) + pickle.TUPLE, pickle.NEWFALSE,
                                self.ref("atom"))
            elif pick < 0.75:
                one = self.call("fractions", "Fraction", self.ref("atom"), self.ref("atom"))
            elif pick < 0.85:
                one = self.call("decimal", "Decimal", self.ref("atom"))
            elif pick < 0.92:
                one = self.call("torch", "Size", self.ref("tuple"))
            else:
                one = self.call("builtins", "range", self.ref("atom"))
            return self.keep(pickle.EMPTY_LIST + pickle.MARK + one * rng.choice([1, 2, 100, 5000]) + pickle.APPENDS,
                             "list")
        if pick < 0.9:  # big declared sizes: a length past the file's end
            op = rng.choice([pickle.BINUNICODE8, pickle.BINBYTES8, pickle.BYTEARRAY8])
            return op + rng.choice([1 << 40, 1 << 20, 2 ** 64 - 1]).to_bytes(8, "little") + b"x"
        items = b"".join(self.ref("atom", "tuple") for _ in range(rng.randrange(0, 6)))
        return self.keep(pickle.EMPTY_SET + pickle.MARK + items + pickle.ADDITEMS, "set")

    def ref_last(self) -> bytes:
        return pickle.LONG_BINGET + (len(self.memo) - 1).to_bytes(4, "little")


def structured_case(rng):
    build = _Build(rng)
    body = pickle.EMPTY_LIST + pickle.MARK + b"".join(build.value() for _ in range(rng.randrange(1, 8))) \
        + pickle.APPENDS
    return pickle.PROTO + b"\x05" + body + pickle.STOP, []


def walk(obj):
    """Read every element of an accepted state (bad pointers crash here), within a budget."""
    import numpy as np
    stack, seen = [obj], 0
    while stack and seen < 100_000:
        item = stack.pop()
        seen += 1
        if isinstance(item, (list, tuple, set, frozenset, collections.deque)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, np.ndarray):
            stack.extend(item.ravel().tolist() if item.size < 10_000 else [])
        elif type(item).__module__.startswith("torch") and hasattr(item, "clone"):
            # every element read in C: tolist() made a Python float of each, which under
            # tracemalloc took past the 30-s hang limit for 5000 small tensors (case 60653)
            item.clone() if item.numel() < 10_000 else None
        else:
            repr(item)


def child(start, stop, seed, progress, structured):
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    import numpy
    import torch
    from hvdlite.worker import checkpoints, durable, loadbudget, trusted
    trusted.trust(Config)
    reals = real_states()
    classes = [list, dict, set, frozenset, tuple, bytes, bytearray, range, slice, complex, collections.Counter,
               collections.OrderedDict, collections.defaultdict, collections.deque, numpy.ndarray, numpy.dtype,
               torch.Tensor, torch.nn.Parameter, torch.Size, torch.device, Config, trusted.Constructor,
               *{type(c) for c in trusted.PLAIN.values()}]
    import datetime
    import decimal
    import fractions
    classes += [datetime.datetime, datetime.timedelta, datetime.timezone, decimal.Decimal, fractions.Fraction]

    def shared():
        """What a load must never change: classes, the constructors, numpy's own dtypes."""
        return ({c: dict(vars(c)) for c in classes}, {k: (c.build, c.factory, c.new, c.state)
                                                        for k, c in trusted.PLAIN.items()},
                [(d.byteorder, d.flags, d.itemsize) for d in map(numpy.dtype, "?bhilqBHILQefdgFDGOSU")])
    before = shared()
    fd = os.memfd_create("case")
    path = f"/proc/self/fd/{fd}"
    counts = collections.Counter()
    worst = 0.0
    tracemalloc.start()
    for case in range(start, stop):
        os.pwrite(progress, f"{case:12d}".encode(), 0)
        rng = random.Random(seed * 1_000_003 + case)
        (data, buffers), sealed = (structured_case(rng), True) if structured else one_case(rng, reals)
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, 0)
        checkpoints.seal(fd, 1, LINEAGE, memoryview(data), [memoryview(bytearray(b)) for b in buffers])
        if not sealed:
            size = os.fstat(fd).st_size
            for _ in range(rng.randrange(1, 4)):
                os.pwrite(fd, bytes([rng.randrange(256)]), rng.randrange(size))
        size = os.fstat(fd).st_size
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        cpu = time.process_time()
        resource.setrlimit(resource.RLIMIT_CPU, (int(cpu) + HANG, resource.RLIM_INFINITY))
        try:
            state = checkpoints.load(path)[2]
        except MemoryError:
            counts["over_bound"] += 1
            print(f"case {case}: MemoryError in {traceback.format_exc(limit=-2).splitlines()[-4:]}", flush=True)
            continue
        except Exception as e:  # noqa: BLE001 - a refusal: its one line
            took, peak = time.process_time() - cpu, tracemalloc.get_traced_memory()[1] - base
            cause = durable._cause(e)
            assert "\n" not in cause
            counts["refusals"] += 1
            counts["refused " + type(e).__name__] += 1
        else:
            # The load's own cost: walking what it built is the fuzzer's check, not the loader's
            # (5000 small tensors walked under tracemalloc took 10.8 s of CPU after a 0.7 s load).
            took, peak = time.process_time() - cpu, tracemalloc.get_traced_memory()[1] - base
            counts["accepted"] += 1
            try:
                walk(state)
            except RecursionError:
                pass
            del state
        worst = max(worst, peak / size)
        counts["cpu_ms_max"] = max(counts["cpu_ms_max"], int(took * 1000))
        limit = loadbudget.MEMORY_PER_BYTE * size + loadbudget.ALLOWANCE if structured else BOUND * size + (1 << 20)
        if took > CPU_FIXED + CPU_PER_MB * size / 1e6:
            counts["over_bound"] += 1
            print(f"case {case}: {took:.1f} s of CPU for a file of {size}", flush=True)
        if peak > limit:
            counts["over_bound"] += 1
            print(f"case {case}: peak {peak} bytes for a file of {size}", flush=True)
        if shared() != before:
            counts["classes_changed"] += 1
            print(f"case {case}: a class changed", flush=True)
            before = shared()
    counts["worst_ratio_x100"] = int(worst * 100)
    counts["rss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps(counts), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--start", type=int, default=0, help="the first case, --cases the one after the last (a long run in parts: a case "
                   "depends on its seed and number only)")
    p.add_argument("--structured", action="store_true", help="well-formed pickles built to exhaust a reader")
    p.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    p.add_argument("--progress", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        progress = os.open(args.progress, os.O_WRONLY)
        return child(*args.child, args.seed, progress, args.structured)
    import signal
    import tempfile
    totals, crashes, hangs, start, rss = collections.Counter(), [], [], args.start, 0
    with tempfile.NamedTemporaryFile() as progress:
        while start < args.cases:
            done = subprocess.run([sys.executable, __file__, "--child", str(start), str(args.cases), "--seed",
                                   str(args.seed), "--progress", progress.name]
                                  + (["--structured"] if args.structured else []), capture_output=True, text=True)
            rss = max(rss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
            lines = done.stdout.splitlines()
            for line in lines[:-1] if done.returncode == 0 else lines:
                print(line)
            if done.returncode == 0:
                totals.update(json.loads(lines[-1]))
                break
            at = int(open(progress.name).read().strip() or start)
            (hangs if done.returncode == -signal.SIGXCPU else crashes).append(at)
            print(f"case {at}: the loader's process ended with {done.returncode}: {done.stderr[-500:]}", flush=True)
            start = at + 1
    rss = max(rss, totals.pop("rss_kib", 0))
    cpu = totals.pop("cpu_ms_max", 0)
    ratio = totals.pop("worst_ratio_x100", 0) / 100
    kinds = ", ".join(f"{k.split()[1]} {v}" for k, v in sorted(totals.items()) if k.startswith("refused "))
    print(f"refusals by kind: {kinds}; the worst load took {ratio:.1f} bytes of memory per byte of its file "
          f"and {cpu} ms of CPU")
    print(f"cases={args.cases - args.start} refusals={totals['refusals']} accepted={totals['accepted']} crashes={len(crashes)} "
          f"hangs={len(hangs)} classes_changed={totals['classes_changed']} over_bound={totals['over_bound']} "
          f"peak_rss_mib={rss / 1024:.0f}")
    return 1 if crashes or hangs or totals["classes_changed"] or totals["over_bound"] else 0


if __name__ == "__main__":
    sys.exit(main())
