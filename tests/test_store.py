"""KVStore: torch.distributed.Store semantics, and real gloo groups bootstrapped through it."""
import json
import os
import subprocess
import sys
import textwrap
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from hvdlite.torch.store import KVStore
from hvdlite.worker.kvclient import KVClient

SECRET = "store-secret"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))




def make_store(server, scope, seconds=5.0):
    return KVStore(KVClient(*server.address, SECRET, timeout=5.0), scope, timedelta(seconds=seconds))


def test_store_operations(server):
    store = make_store(server, "ops")
    store.set("k", b"\x00bytes")
    store.set("s", "text")
    assert store.get("k") == b"\x00bytes" and store.get("s") == b"text"
    assert server.get("ops", "k") == b"\x00bytes"
    assert store.check(["k", "s"]) and not store.check(["k", "missing"])
    assert store.add("n", 2) == 2 and store.add("n", 3) == 5
    store.wait(["k", "n"])
    store.wait(["k"], timedelta(seconds=1))
    assert store.delete_key("k") and not store.delete_key("k")
    assert make_store(server, "ops-other").check(["s"]) is False


def test_store_timeouts(server):
    store = make_store(server, "timeouts", seconds=0.3)
    started = time.monotonic()
    with pytest.raises(dist.DistStoreError, match="not set within"):
        store.get("never")
    with pytest.raises(dist.DistStoreError):
        store.wait(["never"], timedelta(seconds=0.2))
    assert time.monotonic() - started < 2.0


def test_prefix_store_calls_through(server):
    # torch's C++ wrappers call the Python methods (delete_key under its C++ name);
    # the KVStore must stay referenced from Python for that.
    inner = make_store(server, "prefix")
    store = dist.PrefixStore("pg/", inner)
    store.set("k", b"v")
    assert store.get("k") == b"v" and store.add("n", 4) == 4 and store.check(["k"])
    assert store.delete_key("k")
    assert server.get("prefix", "pg/k") is None


WORKER = textwrap.dedent("""
    import json, sys
    from datetime import timedelta
    import torch, torch.distributed as dist
    from hvdlite.torch.store import KVStore
    from hvdlite.worker.kvclient import KVClient

    host, port, secret, rank = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    client = KVClient(host, port, secret, timeout=10.0)
    sums = []
    for scope, base in (("round-1", 1.0), ("round-2", 10.0)):  # a fresh scope per group
        store = KVStore(client, scope, timedelta(seconds=20), peers=2)  # one request for peers
        pg = dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=20))
        tensor = torch.tensor([base * (rank + 1)])
        pg.allreduce([tensor]).wait()
        sums.append(tensor.item())
    print(json.dumps(sums), flush=True)
    # A gloo group still alive at interpreter exit aborts the process (torch 2.13, any store).
    del pg
""")


def test_two_processes_allreduce_over_two_rounds(server):
    host, port = server.address
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    procs = []
    try:
        for rank in range(2):
            procs.append(subprocess.Popen(
                [sys.executable, "-c", WORKER, host, str(port), SECRET, str(rank)],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            assert json.loads(out.strip().splitlines()[-1]) == [3.0, 30.0]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, 9)
                proc.wait(timeout=10)
