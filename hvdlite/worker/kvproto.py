"""The wire format of the driver's KV server, shared by the server, the blocking client and
light asyncio clients (torch-free, no I/O): request signing, HTTP framing, scope snapshots
and heartbeat datagrams.

No secret crosses the network. A request carries one header,
``X-Hvdlite-Auth: <time>:<nonce>:<sha256 of body>:<signature>``, the signature being
HMAC-SHA256 with the job's secret over method, target (path and query), body hash, time and
nonce. The server checks the signature before it reads a body, refuses a time outside
+-SKEW of its clock, and each nonce once.

Answers are signed too, so nobody on the path can forge a world assignment or a peer's
address: ``X-Hvdlite-Sig`` is HMAC-SHA256 over the request's signature, the status and the
body's hash. Only an answer to a request without a good signature (one from outside the job)
goes unsigned.
"""
import hashlib
import hmac
import math
import os
import struct
import time
import zlib

AUTH_HEADER = "X-Hvdlite-Auth"
SIG_HEADER = "X-Hvdlite-Sig"
STALE = b"stale "  # the body of a refusal for clock skew, then the server's clock (signed)
SKEW = 30.0  # seconds a request's time may differ from the server's clock
MAX_BODY = 64 * 1024 * 1024
MAX_HEAD = 16 * 1024  # request or response line plus headers
MAX_ANSWER = 4 * MAX_BODY  # an answer's Content-Length, read before its signature can be checked
EMPTY_SHA = hashlib.sha256(b"").hexdigest()


def body_sha(body) -> str:
    """The hex sha256 a signature covers for a request's or an answer's body."""
    return hashlib.sha256(body).hexdigest() if body else EMPTY_SHA
_LEN = struct.Struct("!I")


def job_key(secret: str) -> bytes:
    return secret.encode("utf-8")


def signature(key: bytes, method: str, target: str, body_sha: str, stamp: str, nonce: str) -> str:
    message = "\n".join((method, target, body_sha, stamp, nonce)).encode("utf-8", "surrogateescape")
    return hmac.digest(key, message, "sha256").hex()


def auth_value(key: bytes, method: str, target: str, body: bytes, now: float, nonce: str = None) -> str:
    digest = body_sha(body)
    stamp = f"{now:.3f}"
    nonce = nonce or os.urandom(12).hex()
    return ":".join((stamp, nonce, digest, signature(key, method, target, digest, stamp, nonce)))


def parse_auth(value: str):
    """(stamp, nonce, body_sha, signature) or None when malformed."""
    parts = value.split(":")
    if not value.isascii() or len(parts) != 4 or not (0 < len(parts[1]) <= 64 and len(parts[2]) == 64 and len(parts[3]) == 64):
        return None
    try:
        if not math.isfinite(float(parts[0])):
            return None
    except ValueError:
        return None
    return tuple(parts)


def encode_request(key: bytes, method: str, target: str, body: bytes = b"", offset: float = 0.0):
    """One signed HTTP/1.1 request and its signature (which its answer's is bound to);
    `offset` corrects this host's clock to the server's."""
    auth = auth_value(key, method, target, body, time.time() + offset)
    head = (f"{method} {target} HTTP/1.1\r\nHost: hvdlite\r\n{AUTH_HEADER}: {auth}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode("utf-8") + body, auth[-64:]


def stale(now: float) -> bytes:
    """The body refusing a request signed at a time outside SKEW: the server's time, which
    the answer's signature covers (a header would not be)."""
    return STALE + f"{now:.3f}".encode()


def server_time(status: int, body: bytes):
    """The server's time in a signed refusal for clock skew, or None: only a finite one."""
    if status != 403 or not body.startswith(STALE):
        return None
    try:
        found = float(body[len(STALE):].decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None
    return found if math.isfinite(found) else None


def answer_signature(key: bytes, request_signature: str, status: int, body_sha: str) -> str:
    message = "\n".join(("answer", request_signature, str(status), body_sha)).encode("ascii")
    return hmac.digest(key, message, "sha256").hex()


def answer_is_signed(key: bytes, request_signature: str, status: int, headers: dict, body: bytes) -> bool:
    """Whether the answer (headers as ResponseParser gives them) came from a server holding
    the job's key, for the request signed `request_signature`."""
    return hmac.compare_digest(headers.get(SIG_HEADER.lower(), "").encode("latin-1"),
                               answer_signature(key, request_signature, status, body_sha(body)).encode("ascii"))


class ResponseParser:
    """Feed bytes from the connection; `next()` returns (status, headers, body) per response."""

    def __init__(self):
        self.buffer = bytearray()
        self._head = None  # (status, headers, length) of the response being read

    def feed(self, data: bytes) -> None:
        self.buffer += data

    def next(self):
        if self._head is None:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > MAX_HEAD:
                    raise ValueError("response head too long")
                return None
            lines = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
            del self.buffer[:end + 4]
            parts = lines[0].split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
                raise ValueError(f"bad status line {lines[0][:80]!r}")
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = headers.get("content-length", "0")
            if not length.isdigit() or len(length) > 12 or int(length) > MAX_ANSWER:
                raise ValueError("bad Content-Length in response")
            self._head = (int(parts[1]), headers, int(length))
        status, headers, length = self._head
        if len(self.buffer) < length:
            return None
        body = bytes(self.buffer[:length])
        del self.buffer[:length]
        self._head = None
        return status, headers, body


# -- scope snapshots: every key of a scope in one answer ------------------------------------

# Compressed: every rank of a world reads the same snapshot, and gloo's addresses are mostly
# zero padding and repeated fields, so the bytes on the wire shrink several times over.

def encode_snapshot(items) -> bytes:
    """(key, value) pairs as length-prefixed key and value bytes, deflated."""
    parts = []
    for name, value in items:
        raw = name.encode("utf-8")
        parts += (_LEN.pack(len(raw)), raw, _LEN.pack(len(value)), value)
    return zlib.compress(b"".join(parts), 1)


def decode_snapshot(compressed: bytes) -> dict:
    data = zlib.decompress(compressed)
    result, view, at = {}, memoryview(data), 0
    while at < len(data):
        (size,), at = _LEN.unpack_from(view, at), at + 4
        name, at = bytes(view[at:at + size]).decode("utf-8"), at + size
        (size,), at = _LEN.unpack_from(view, at), at + 4
        result[name], at = bytes(view[at:at + size]), at + size
    return result


# -- heartbeats: signed UDP datagrams on the server's port ----------------------------------
# The driver handles thousands a second, so they are fixed binary and tagged with keyed
# BLAKE2b (a MAC, a third of HMAC-SHA256's cost here) under a key of their own, derived
# from the job's.
# request:  tag(16) | b"hb" | time(8, double) | sender(8) | counter(8) | commit(8) | vouched(8,
#           signed: -1 for the worker's own beat, else a stand-in's, see vouch) | calls(8: the
#           collectives it entered in its current world, see Runtime.calls) | waited(8, double:
#           seconds it waited in them) | idle(1: in hvd.join(), see runtime.idle) | worker (UTF-8)
# answer:   tag(16) over b"ha" + answer + the request's tag | answer
# A sender's counter only grows, so a replayed datagram is refused without remembering nonces;
# an answer is bound to its request, so an old one cannot be passed off as new.

_BEAT = struct.Struct("!2sd8sQQqQd?")
BEAT_TAG = 16
BEAT_SIZE = _BEAT.size  # a heartbeat's fixed fields: the tag, these, then the worker's name
BEAT_MARK = b"hb"  # its first field
MAX_DATAGRAM = 1400


def beat_key(key: bytes) -> bytes:
    """The heartbeats' key: not the job's own, so a heartbeat can never pass for a request."""
    return hmac.digest(key, b"hvdlite heartbeats", "sha256")


def _tag(key: bytes, message: bytes) -> bytes:
    return hashlib.blake2b(message, key=key, digest_size=BEAT_TAG).digest()


def encode_beat(key: bytes, sender: bytes, counter: int, worker: str, commit: int, now: float,
                vouched=None, calls: int = 0, waited: float = 0.0, idle: bool = False) -> bytes:
    """A heartbeat of `worker` holding `commit` commits, having entered `calls` collectives in
    its world and waited `waited` seconds in them, `idle` in hvd.join(); key is beat_key(job
    key). `vouched`: None for the worker's own beat; for one its stand-in process sends
    (vouch), the round of the group it holds for the worker (0: none)."""
    message = _BEAT.pack(BEAT_MARK, now, sender, counter, commit, -1 if vouched is None else vouched, calls,
                         waited, idle) \
        + worker.encode("utf-8")
    return _tag(key, message) + message


def decode_beat(key: bytes, datagram: bytes):
    """(tag, time, sender, counter, worker, commit, vouched, (calls, waited, idle)), or None unless
    signed with key and well-formed."""
    if not BEAT_TAG + _BEAT.size <= len(datagram) <= MAX_DATAGRAM:
        return None
    tag, message = datagram[:BEAT_TAG], datagram[BEAT_TAG:]
    if not hmac.compare_digest(tag, _tag(key, message)):
        return None
    mark, stamp, sender, counter, commit, vouched, calls, waited, idle = _BEAT.unpack_from(message)
    # a stamp that is no number would never be stale: a captured beat would replay for good
    if mark != BEAT_MARK or not math.isfinite(stamp) or vouched < -1 or not 0 <= waited < float("inf"):
        return None
    try:
        return (tag, stamp, sender, counter, message[_BEAT.size:].decode("utf-8"), commit,
                None if vouched == -1 else vouched, (calls, waited, idle))
    except UnicodeDecodeError:
        return None


def beat_answerer(key: bytes, answer: bytes):
    """sign(request tag) -> the datagram answering `answer` to that request: the key and the
    answer are hashed once for every request it answers."""
    prefix = hashlib.blake2b(b"ha" + answer, key=key, digest_size=BEAT_TAG)

    def sign(request_tag: bytes) -> bytes:
        tag = prefix.copy()
        tag.update(request_tag)
        return tag.digest() + answer
    return sign


def decode_beat_answer(key: bytes, request_tag: bytes, datagram: bytes):
    """The answer to the request tagged `request_tag`, or None (forged, or another request's)."""
    answer = datagram[BEAT_TAG:]
    if len(datagram) < BEAT_TAG or not hmac.compare_digest(
            datagram[:BEAT_TAG], _tag(key, b"ha" + answer + request_tag)):
        return None
    return answer
