"""The driver's end of the launch claims (hvdlite.worker.claim): a launch that crosses a network
others can read carries a one-time token and this driver's public key, never the job's secret;
the worker claims the secret with them, once.

A token lives as long as its worker has to start (--start-timeout) and is used once. The same
request sent again (a lost answer) gets the same answer, which only its sender can open; any
other use of the token is refused, and the driver says so once per token, naming where the
first use (the one that got the secret) and the second came from: someone who read the launch
has tried it, and if the first came from elsewhere than the worker's host, that someone holds
the secret. Unknown tokens get no answer, and neither do a used token's misuses past
MAX_REFUSALS, before any key exchange: a flood of either costs a look-up each.

Where the launcher knows the addresses its worker's host reaches the driver from (`where`:
Slurm's NodeAddr of the node, the address Ray knows the node by), a claim from any other address
is refused and said, once per token, naming both, and the token stays the worker's; where it
does not, any address is accepted. A multi-homed node whose workers reach the driver from an
address its launcher does not name is refused there, in the same line, which names both.

A used token refuses and goes on, rather than ending the job: the driver cannot tell which of
two claims was the thief's, and ending the job on a second claim would let anyone who reads a
launch end every job with one datagram. The worker whose claim is refused fails with its one
line, and the driver's line names both addresses for the operator to judge.
"""
import os
import threading

from hvdlite.worker import claim, env

KEEP = 60.0  # seconds a token is remembered past its expiry, to tell a late use from a stranger's
MAX_REFUSALS = 8  # answers to a token's misuses; later ones go unanswered


class _Token:
    __slots__ = ("worker", "expires", "where", "request", "answer", "sender", "refusals", "said")

    def __init__(self, worker: str, expires: float, where):
        self.worker, self.expires, self.where = worker, expires, where
        self.request = self.answer = None  # the request that used it, and the answer it got
        self.sender = None  # the address the request that used it came from
        self.refusals = 0
        self.said = set()  # the events said of it already


class Claims:
    """The job's secret behind one-time tokens. `say(event, **fields)` is told of a token's
    first misuse of each kind: launch_token_reused (worker, first: the address of the claim that
    used it, sender: the misuse's) and launch_token_elsewhere (worker, sender, host: the addresses
    it was to come from); `lifetime` is how long a token may wait for its claim."""

    def __init__(self, secret: str, lifetime: float, say=None):
        self._secret, self.lifetime, self._say = secret.encode("utf-8"), lifetime, say
        self._private = None  # made at the first launch that needs a claim (_keys)
        self._key_lock = threading.Lock()
        self._tokens = {}  # token -> _Token
        self._lock = threading.Lock()  # tokens are made on launch threads, used on the server's

    def _keys(self):
        """This driver's key pair, made once: a job whose workers all start on this machine
        never makes one, and runs where the cryptography package is missing."""
        with self._key_lock:
            if self._private is None:
                from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
                from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
                self._private = X25519PrivateKey.generate()
                self._public = self._private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
            return self._private, self._public

    @property
    def public(self) -> bytes:
        return self._keys()[1]

    def sealed(self, environ: dict, worker: str, now: float, where=None) -> dict:
        """`environ` with a one-time claim for `worker` in place of the secret; `where`: the
        addresses its claim may come from, None for any."""
        token = os.urandom(claim.TOKEN)
        with self._lock:
            self._forget_old(now)
            self._tokens[token] = _Token(worker, now + self.lifetime, where)
        kept = {k: v for k, v in environ.items() if k != env.SECRET}
        return {**kept, env.CLAIM: claim.ticket(self.public, token)}

    def answer(self, request: bytes, sender, now: float):
        """The datagram answering a claim `request` from `sender`, or None for no answer."""
        if len(request) != claim.REQUEST_SIZE or not request.startswith(claim.REQUEST) \
                or self._private is None:  # (no claim was ever handed out)
            return None
        token, their_key = request[len(claim.REQUEST):-claim.KEY], request[-claim.KEY:]
        with self._lock:
            self._forget_old(now)
            held = self._tokens.get(token)
            if held is None:
                return None
            if held.request == request:
                return held.answer  # sent again: its answer was lost
            usable = held.request is None and now <= held.expires
            host = sender[0][len("::ffff:"):] if sender[0].startswith("::ffff:") else sender[0]
            astray = held.where is not None and host not in held.where  # (::ffff: a dual-stack socket's IPv4)
            if (astray or not usable) and held.refusals >= MAX_REFUSALS:
                return None  # before the key exchange: a flood of misuses costs a look-up each
            key = self._key(token, their_key)
            if key is None:
                return None  # not a usable public key
            aad = request[len(claim.REQUEST):]
            if usable and not astray:
                held.request, held.sender = request, sender
                held.answer = claim.seal(key, aad, claim.SECRET, self._secret)
                return held.answer
            held.refusals += 1
            if usable:  # from elsewhere: the token stays the worker's
                host = ", ".join(sorted(held.where))
                why, event = f"it came from {sender[0]}, not from the worker's host ({host})", \
                    ("launch_token_elsewhere", {"sender": sender[0], "host": host})
            elif held.request is not None:
                why, event = "it was used already", \
                    ("launch_token_reused", {"first": held.sender[0], "sender": sender[0]})
            else:
                why, event = "it expired", None
            first = event is not None and event[0] not in held.said
            if first:
                held.said.add(event[0])
        if first and self._say is not None:
            self._say(event[0], worker=held.worker, **event[1])
        return claim.seal(key, aad, claim.REFUSED, why.encode())

    def _key(self, token: bytes, their_key: bytes):
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey
        try:
            shared = self._keys()[0].exchange(X25519PublicKey.from_public_bytes(their_key))
        except ValueError:  # a low-order point: no shared secret
            return None
        return claim.session_key(shared, self.public, their_key, token)

    def _forget_old(self, now: float) -> None:
        # Oldest first: tokens are made in time order, each with the same lifetime.
        while self._tokens:
            token, held = next(iter(self._tokens.items()))
            if held.expires + KEEP >= now:
                return
            del self._tokens[token]

    def __len__(self):
        return len(self._tokens)
