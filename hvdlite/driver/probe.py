"""Probing a suspect worker's node (decisions/nodeloss.py decides what the answer means).

Each worker listens on a socket it never reads (worker/probed.py) and says where, through the
signed KV: PUT /node/listening?worker=ID&addr=A&port=P. The driver connects to it once at
once; only an address that answered then is probed later, so a worker the driver cannot reach
(a firewall, NAT) is never taken for lost. A probe makes ATTEMPTS connects at once, so that one
lost SYN costs nothing: any completed is LISTENING (the kernel answers for a stopped process),
else any refused is REFUSED, else, by the timeout, SILENT. One thread runs every probe in flight
on one selector.

PUT /node/link_broken?worker=ID&peer=IP: a collective of the worker failed on its connections
to IP; becomes LinkBroken for the workers listening there.
"""
import errno
import queue
import selectors
import socket
import threading
import time

from hvdlite.driver.decisions.messages import LISTENING, REFUSED, SILENT, UNPROBED, LinkBroken, Probed

ATTEMPTS = 3  # connects per probe, made at once
IDLE_WAIT = 1.0  # seconds the probing thread sleeps between checks that the driver is closing


class Prober:
    def __init__(self, post, timeout: float):
        self._post, self._timeout = post, timeout  # post: hands an event to the decision thread
        self._lock = threading.Lock()
        self._where = {}  # worker -> (addr, port) that answered when it said it listens
        self._asked = queue.SimpleQueue()  # (addr, port, done(outcome)) to probe
        self._closed = False
        self._thread = threading.Thread(target=self._run, daemon=True, name="hvdlite-probe")
        self._thread.start()

    # ---- the KV routes (on the server's thread: never block) ----------------------------
    def route(self, method, subpath, query, body):
        worker = query.get("worker")
        if not worker or method != "PUT":
            return 400, b"expected PUT with worker=<id>"
        if subpath == "listening":
            try:
                addr, port = query["addr"], int(query["port"])
                socket.inet_pton(socket.AF_INET6 if ":" in addr else socket.AF_INET, addr)
            except (KeyError, ValueError, OSError):
                return 400, b"expected addr as an IP address and port as an integer"
            self._asked.put((addr, port, lambda outcome: self._heard(worker, addr, port, outcome)))
            return 200, b""
        if subpath == "link_broken":
            peer = query.get("peer", "")
            with self._lock:
                peers = tuple(w for w, (addr, _) in self._where.items() if addr == peer)
            if peers:
                self._post(LinkBroken(worker, peers))
            return 200, b""
        return 404, b"unknown node endpoint"

    def _heard(self, worker, addr, port, outcome):
        if outcome == LISTENING:
            with self._lock:
                self._where[worker] = addr, port

    # ---- the executor's side --------------------------------------------------------------
    def probe(self, worker) -> None:
        """Probe the worker's node; a Probed event comes back."""
        with self._lock:
            where = self._where.get(worker)
        if where is None:
            return self._post(Probed(worker, UNPROBED))
        self._asked.put((*where, lambda outcome: self._post(Probed(worker, outcome))))

    def forget(self, worker) -> None:
        with self._lock:
            self._where.pop(worker, None)

    def close(self) -> None:
        self._closed = True

    # ---- the probing thread ---------------------------------------------------------------
    def _run(self):
        selector = selectors.DefaultSelector()
        flying = {}  # probe id -> [deadline, done, sockets left, refused]
        while not self._closed:
            try:
                self._start(self._asked.get(timeout=IDLE_WAIT if not flying else 0.0), selector, flying)
                continue  # start everything asked before waiting
            except queue.Empty:
                pass
            if not flying:
                continue
            wait = max(0.0, min(f[0] for f in flying.values()) - time.monotonic())
            for key, _ in selector.select(wait):
                sock, pid = key.fileobj, key.data
                if pid not in flying:  # another connect of its probe ended it
                    continue
                error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                self._drop(selector, sock, flying[pid])
                if error == 0:
                    self._end(selector, flying, pid, LISTENING)
                elif error == errno.ECONNREFUSED:
                    flying[pid][3] = True
            now = time.monotonic()
            for pid, (deadline, _, left, refused) in list(flying.items()):
                if refused and not left or now >= deadline:
                    self._end(selector, flying, pid, REFUSED if refused else SILENT)
        selector.close()

    def _start(self, asked, selector, flying):
        addr, port, done = asked
        pid = object()
        flying[pid] = [time.monotonic() + self._timeout, done, [], False]
        for _ in range(ATTEMPTS):
            sock = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            error = sock.connect_ex((addr, port))
            if error in (0, errno.EINPROGRESS):
                selector.register(sock, selectors.EVENT_WRITE, pid)
                flying[pid][2].append(sock)
            else:  # refused at once (a local address) or no route: nothing to wait for
                sock.close()
                flying[pid][3] = flying[pid][3] or error == errno.ECONNREFUSED

    @staticmethod
    def _drop(selector, sock, probe):
        selector.unregister(sock)
        sock.close()
        probe[2].remove(sock)

    def _end(self, selector, flying, pid, outcome):
        probe = flying.pop(pid)
        for sock in list(probe[2]):
            self._drop(selector, sock, probe)
        probe[1](outcome)
