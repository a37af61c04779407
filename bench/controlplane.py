"""The driver's control plane at scale, against torch's TCPStore in the same run:

    python bench/controlplane.py [--sizes 64 256 1024 4096 16384] [--procs 2] [--reform 4 16 32]
                                 [--reform-trials 3]

For each size N, one line `ranks=N form_s=F rendezvous_s=X reform_s=R reform_rendezvous_s=Q
tcpstore_s=Y heartbeat_cpu=Z rss_mb=W`:
- rendezvous_s: N simulated ranks (asyncio, many per process, signing and framing through
  hvdlite.worker.kvproto like real workers) each ask the driver's rendezvous route for their
  place (the real Rendezvous and ElasticCore, which answer once all N are ready), set their gloo address
  (--value-bytes, default 154: what torch 2.13's gloo sets per rank without its N-dependent
  part) and read every rank's, as gloo's full mesh asks, in one scope snapshot that the same
  request asks for (ScopeStore); from the start signal to the last rank holding all N addresses.
  Above --full-mesh-max ranks a full mesh would move N * N * 154 bytes (41 GB at 16,384) and
  hold gigabytes of answers in the simulating processes at once: each rank then reads its two
  ring neighbours' addresses instead (what a ring needs); the line says `ring`.
- form_s: the same start to the last rank holding its place (the barrier alone).
- reform_s, reform_rendezvous_s: once the world formed, one rank is lost (the driver hears its
  exit, -9, as from its launcher; the survivors learn it at the same moment, as from their
  broken gloo links) -> the last survivor holding its place in the re-formed world, and holding
  its peers' addresses in the new world's scope.
- tcpstore_s: the same exchange over torch's TCPStore (libuv), threads for ranks, with the
  best calls it offers: add+wait for the barrier, set, wait(all keys), multi_get(all keys).
- heartbeat_cpu: the driver's CPU (fraction of one core) while N simulated workers heartbeat
  every 0.5 s as Session does (signed datagrams), answered by the driver's Rendezvous, their
  batches fed to its ElasticCore (which must have heard every worker) on the Job's tick loop;
- rss_mb: the driver process's peak RSS.
Then kill -9 re-form times of real numpy-backend jobs (--reform sizes; /work/main/.venv-pygloo
or --worker-python): from the kill to the survivors' first allreduce in the new world, median
over --reform-trials kills per job.
"""
import argparse
import asyncio
import json
import os
import select
import socket
import statistics
import subprocess
import sys
import threading
import time
from urllib.parse import urlencode

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from hvdlite import procstat  # noqa: E402
from hvdlite.worker import kvproto  # noqa: E402

SECRET = "controlplane-bench"
KEY = kvproto.job_key(SECRET)
BEAT_KEY = kvproto.beat_key(KEY)
# What torch 2.13's gloo sets for a rank (captured), less its trailing per-peer counters:
# a sockaddr with the rank's port, padding, and a few per-process fields.
ADDRESS = bytes.fromhex(
    "0200000000000000766d8800000000000000020094e57f00000100000000000000000000000000000000"
    "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
    "00000000000000000000000000000000000000759f02a2d2ceea000000000000000080ffffffffffffff0b00"
    "0000000000000062db978c0d7f0000ffffffffffffffff0000000000000000")


def address(rank: int, size_bytes: int) -> bytes:
    """A realistic value for one rank: its own port and per-process fields."""
    value = bytearray(ADDRESS)
    value[18:20] = (20000 + rank % 40000).to_bytes(2, "big")
    value[128:136] = os.urandom(8)
    value[-24:-16] = os.urandom(8)
    return bytes(value[:size_bytes]) + bytes(max(0, size_bytes - len(value)))
BEAT_INTERVAL = 0.5  # hvdlite.worker.session.HEARTBEAT_INTERVAL


# -- the driver's side: the real KV server, Rendezvous and elastic core ---------------------

def worker_id(rank: int) -> str:
    """The incarnation id the core gives the first launch of slot `rank` of host "sim"."""
    return f"sim/{rank}#1"


def serve(size: int) -> None:
    """The driver's control plane as `hvdlite run` builds it (job.py): a KVServer with the
    Rendezvous route and heartbeat handler, and a decision loop feeding an ElasticCore the
    Ready events and heartbeat batches, ticking as the Job does. The core is told the N
    workers were launched (HostsFound, Launched), so the ranks' rendezvous forms a real world
    and their heartbeats refresh real incarnations."""
    import queue

    from hvdlite.driver.decisions.core import ElasticCore
    from hvdlite.driver.decisions.policy import Policy
    from hvdlite.driver.decisions.messages import (
        Answer, Exited, HostsFound, Launch, Launched, Publish, Stop, Tick)
    from hvdlite.driver.job import TICK
    from hvdlite.driver.kv.server import KVServer
    from hvdlite.driver.rendezvous import Rendezvous
    from hvdlite.driver.descriptors import connection_caps
    raise_fd_limit()
    events = queue.Queue()
    rendezvous = Rendezvous(events.put)
    # A quarter of the descriptors stays free for launches by default: 15,000 connections
    # under this machine's hard limit of 20,000, short of one a rank at 16,384 ranks, which a
    # driver of that many would run with a higher limit.
    server = KVServer(SECRET, max_connections=max(connection_caps()[1], size + 256))
    server.add_route("/rdzv/", rendezvous.route)
    server.set_heartbeat(rendezvous.heartbeat)
    # No launches to time out: the simulated ranks connect in waves before they ask.
    core = ElasticCore(Policy(start_timeout=3600.0))
    stops = []

    def apply(actions):
        for action in actions:
            if isinstance(action, Launch):
                events.put(Launched(action.worker, os.getpid()))
            elif isinstance(action, Answer):
                rendezvous.answer(action.worker, action.status, action.body)
            elif isinstance(action, Publish):
                rendezvous.publish(action.updates, action.broken)
            elif isinstance(action, Stop):
                stops.append(action.worker)

    def decide():  # job.Job.run_elastic's loop, less the launchers and the status line
        event, last_tick = HostsFound((("sim", size),)), time.monotonic()
        while True:
            now = time.monotonic()
            if callable(event):
                event = event()
            actions = core.handle(event, now) if event is not None else []
            beats = rendezvous.drain_heartbeats()
            if beats is not None:
                actions += core.handle(beats, now)
            if now - last_tick >= TICK:
                last_tick = now
                actions += core.handle(Tick(), now)
            apply(actions)
            try:
                event = events.get(timeout=TICK)
            except queue.Empty:
                event = None

    def heard(since):
        """How many of the world's workers the core heard from since `since`, and the
        newest commit they reported (what the simulated beats carry)."""
        incs = [core.workers[worker] for worker in core.world]
        fresh = [inc for inc in incs if inc.heard_at is not None and inc.heard_at >= since]
        print(json.dumps({"heard": len(fresh), "world": len(incs), "round": core.round, "stops": len(stops),
                          "commit": max((i.commit for i in fresh), default=0)}), flush=True)
    threading.Thread(target=decide, daemon=True, name="decisions").start()
    server.start()
    print(server.address[1], flush=True)
    # "heard <monotonic time>": report; "lost <rank>": its exit, as the launcher reports it;
    # end of input: stop
    for line in sys.stdin:
        what, arg = line.split()
        if what == "lost":
            events.put(Exited(worker_id(int(arg)), -9))
        else:
            events.put(lambda since=float(arg): heard(since))
    rendezvous.close()
    server.stop()


# -- simulated ranks ------------------------------------------------------------------------

class AsyncKV:
    """One rank's connection, speaking the protocol through kvproto as KVClient does, and as
    it does, connecting again once when the server closed the kept-alive connection while it
    was idle (over the server's IDLE_TIMEOUT: thousands of ranks take longer to connect)."""

    def __init__(self, port):
        self.port, self.reader, self.writer = port, None, None

    async def connect(self):
        # By address: open_connection("127.0.0.1") would resolve it in a small thread pool,
        # thousands of times over.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", self.port))
        self.reader, self.writer = await asyncio.open_connection(sock=sock, limit=1 << 22)
        self.parser = kvproto.ResponseParser()

    async def request(self, method, target, body=b""):
        try:
            return await self._request(method, target, body)
        except ConnectionResetError:  # closed while idle: the request never ran
            self.writer.close()
            await self.connect()
            return await self._request(method, target, body)

    async def _request(self, method, target, body):
        request, signed = kvproto.encode_request(KEY, method, target, body)
        self.writer.write(request)
        heard = False
        while True:
            answer = self.parser.next()
            if answer is not None:
                status, headers, body = answer
                if not kvproto.answer_is_signed(KEY, signed, status, headers, body):
                    raise ConnectionError(f"{method} {target}: answer {status} not signed with the job's key")
                return status, body
            try:
                data = await self.reader.read(1 << 20)
            except ConnectionError:
                data = b""
            if not data:  # before any answer: the request never ran
                raise (ConnectionError if heard else ConnectionResetError)("server closed the connection")
            heard = True
            self.parser.feed(data)


async def connected(port):
    """A rank's connection, authenticated by a first request, as a worker's would be by the
    time a world forms (TCPStore's ranks connect before the start too)."""
    kv = AsyncKV(port)
    await kv.connect()
    assert (await kv.request("GET", "/kv/hello/none"))[0] == 404
    return kv


async def one_rank(kv, worker, after, value, snapshots, full_mesh):
    """Its place in the next world, then its peers' addresses: (placed, done) times."""
    status, body = await kv.request("GET", f"/rdzv/assign?{urlencode({'worker': worker, 'after': after})}")
    assert status == 200, (status, body)
    placed = time.time()
    world = json.loads(body)["world"]
    rank, size, scope = world["rank"], world["size"], f"gloo.{world['round']}"
    if not full_mesh:  # its own address, then its ring neighbours'
        status, _ = await kv.request("PUT", f"/kv/{scope}/0%2F{rank}", address(rank, value))
        assert status == 200, status
        for peer in {(rank - 1) % size, (rank + 1) % size}:
            status, got = await kv.request("GET", f"/kv/{scope}/0%2F{peer}?wait=60")
            assert status == 200 and got[18:20] == address(peer, value)[18:20], status
        return placed, time.time()
    # As ScopeStore sends gloo's set of this rank's address with its read of every peer's.
    status, snapshot = await kv.request("PUT", f"/kv/{scope}/0%2F{rank}?prefix=0%2F&count={size}&wait=60",
                                        address(rank, value))
    assert status == 200, status
    # Every rank gets the same bytes: decode the first, compare the rest (the ranks share
    # this process; on real hosts each decodes its own).
    if not snapshots:
        keys = kvproto.decode_snapshot(snapshot)
        assert sorted(keys) == sorted(f"0/{r}" for r in range(size)), "snapshot incomplete"
        snapshots.append(snapshot)
    assert snapshot == snapshots[0], "ranks disagree on the addresses"
    return placed, time.time()


async def world(conns, first, after, value_bytes, full_mesh):
    """Every rank of `conns` (None: lost) into the next world: the latest (placed, done) times."""
    snapshots, cpu = [], time.process_time()
    ends = await asyncio.gather(*(one_rank(kv, worker_id(first + i), after, value_bytes, snapshots, full_mesh)
                                  for i, kv in enumerate(conns) if kv is not None))
    return {"placed": max(e[0] for e in ends), "end": max(e[1] for e in ends), "cpu": time.process_time() - cpu}


async def ranks_main(port, first, count, size, value_bytes, full_mesh_max):
    conns = []
    for start in range(0, count, 256):  # in waves: a burst of thousands of SYNs on loopback
        conns += await asyncio.gather(*(connected(port) for _ in range(min(256, count - start))))
    # Thousands take longer than the server keeps an idle connection: those connected first
    # ask once more, as a worker's connection is fresh when it asks for its place.
    for start in range(0, count, 256):
        statuses = await asyncio.gather(*(kv.request("GET", "/kv/hello/none") for kv in conns[start:start + 256]))
        assert all(status == 404 for status, _ in statuses), statuses[:3]
    print("ready", flush=True)

    async def order():
        return (await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)).split()
    start = float((await order())[0])
    await asyncio.sleep(max(0.0, start - time.time()))
    print(json.dumps(await world(conns, first, -1, value_bytes, size <= full_mesh_max)), flush=True)
    lost, start = await order()  # "<rank> <time>": that rank is lost at that time
    await asyncio.sleep(max(0.0, float(start) - time.time()))
    lost = int(lost) - first
    if 0 <= lost < count:
        conns[lost].writer.close()
        conns[lost] = None
    print(json.dumps(await world(conns, first, 1, value_bytes, size - 1 <= full_mesh_max)), flush=True)
    for kv in conns:
        if kv is not None:
            kv.writer.close()
    seconds = float((await order())[0])
    print(json.dumps(await heartbeats(port, first, count, seconds, lost)), flush=True)


class _Beater(asyncio.DatagramProtocol):
    """One simulated worker's socket, as Heartbeats: counts answers to its latest beat."""

    def __init__(self):
        self.mac, self.answered = None, 0

    def datagram_received(self, data, addr):
        if self.mac is not None and kvproto.decode_beat_answer(BEAT_KEY, self.mac, data) is not None:
            self.mac = None
            self.answered += 1


async def heartbeats(port, first, count, seconds, lost):
    """The workers but `lost` (an index) beat every 0.5 s for `seconds`, each from its own
    socket and sender."""
    loop = asyncio.get_running_loop()
    workers = [worker_id(first + i) for i in range(count) if i != lost]
    count = len(workers)
    beaters = [await loop.create_datagram_endpoint(_Beater, remote_addr=("127.0.0.1", port))
               for _ in range(count)]
    senders = [os.urandom(8) for _ in range(count)]
    sent, counter, deadline = 0, 0, time.monotonic() + seconds
    gap = BEAT_INTERVAL / count  # workers are not in step: spread their beats over the interval
    while time.monotonic() < deadline:
        tick = time.monotonic()
        counter += 1
        for i, (transport, beater) in enumerate(beaters):
            # What Session beats: its worker id and the commits it holds (here: the beat count).
            datagram = kvproto.encode_beat(BEAT_KEY, senders[i], counter, workers[i], counter, time.time())
            beater.mac = datagram[:kvproto.BEAT_TAG]
            transport.sendto(datagram)
            sent += 1
            if i % 64 == 63:
                await asyncio.sleep(max(0.0, tick + (i + 1) * gap - time.monotonic()))
        await asyncio.sleep(max(0.0, BEAT_INTERVAL - (time.monotonic() - tick)))
    await asyncio.sleep(0.2)
    for transport, _ in beaters:
        transport.close()
    return {"sent": sent, "answered": sum(b.answered for _, b in beaters)}


# -- the baseline: torch's TCPStore ---------------------------------------------------------

def tcpstore_ranks(port, first, count, size, value_bytes):
    from datetime import timedelta

    import torch.distributed as dist
    keys = [f"0/{r}" for r in range(size)]
    ends, errors, start_at = [], [], []
    connected = threading.Barrier(count + 1)
    go = threading.Event()
    connecting = threading.Semaphore(256)  # in waves, as the hvdlite ranks connect

    def rank():
        try:  # every rank connects on its own thread: one by one, thousands take minutes
            with connecting:
                store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=300))
        except Exception as e:  # noqa: BLE001 - reported
            errors.append(repr(e))
            connected.wait()
            return
        connected.wait()
        go.wait()
        time.sleep(max(0.0, start_at[0] - time.time()))
        try:
            me = store.add("arrived", 1) - 1  # the barrier, as c10d's rendezvous builds it
            if me == size - 1:
                store.set("go", b"1")
            store.wait(["go"])
            value = address(me, value_bytes)
            store.set(keys[me], value)
            store.wait(keys)
            got = store.multi_get(keys)
            assert len(got) == size and got[me] == value
            ends.append(time.time())
        except Exception as e:  # noqa: BLE001 - reported
            errors.append(repr(e))
    threads = [threading.Thread(target=rank, daemon=True) for _ in range(count)]
    for t in threads:
        t.start()
    connected.wait()
    print("ready", flush=True)
    start_at.append(float(sys.stdin.readline()))
    go.set()
    for t in threads:
        t.join(600)
    print(json.dumps({"end": max(ends) if ends else None, "errors": errors[:3]}), flush=True)
    sys.stdin.readline()
    os._exit(0)


# -- orchestration --------------------------------------------------------------------------

def raise_fd_limit():
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def spawn(*args):
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), *map(str, args)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": ROOT})


def read_line(proc, timeout):
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else ""
    if not line:
        raise RuntimeError(f"process {proc.args[2:]} gave no answer within {timeout:g} s")
    return line.strip()


def stop(procs):
    for proc in procs:
        if proc.poll() is None:
            try:
                proc.stdin.close()
                proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait(10)


def split(size, procs):
    per = -(-size // procs)
    return [(first, min(per, size - first)) for first in range(0, size, per)]


def cpu_seconds(pid, user=True, system=True):
    fields = procstat.stat_fields(pid)
    return (user * int(fields[11]) + system * int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(f.read().split("VmHWM:")[1].split()[0]) / 1024


def start_all(ranks, timeout, say=""):
    """Every rank process is told `say` and the time to start at, 0.3 s from now."""
    for proc in ranks:
        assert read_line(proc, timeout) == "ready"
    return tell(ranks, say)


def tell(procs, say=""):
    start = time.time() + 0.3
    for proc in procs:
        proc.stdin.write(f"{say}{start}\n")
        proc.stdin.flush()
    return start


def measure_hvdlite(size, procs, value_bytes, beat_seconds, full_mesh_max):
    """((form, rendezvous), (re-form, its rendezvous)) seconds, the driver's and the simulated
    ranks' CPU seconds over both, heartbeat CPU, its kernel share, peak RSS, heartbeats answered,
    and beats a second."""
    server = spawn("serve", size)
    ranks = []
    try:
        port = int(read_line(server, 30))
        ranks = [spawn("ranks", port, first, count, size, value_bytes, full_mesh_max)
                 for first, count in split(size, procs)]
        driver_cpu = cpu_seconds(server.pid)
        times, rank_cpu = [], 0.0
        for lost in (None, size // 2):  # the world forms; a rank is lost and it re-forms
            if lost is None:
                start = start_all(ranks, 120)
            else:
                time.sleep(0.5)  # the world at work
                start = tell(ranks, f"{lost} ")
                time.sleep(max(0.0, start - time.time()))
                server.stdin.write(f"lost {lost}\n")
                server.stdin.flush()
            ends = [json.loads(read_line(proc, 300)) for proc in ranks]
            times.append((max(end["placed"] for end in ends) - start, max(end["end"] for end in ends) - start))
            rank_cpu += sum(end["cpu"] for end in ends)
        cpus = (cpu_seconds(server.pid) - driver_cpu, rank_cpu)
        before, t0 = cpu_seconds(server.pid), time.monotonic()
        before_system = cpu_seconds(server.pid, user=False)
        for proc in ranks:
            proc.stdin.write(f"{beat_seconds}\n")
            proc.stdin.flush()
        beats = [json.loads(read_line(proc, beat_seconds + 60)) for proc in ranks]
        window = time.monotonic() - t0
        cpu = (cpu_seconds(server.pid) - before) / window
        system = (cpu_seconds(server.pid, user=False) - before_system) / window
        sent, answered = sum(b["sent"] for b in beats), sum(b["answered"] for b in beats)
        server.stdin.write(f"heard {t0}\n")  # did the core hear every worker?
        server.stdin.flush()
        core = json.loads(read_line(server, 30))
        if core["heard"] != size - 1 or core["world"] != size - 1 or core["round"] != 2:
            raise RuntimeError(f"the driver's core heard {core['heard']} of {size - 1} workers (round "
                               f"{core['round']}, {core['world']} members): the simulated beats or the "
                               f"re-form are not what workers do")
        return times, cpus, cpu, system, peak_rss_mb(server.pid), answered / max(sent, 1), sent / window
    finally:
        stop(ranks + [server])


def measure_tcpstore(size, procs, value_bytes):
    from datetime import timedelta

    import torch.distributed as dist
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=300), use_libuv=True)
    ranks = [spawn("tcpstore", master.port, first, count, size, value_bytes) for first, count in split(size, procs)]
    try:
        start = start_all(ranks, 300)
        results = [json.loads(read_line(proc, 600)) for proc in ranks]
        errors = [e for r in results for e in r["errors"]]
        if errors or any(r["end"] is None for r in results):
            return f"failed:{errors[:1]}"
        return max(r["end"] for r in results) - start
    finally:
        stop(ranks)
        del master


class CpuSampler:
    """The machine's CPU use (/proc/stat) sampled every 20 ms, to tell how busy its cores were
    over a past window."""

    def __init__(self):
        self.samples, self._stop = [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.02):
            with open("/proc/stat") as f:
                ticks = [int(v) for v in f.readline().split()[1:]]
            self.samples.append((time.time(), sum(ticks) - ticks[3] - ticks[4], sum(ticks)))

    def busy(self, start, end) -> float:
        """Fraction of all cores busy between two wall-clock times."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2:
            return float("nan")
        return (inside[-1][1] - inside[0][1]) / max(1, inside[-1][2] - inside[0][2])

    def close(self):
        self._stop.set()
        self._thread.join(1)


def reform(sizes, python, trials):
    """`trials` kills -9 of one worker of a real numpy-backend job of each size, each once every
    rank has done an allreduce and the world is whole again -> every survivor's first allreduce
    in the re-formed world (bench/elastic.py's trial). Per size, a list of (that time, the
    driver's part of it: the kill to the new world formed, how busy the machine's cores were
    meanwhile)."""
    import random
    import tempfile
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from elastic import Run, kill_trial
    script = os.path.join(ROOT, "bench", "scripts", "allreduce_loop_numpy.py")
    out = {}
    for n in sizes:
        folder = tempfile.mkdtemp(prefix="hvdlite-bench-")
        run = Run([sys.executable, "-m", "hvdlite.cli", "run", "--event-log", os.path.join(folder, "events.jsonl"),
                   "-H", f"localhost:{n}", "--min-np", "1", "--blacklist-cooldown-range", "1", "1",
                   python, script], env_extra={"PYTHONPATH": ROOT, "MALLOC_ARENA_MAX": "2"}, folder=folder)
        cpu, rng, out[n] = CpuSampler(), random.Random(n), []
        try:
            # A world at work, every rank through an allreduce: a kill while pygloo is still
            # connecting the mesh is another matter.
            run.wait(lambda: sum(any(size == n for *_, size in rows) for rows in run.completions().values()) >= n,
                     60 + 3 * n)
            for k in range(trials):  # kill_trial returns once the killed slot has joined again
                trial = kill_trial(run, n, rng)
                events = run.events()
                kills = [e for e in events if e["event"] == "worker_exit" and e.get("code") == -9]
                formed = [e for e in events if e["event"] == "round_complete"
                          and len(kills) > k and e["time"] >= kills[k]["time"]]
                if not trial or not formed:
                    break
                out[n].append((trial[0], formed[0].get("reformed_in", float("nan")),
                               cpu.busy(kills[k]["time"], kills[k]["time"] + trial[0])))
        finally:
            cpu.close()
            run.close()
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=int, nargs="*", default=[64, 256, 1024, 4096])
    p.add_argument("--procs", type=int, default=2, help="processes the simulated ranks share")
    p.add_argument("--value-bytes", type=int, default=154)
    p.add_argument("--beat-seconds", type=float, default=5.0)
    p.add_argument("--no-tcpstore", action="store_true")
    p.add_argument("--full-mesh-max", type=int, default=4096,
                   help="above this many ranks, each reads its ring neighbours' addresses, not all")
    p.add_argument("--reform", type=int, nargs="*", default=[4, 16, 32])
    p.add_argument("--reform-trials", type=int, default=3, help="kills per re-form size")
    p.add_argument("--worker-python", default="/work/main/.venv-pygloo/bin/python")
    args = p.parse_args()
    raise_fd_limit()
    figures = {}
    for size in args.sizes:
        times, cpus, cpu, system, rss, answered, rate = measure_hvdlite(
            size, args.procs, args.value_bytes, args.beat_seconds, args.full_mesh_max)
        (form, rendezvous), (reform, reform_rendezvous) = figures[size] = times
        mesh = "" if size <= args.full_mesh_max else " ring"
        try:
            tcp = "skipped" if args.no_tcpstore else measure_tcpstore(size, args.procs, args.value_bytes)
        except RuntimeError as e:  # the baseline did not make it; our numbers still count
            tcp = f"failed({e})"
        tcp = f"{tcp:.3f}" if isinstance(tcp, float) else tcp
        print(f"ranks={size} form_s={form:.3f} rendezvous_s={rendezvous:.3f}{mesh} reform_s={reform:.3f} "
              f"reform_rendezvous_s={reform_rendezvous:.3f}{mesh} tcpstore_s={tcp} heartbeat_cpu={cpu:.3f} "
              f"rss_mb={rss:.0f}  (heartbeats answered {answered:.1%}, {1e6 * cpu / rate:.1f} us driver CPU "
              f"per beat; kernel share of heartbeat_cpu "
              f"{system:.3f}: on loopback the driver's sends also deliver to its clients)", flush=True)
        print(f"  rendezvous CPU, form and re-form: driver {cpus[0]:.3f} s, simulated ranks {cpus[1]:.3f} s "
              f"({args.procs} processes)", flush=True)
    if len(figures) > 1:  # how the barrier scales: linear reads (large / small ranks)x
        small, large = min(figures), max(figures)
        print(f"scaling {small} -> {large} ranks ({large / small:g}x): form "
              f"{figures[large][0][0] / figures[small][0][0]:.2f}x, re-form "
              f"{figures[large][1][0] / figures[small][1][0]:.2f}x; {large} ranks form and re-form in "
              f"{figures[large][0][1] + figures[large][1][1]:.3f} s with their addresses (goal at 16,384: <= 4 s)")
    if args.reform:
        times = reform(args.reform, args.worker_python, args.reform_trials)
        print("re-form after kill -9 (numpy backend, real processes): kill -> every survivor's first "
              "allreduce in the new world, median of the kills (of it: kill -> world formed, in the "
              "driver; cores busy; slowest kill):")
        medians = {}
        for n, rows in times.items():
            if len(rows) < args.reform_trials:
                print(f"  {n} ranks FAILED after {len(rows)} of {args.reform_trials} kills")
                continue
            medians[n] = statistics.median(r[0] for r in rows)
            print(f"  {n} ranks {medians[n]:.3f} s ({statistics.median(r[1] for r in rows):.3f} s; "
                  f"{statistics.median(r[2] for r in rows):.0%}; slowest {max(r[0] for r in rows):.3f} s)")
        if min(times) in medians and max(times) in medians:
            print(f"ratio {max(times)} / {min(times)} ranks: {medians[max(times)] / medians[min(times)]:.2f}x "
                  f"(target <= 2x)")


if __name__ == "__main__":
    role = sys.argv[1] if len(sys.argv) > 1 else ""
    if role == "serve":
        serve(int(sys.argv[2]))
    elif role == "ranks":
        raise_fd_limit()
        asyncio.run(ranks_main(*(int(a) for a in sys.argv[2:8])))
    elif role == "tcpstore":
        raise_fd_limit()
        tcpstore_ranks(*(int(a) for a in sys.argv[2:7]))
    else:
        main()
