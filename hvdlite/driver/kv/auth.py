"""Who the KV server listens to: requests and heartbeats signed with the job's key, each heard
once within the clock window; and the signatures on its answers (hvdlite.worker.kvproto)."""
import heapq
import hmac
import time

from hvdlite.worker import kvproto

BULK_HASHED = 4096  # answers this big have their hash remembered (Gate.answer_header)


class Replays:
    """Nonces seen within the accepted clock window (pure: the caller passes the time)."""

    def __init__(self, skew: float = kvproto.SKEW):
        self.skew = skew
        self._seen, self._expiry = set(), []  # heap of (time the nonce goes stale, nonce)

    def verdict(self, stamp: float, nonce: str, now: float):
        """None to accept (and remember) the nonce, else why it is refused."""
        if abs(stamp - now) > self.skew:
            return "stale"
        while self._expiry and self._expiry[0][0] < now:
            self._seen.discard(heapq.heappop(self._expiry)[1])
        if nonce in self._seen:
            return "replayed"
        self._seen.add(nonce)
        heapq.heappush(self._expiry, (stamp + self.skew, nonce))
        return None

    def __len__(self):
        return len(self._seen)


class Senders:
    """Heartbeat senders' counters: a datagram must carry a counter above its sender's last."""

    def __init__(self, skew: float = kvproto.SKEW):
        self.skew = skew
        self._last = {}  # sender -> (counter, newest time)

    def verdict(self, stamp: float, sender: bytes, counter: int, now: float):
        if abs(stamp - now) > self.skew:
            return "stale"
        last = self._last.get(sender)
        if last is not None and counter <= last[0]:
            return "replayed"
        self._last[sender] = (counter, max(stamp, last[1]) if last else stamp)
        return None

    def prune(self, now: float) -> None:
        """Forget senders silent for longer than any datagram of theirs stays acceptable."""
        self._last = {s: v for s, v in self._last.items() if v[1] + self.skew >= now}


class Gate:
    """The job's key at the server's door; used on the server's thread only."""

    def __init__(self, secret: str):
        self._key = kvproto.job_key(secret)
        self._beat_key = kvproto.beat_key(self._key)
        self._replays, self.senders = Replays(), Senders()
        self._big_sha = None  # (body, its sha256) of the last big answer

    def check(self, method, target, auth):
        """(refusal, fields) for a request head's signature header (None if absent).

        refusal is None when the request may be served, else (status, reason[, server time])
        to answer before closing; fields are the parsed signature (stamp, nonce, body hash,
        mac) when it is the job's, else None. A stale or replayed request is still signed
        with the job's key, so its answer is signed too (a client corrects its clock only by
        a signed answer). Remembers the nonce."""
        fields = kvproto.parse_auth(auth) if auth else None
        if fields is None:
            return (401, b"missing or malformed " + kvproto.AUTH_HEADER.encode()), None
        stamp, nonce, body_sha, mac = fields
        expected = kvproto.signature(self._key, method, target, body_sha, stamp, nonce)
        if not hmac.compare_digest(mac, expected):
            return (403, b"bad signature"), None
        refused = self._replays.verdict(float(stamp), nonce, time.time())
        if refused == "stale":
            return (403, kvproto.stale(time.time())), fields
        return ((403, refused.encode()) if refused else None), fields

    def answer_header(self, request_mac: str, status: int, body) -> str:
        """The signature header of an answer to a request signed with request_mac."""
        signature = kvproto.answer_signature(self._key, request_mac, status, self._body_sha(body))
        return f"{kvproto.SIG_HEADER}: {signature}\r\n"

    def _body_sha(self, body) -> str:
        """A world's snapshot goes to every rank in turn: the last big body's hash is kept,
        so it is hashed once, not once per rank."""
        if len(body) < BULK_HASHED or type(body) is not bytes:
            return kvproto.body_sha(body)
        last = self._big_sha
        if last is None or last[0] is not body:
            last = self._big_sha = (body, kvproto.body_sha(body))
        return last[1]

    def beat(self, datagram: bytes, now: float):
        """The decoded heartbeat if it is signed, fresh and newer than its sender's last."""
        beat = kvproto.decode_beat(self._beat_key, datagram)  # None unless signed
        if beat is None or self.senders.verdict(beat[1], beat[2], beat[3], now):
            return None
        return beat

    def beat_answerer(self, answer: bytes):
        return kvproto.beat_answerer(self._beat_key, answer)
