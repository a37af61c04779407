"""Long-polls: requests answered later. Waiters holds who waits for which key; LongPoll is one
connection's request whose answer comes from a future, its timer or its connection's end."""
from hvdlite.driver.kv.parse import internal


class Waiters:
    """Callbacks waiting for keys to be set, by (scope, key); the caller holds the lock."""

    def __init__(self):
        self._by_name = {}  # (scope, key) -> {token: callback(value or None)}

    def add(self, name, callback):
        token = object()
        self._by_name.setdefault(name, {})[token] = callback
        return token

    def forget(self, name, token) -> None:
        group = self._by_name.get(name)
        if group is not None:
            group.pop(token, None)
            if not group:
                del self._by_name[name]

    def pop(self, name) -> list:
        return list(self._by_name.pop(name, {}).values())

    def drain(self) -> list:
        callbacks = [cb for group in self._by_name.values() for cb in group.values()]
        self._by_name = {}
        return callbacks

    def __len__(self):
        return len(self._by_name)


class Later:
    """An answer the server's own data gives later (a key set, a family complete): what
    LongPoll reads of a concurrent.futures.Future, without its lock and condition (a world's
    ranks wait by thousands, one each). Settled from any thread; the callback runs in the
    settling thread, or at once if it came later, and twice should the two race (LongPoll
    answers once)."""
    __slots__ = ("_answer", "_cancelled", "_callback")

    def __init__(self):
        self._answer, self._cancelled, self._callback = None, False, None

    def add_done_callback(self, callback) -> None:
        self._callback = callback
        if self.done():
            callback(self)

    def set_result(self, answer) -> None:
        if not self.done():
            self._answer = answer
            if self._callback is not None:
                self._callback(self)

    def cancel(self) -> bool:
        self._cancelled = self._answer is None
        return self._cancelled

    def cancelled(self) -> bool:
        return self._cancelled

    def done(self) -> bool:
        return self._cancelled or self._answer is not None

    def exception(self):
        return None

    def result(self):
        return self._answer


class LongPoll:
    """A request whose answer comes later: what its future resolves to, (408, expired) once
    its time is up, or nothing if dropped (its client went away). `answer` gets it on the
    server's thread, once; the route's cancel runs unless the future answered."""

    def __init__(self, future, cancel, answer):
        """future: a route's concurrent.futures.Future, or the server's own Later."""
        self.future, self._cancel, self._answer = future, cancel, answer
        self.done = False
        self._timer = None

    def start(self, server, seconds, expired) -> None:
        """Arm the timer and listen to the future (which may have an answer already)."""
        self._timer = server.call_later(seconds, self._expire, expired)
        self.future.add_done_callback(lambda f: server.call_soon(self._settled))

    def drop(self) -> None:
        if not self.done:
            self.done = True
            self._timer.cancel()
            self._cancel()
            self.future.cancel()

    def _expire(self, reason):
        if not self.done:
            self.done = True
            self._cancel()
            self.future.cancel()
            self._answer((408, reason))

    def _settled(self):
        if self.done:
            return
        self.done = True
        self._timer.cancel()
        future = self.future
        if future.cancelled():
            answer = 503, b"the route gave up this request"
        elif future.exception() is not None:
            error = future.exception()
            answer = internal(error)
        else:
            answer = future.result()
        self._answer(answer)


def resolve(future, answer) -> None:
    """Settle a route's future unless it is settled (cancelled meanwhile)."""
    if not future.done():
        try:
            future.set_result(answer)
        except Exception:  # noqa: BLE001 - cancelled meanwhile
            pass
