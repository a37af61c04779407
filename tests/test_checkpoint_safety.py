"""Crafted checkpoints that pass every checksum: loading one never crashes the process, never
changes a class, never allocates from a number in the file; each is refused with one line.
Each file is loaded in a child process, so that a crash fails the test instead of pytest.
And a short run of bench/fuzz_checkpoint.py."""
import os
import pickle
import subprocess
import sys

import pytest

from hvdlite.worker import checkpoints

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINEAGE = "0" * checkpoints.LINEAGE_CHARS


def text(s: str) -> bytes:
    raw = s.encode()
    return pickle.SHORT_BINUNICODE + bytes([len(raw)]) + raw


def name(module: str, qualified: str) -> bytes:
    return text(module) + text(qualified) + pickle.STACK_GLOBAL


def call(callable_: bytes, *args: bytes) -> bytes:
    return callable_ + pickle.MARK + b"".join(args) + pickle.TUPLE + pickle.REDUCE


def dtype(code: str) -> bytes:
    return call(name("numpy", "dtype"), text(code), pickle.NEWFALSE, pickle.NEWTRUE)


def small(n: int) -> bytes:
    return pickle.BININT1 + bytes([n])


def big(n: int) -> bytes:
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return pickle.LONG1 + bytes([len(raw)]) + raw


def tup(*items: bytes) -> bytes:
    return pickle.MARK + b"".join(items) + pickle.TUPLE


def whole(body: bytes) -> bytes:
    return pickle.PROTO + b"\x05" + body + pickle.STOP


def seal(path, body: bytes, buffers=(), commit=1, lineage=LINEAGE):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        checkpoints.seal(fd, commit, lineage, memoryview(whole(body)), [memoryview(b) for b in buffers])
    finally:
        os.close(fd)


CHILD = r"""
import collections, fractions, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
from hvdlite.worker import checkpoints, durable
before = {c: dict(vars(c)) for c in (collections.Counter, fractions.Fraction)}
try:
    state = checkpoints.load(sys.argv[1])[2]
    print("loaded", repr(state)[:200])
except Exception as e:
    print("refused", durable._cause(e))
print("classes", "changed" if before != {c: dict(vars(c)) for c in before} else "unchanged")
"""


def load_in_child(path):
    done = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ROOT})
    return done.returncode, done.stdout, done.stderr


ATTACKS = {
    # numpy.ndarray(shape, dtype('O'), buffer): an object array whose pointers are file bytes
    "object-array-over-bytes": call(name("numpy", "ndarray"), tup(small(2)), dtype("O8"), pickle.SHORT_BINBYTES
                                    + bytes([16]) + b"\x41" * 16),
    # a structured dtype with an object field, its flags 0 by __setstate__, over raw bytes
    "structured-dtype-flags-0": call(name("numpy._core.numeric", "_frombuffer"), pickle.SHORT_BINBYTES + bytes([16])
                                     + b"\x41" * 16, dtype("V16") + tup(small(3), text("|"), pickle.NONE,
                                     tup(text("a")), pickle.EMPTY_DICT + text("a") + tup(dtype("O8"), small(0))
                                     + pickle.SETITEM, small(16), small(1), small(0)) + pickle.BUILD,
                                     tup(small(1)), text("C")),
    # the same dtype trick on a plain dtype: 'O' flags taken away from an object dtype
    "object-dtype-flags-0": call(name("numpy._core.numeric", "_frombuffer"), pickle.SHORT_BINBYTES + bytes([8])
                                 + b"\x41" * 8, dtype("O8") + tup(small(3), text("|"), pickle.NONE, pickle.NONE,
                                 pickle.NONE, big(-1), big(-1), small(0)) + pickle.BUILD, tup(small(1)), text("C")),
    # BUILD on an allow-listed class: rewrites Counter for the whole process
    "build-on-a-class": name("collections", "Counter") + tup(pickle.NONE, pickle.EMPTY_DICT + text("most_common")
                                                             + pickle.NONE + pickle.SETITEM) + pickle.BUILD,
    "build-on-fraction": name("fractions", "Fraction") + tup(pickle.NONE, pickle.EMPTY_DICT + text("__add__")
                                                             + pickle.NONE + pickle.SETITEM) + pickle.BUILD,
    # memory bombs: a size from a number
    "bytes-10**12": call(name("builtins", "bytes"), big(10 ** 12)),
    "list-of-a-range": call(name("builtins", "list"), call(name("builtins", "range"), big(10 ** 12))),
    "list-slice-of-a-range": pickle.EMPTY_LIST + call(name("builtins", "slice"), small(0), small(0))
                             + call(name("builtins", "range"), big(10 ** 12)) + pickle.SETITEM,
    "empty-tensor-of-a-huge-shape": call(name("hvdlite.worker.checkpoints", "_tensor"), text("float32"),
                                         tup(big(10 ** 6), big(10 ** 6)), pickle.NEWFALSE,
                                         pickle.SHORT_BINBYTES + b"\x00"),
    "memo-at-index-2**32-1": pickle.NONE + pickle.LONG_BINPUT + b"\xff\xff\xff\xff",
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_crafted_checkpoint_is_refused_in_one_line(tmp_path, attack):
    path = tmp_path / "crafted.ckpt"
    seal(path, ATTACKS[attack])
    code, out, err = load_in_child(path)
    assert code == 0, (code, out, err[-2000:])  # before: SIGSEGV (-11), or MemoryError's traceback
    lines = out.splitlines()
    if attack == "memo-at-index-2**32-1":  # harmless once the memo is a dict: it loads
        assert lines == ["loaded None", "classes unchanged"], out
        return
    assert len(lines) == 2 and lines[0].startswith("refused Untrusted: "), out
    assert lines[1] == "classes unchanged", out
    assert not err, err


def test_real_states_still_load_through_the_checked_constructors(tmp_path):
    import collections
    import datetime
    import decimal
    import fractions
    import numpy as np
    import torch
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "big_endian": np.arange(3, dtype=">i4"), "strings": np.array(["ab", "c"]),
             "objects": np.array([1, "a", None], dtype=object), "strided": np.arange(6.0).reshape(2, 3)[:, ::2],
             "scalar": np.float32(1.5), "bools": torch.tensor([True, False]), "empty": np.zeros((0, 3)),
             "counter": collections.Counter("aab"), "deque": collections.deque([1], maxlen=3),
             "dd": collections.defaultdict(list, a=[1]),
             "when": datetime.datetime(2026, 1, 2, tzinfo=datetime.timezone.utc),
             "fraction": fractions.Fraction(1, 3), "decimal": decimal.Decimal("1.5"), "range": range(3),
             "slice": slice(1, 2), "complex": 1 + 2j, "param": torch.nn.Parameter(torch.ones(2))}
    fd = os.open(tmp_path / "c", os.O_WRONLY | os.O_CREAT)
    try:
        checkpoints.dump(fd, 1, LINEAGE, state)
    finally:
        os.close(fd)
    back = checkpoints.load(str(tmp_path / "c"))[2]
    assert back["model"].keys() == state["model"].keys() and back["model"]._metadata == state["model"]._metadata
    assert all(torch.equal(back["model"][k], v) for k, v in state["model"].items())
    assert torch.equal(back["optimizer"]["state"][0]["exp_avg"], state["optimizer"]["state"][0]["exp_avg"])
    for key in ("big_endian", "strings", "objects", "strided", "empty"):
        assert back[key].dtype == state[key].dtype and (back[key] == state[key]).all(), key
    assert type(back["scalar"]) is np.float32 and back["scalar"] == 1.5
    assert torch.equal(back["bools"], state["bools"]) and isinstance(back["param"], torch.nn.Parameter)
    assert back["dd"].default_factory is list and back["deque"].maxlen == 3
    for key in ("counter", "deque", "dd", "when", "fraction", "decimal", "range", "slice", "complex"):
        assert back[key] == state[key] and type(back[key]) is type(state[key]), key


@pytest.mark.parametrize("kind, cases", [("bytes", 3000), ("structured", 200)])
def test_the_short_fuzz_run_finds_no_crash_no_changed_class_and_no_allocation_past_the_bound(kind, cases):
    """The byte fuzzer, and the structured one (before the loader's budget its cases hung, blew
    the memory bound, or crashed the process)."""
    done = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "fuzz_checkpoint.py"), "--cases", str(cases),
                           "--seed", "1"] + (["--structured"] if kind == "structured" else []),
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    summary = done.stdout.splitlines()[-1]
    assert "crashes=0" in summary and "hangs=0" in summary and "classes_changed=0" in summary \
        and "over_bound=0" in summary, done.stdout


def memo_get(i: int) -> bytes:
    return pickle.BINGET + bytes([i])


def hash_chain(levels: int) -> bytes:
    """A dict keyed by a tuple that holds the one before it twice: hashing it costs 2**levels."""
    body = pickle.EMPTY_DICT + pickle.EMPTY_TUPLE + pickle.MEMOIZE + pickle.POP
    for i in range(levels):
        body += memo_get(i) + memo_get(i) + pickle.TUPLE2 + pickle.MEMOIZE + pickle.POP
    return body + memo_get(levels) + pickle.NONE + pickle.SETITEM


def copies(constructor: bytes, argument: bytes, times: int) -> bytes:
    """A list of `times` calls of a copying constructor on one argument stored once."""
    body = name(*constructor) + pickle.MEMOIZE + pickle.POP + argument + pickle.MEMOIZE + pickle.POP
    return body + pickle.EMPTY_LIST + pickle.MARK + (memo_get(0) + memo_get(1) + pickle.TUPLE1 + pickle.REDUCE) * times \
        + pickle.APPENDS


EXHAUSTING = {
    "hash-of-a-tuple-chain": hash_chain(100),  # before: hangs for good
    "tuple-a-million-deep-as-a-key": pickle.EMPTY_DICT + pickle.NONE + pickle.TUPLE1 * 1_000_000 + pickle.NONE
                                     + pickle.SETITEM,  # before: SIGSEGV
    "deque-of-a-shared-list": copies(("collections", "deque"), pickle.EMPTY_LIST + pickle.MARK
                                     + pickle.NONE * 50_000 + pickle.APPENDS, 20_000),  # before: ~8 GB
    "counter-of-a-shared-dict": copies(("collections", "Counter"), pickle.EMPTY_DICT + pickle.MARK + b"".join(
        big(n) + pickle.NONE for n in range(300, 20_300)) + pickle.SETITEMS, 20_000),  # before: ~20 GB
    "colliding-int-keys": pickle.EMPTY_DICT + pickle.MARK + b"".join(
        big(7 + n * (2 ** 61 - 1)) + pickle.NONE for n in range(60_000)) + pickle.SETITEMS,  # before: minutes
}

LOADER = r"""
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
resource.setrlimit(resource.RLIMIT_CPU, (60, 60))
from hvdlite.worker import checkpointdir, durable
try:
    checkpointdir.load(sys.argv[1], 1, "0" * 20)
    print("loaded")
finally:
    # VmHWM: this program's own peak (ru_maxrss keeps the forking parent's across exec)
    print("rss_kib", [l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM")][0], flush=True)
"""


@pytest.mark.parametrize("attack", list(EXHAUSTING))
def test_a_checkpoint_built_to_exhaust_its_reader_ends_the_worker_with_one_line_naming_it(tmp_path, attack):
    """The loader's budget (loadbudget.py): memory and work in proportion to the file; past it
    one line naming the file and UNLOADABLE, in bounded time and memory."""
    import time
    from hvdlite import exitcodes
    from hvdlite.worker import loadbudget
    path = tmp_path / "commit-000000000001-00000000000000000000.ckpt"
    seal(path, EXHAUSTING[attack])
    size = os.path.getsize(path)
    script = LOADER.replace('print("loaded")', 'print("loaded")\nexcept Exception as e:\n    durable.unloadable(sys.argv[1], e)')
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ROOT})
    took = time.monotonic() - started
    assert done.returncode == exitcodes.UNLOADABLE, (done.returncode, done.stdout, done.stderr[-2000:])
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and ("OverBudget" in lines[0] or "Untrusted" in lines[0]), lines
    rss = int(done.stdout.split()[-1]) * 1024
    assert rss < 200e6 + loadbudget.MEMORY_PER_BYTE * size + loadbudget.ALLOWANCE, (rss, size)
    assert took < 30, took  # the bound is seconds per MB (bench/fuzz_structured.py); this file is < 1 MB


def test_a_name_in_a_checkpoint_is_looked_up_without_running_module_code(tmp_path):
    """torch's module __getattr__ imports torch._dynamo (hundreds of modules, seconds) when
    asked for it: neither a name's refusal nor a tensor's dtype may ask."""
    script = ("import sys, torch\nfrom hvdlite.worker import checkpoints\nfor path in sys.argv[1:]:\n    try:\n"
              "        checkpoints.load(path)\n    except Exception as e:\n"
              "        print(type(e).__name__, 'torch._dynamo' in sys.modules)\n")
    as_dtype = call(name("hvdlite.worker.rebuild", "tensor"), text("_dynamo"), tup(), pickle.NEWFALSE,
                    pickle.SHORT_BINBYTES + b"\x00")
    for i, body in enumerate((name("torch", "_dynamo"), as_dtype)):
        seal(tmp_path / f"{i}.ckpt", body)
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "0.ckpt"), str(tmp_path / "1.ckpt")],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": ROOT})
    assert done.stdout.split() == ["Untrusted", "False"] * 2, done.stdout + done.stderr[-2000:]


def test_control_bytes_from_a_checkpoint_never_reach_the_terminal(tmp_path, capsys):
    """A crafted name (ESC ]0;... sets a terminal's title) is quoted escaped, by the worker's
    own line and by the driver's (which prints what a worker reports)."""
    from hvdlite.driver.terminal import TERMINAL
    path = tmp_path / "commit-000000000001-00000000000000000000.ckpt"
    seal(path, name("\x1b]0;pwned\x07", "x\x9b2J"))
    script = LOADER.replace('print("loaded")', 'print("loaded")\nexcept Exception as e:\n    durable.unloadable(sys.argv[1], e)')
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 65 and "\\x1b]0;pwned\\x07" in done.stderr, done.stderr
    assert not any(c in done.stderr for c in "\x1b\x07\x9b"), done.stderr
    TERMINAL.say(f"hvdlite: error: checkpoint {path} does not load: it holds \x1b]0;pwned\x07.x")
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "\\x1b]0;pwned\\x07" in err
