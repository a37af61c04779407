"""Big answers take turns: a world's snapshot answered to thousands of ranks at once must not
be copied into the connections' buffers whole. One is written while the bytes the kernel has
not taken yet stay under a budget (always at least one); a connection with an answer waiting
reads no further request until it is written (answers go out in order)."""
import collections

BULK = 256 * 1024  # an answer this big waits its turn while...
BULK_BUDGET = 64 * 1024 * 1024  # ...big answers not yet taken by the kernel hold this much


class Pump:
    """Used on the server's thread only. A connection provides `closed` and
    `send_turn(head, body, close)`, and reports `drained(conn)` once its buffer is empty."""

    def __init__(self, budget: int = BULK_BUDGET):
        self.budget = budget
        self._queue = collections.deque()  # (connection, head, body, close) waiting their turn
        self._waiting = set()  # connections with an answer in the queue
        self._held = {}  # connection -> bytes of its big answers in its buffer
        self._bytes = 0  # the sum of _held

    def queue(self, conn, head, body, close) -> None:
        self._queue.append((conn, head, body, close))
        self._waiting.add(conn)
        self._run()

    def waiting(self, conn) -> bool:
        return conn in self._waiting

    def drained(self, conn) -> None:
        """conn's buffer is empty (or conn is gone): its big answers no longer count."""
        held = self._held.pop(conn, 0)
        if held:
            self._bytes -= held
            self._run()

    def _run(self):
        while self._queue and (not self._bytes or self._bytes + len(self._queue[0][2]) <= self.budget):
            conn, head, body, close = self._queue.popleft()
            self._waiting.discard(conn)
            if conn.closed:
                continue
            self._held[conn] = self._held.get(conn, 0) + len(body)
            self._bytes += len(body)
            conn.send_turn(head, body, close)
