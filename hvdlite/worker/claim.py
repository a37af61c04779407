"""How a worker whose launch crossed a network others can read gets the job's secret (torch-free).

srun's launch message and Ray's task specs are readable on the cluster's network, so such a
launch carries no secret: HVDLITE_CLAIM holds the driver's X25519 public key and a one-time
token instead. The worker makes an ephemeral X25519 key pair and sends the token with its public
key to the driver's port (one UDP datagram, as heartbeats); the driver marks the token used and
answers the secret sealed under a key only the two ends can derive: HKDF-SHA256 of the X25519
shared secret, bound to both public keys and the token, for ChaCha20-Poly1305. Someone reading
the wire sees the token, the public keys and a sealed answer: nothing that opens it, and a token
presented again is refused. Every answer, refusals too, is sealed, so a forged one is ignored.

The secret then lives in this process's environment, as a local launch's does: the worker's
own children (its stand-in process, anything it starts) inherit it.

The claim starts as the worker's process starts (`at_process_start`, from the sitecustomize every
worker runs first, hvdlite/torch/boot), in the background, not at hvd.init() seconds later: the
less time a token read off the wire stays unused, the less a thief has to use it first. The ticket
leaves the environment then, so nothing the worker starts meanwhile claims it again. Only the
launched worker claims: a template's spawn client, which forwards the worker's environment to
its host's template, never does, and a child the template forks claims as it becomes the worker
(`claim_now`); a forked process forgets its parent's claim (a token is used once).

request: b"hvC1" | token (16) | worker's public key (32)
answer:  b"hvA1" | nonce (12) | sealed(kind (1) | text), the request's token and key as AAD;
         kind 0: the secret, 1: why the driver refused
"""
import os
import socket
import sys
import threading
import time

from hvdlite import defaults
from hvdlite.worker import env

REQUEST, ANSWER = b"hvC1", b"hvA1"
TOKEN, KEY, NONCE = 16, 32, 12
REQUEST_SIZE = len(REQUEST) + TOKEN + KEY  # shorter than any heartbeat: the port tells them apart
SECRET, REFUSED = 0, 1
RESEND = 0.5  # seconds between sends of the request while no answer came
_lock = threading.Lock()  # one claim per process: a second one would find the token used
_early = None  # the claim this process started as it began (_Early), until it is waited for


class ClaimRefused(RuntimeError):
    """The driver refused this launch's token, or never answered; the message is one line."""


def job_secret(environ=os.environ) -> str:
    """The job's secret: from the environment, or claimed with its HVDLITE_CLAIM and kept there."""
    early = _early
    if early is not None and environ is os.environ:
        early.join(early.timeout + RESEND)
        if early.error is not None:
            raise early.error
    with _lock:
        secret = environ.get(env.SECRET)
        if secret:
            return secret
        ticket = environ.get(env.CLAIM)
        if not ticket:
            raise RuntimeError(f"hvdlite: {env.SECRET} is not set; start this script with `hvdlite run`")
        addr, port = _driver(environ)
        timeout = float(environ.get(env.START_TIMEOUT, defaults.START_TIMEOUT))
        secret = claim(addr, port, ticket, timeout)
        environ[env.SECRET] = secret
        del environ[env.CLAIM]  # used: it is worth nothing to this process's children
        return secret


def at_process_start() -> None:
    """The claim of a process that starts with a ticket, unless it is one of hvdlite's templates
    (`python -m hvdlite.template...`): they forward or fork the worker, which claims itself."""
    argv = getattr(sys, "orig_argv", ())
    template = any(flag == "-m" and (module + ".").startswith("hvdlite.template.")
                   for flag, module in zip(argv, argv[1:]))
    if not template:
        claim_now()


def claim_now() -> None:
    """Start claiming this process's secret in the background, if its environment holds a ticket."""
    global _early
    if os.environ.get(env.CLAIM) and not os.environ.get(env.SECRET):
        _early = _Early(os.environ)
        _early.start()


class _Early(threading.Thread):
    """A claim in the background; job_secret waits for it and raises what it failed with."""

    def __init__(self, environ):
        super().__init__(daemon=True, name="hvdlite-claim")
        self.environ, self.ticket = environ, environ.pop(env.CLAIM)
        self.timeout = float(environ.get(env.START_TIMEOUT, defaults.START_TIMEOUT))
        self.error = None

    def run(self):
        try:
            with _lock:
                self.environ[env.SECRET] = claim(*_driver(self.environ), self.ticket, self.timeout)
        except Exception as e:  # noqa: BLE001 - raised to whoever needs the secret (a missing package too)
            self.error = e


def _forget_in_child() -> None:
    global _early, _lock
    _early, _lock = None, threading.Lock()  # the parent's: its thread is not in this process


os.register_at_fork(after_in_child=_forget_in_child)


def _driver(environ):
    try:
        return environ[env.RENDEZVOUS_ADDR], int(environ[env.RENDEZVOUS_PORT])
    except (KeyError, ValueError):
        raise RuntimeError(f"hvdlite: {env.RENDEZVOUS_ADDR} or {env.RENDEZVOUS_PORT} is not set; "
                           "start this script with `hvdlite run`") from None


def parse_ticket(ticket: str):
    """(driver's public key, token) from HVDLITE_CLAIM's "KEY:TOKEN" (hex)."""
    try:
        key, token = (bytes.fromhex(part) for part in ticket.split(":"))
    except ValueError:
        key = token = b""
    if len(key) != KEY or len(token) != TOKEN:
        raise ClaimRefused(f"hvdlite: {env.CLAIM} is malformed; start this script with `hvdlite run`")
    return key, token


def ticket(driver_key: bytes, token: bytes) -> str:
    return f"{driver_key.hex()}:{token.hex()}"


def session_key(shared: bytes, driver_key: bytes, worker_key: bytes, token: bytes) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    return HKDF(hashes.SHA256(), 32, salt=None,
                info=b"hvdlite launch claim v1" + driver_key + worker_key + token).derive(shared)


def seal(key: bytes, aad: bytes, kind: int, text: bytes) -> bytes:
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
    nonce = os.urandom(NONCE)
    return ANSWER + nonce + ChaCha20Poly1305(key).encrypt(nonce, bytes([kind]) + text, aad)


def opened(key: bytes, aad: bytes, datagram: bytes):
    """(kind, text) of an answer sealed with `key` for the request `aad`, or None."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
    if not datagram.startswith(ANSWER) or len(datagram) < len(ANSWER) + NONCE + 17:
        return None
    nonce, sealed = datagram[len(ANSWER):len(ANSWER) + NONCE], datagram[len(ANSWER) + NONCE:]
    try:
        plain = ChaCha20Poly1305(key).decrypt(nonce, sealed, aad)
    except InvalidTag:
        return None
    return plain[0], plain[1:]


def claim(addr: str, port: int, ticket_text: str, timeout: float) -> str:
    """Claim the secret from the driver at addr:port; ClaimRefused with why if that fails."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
    driver_key, token = parse_ticket(ticket_text)
    mine = X25519PrivateKey.generate()
    my_key = mine.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    try:
        shared = mine.exchange(X25519PublicKey.from_public_bytes(driver_key))
    except ValueError:  # a low-order point: no driver's key
        raise ClaimRefused(f"hvdlite: {env.CLAIM} holds no usable key; start this script with `hvdlite run`") from None
    key = session_key(shared, driver_key, my_key, token)
    request = REQUEST + token + my_key
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((addr, port))
        while time.monotonic() < deadline:
            try:
                sock.send(request)
                sock.settimeout(min(RESEND, max(0.01, deadline - time.monotonic())))
                answer = opened(key, request[len(REQUEST):], sock.recv(512))
            except socket.timeout:  # lost on the way: sent again
                continue
            except OSError:  # nothing listens there (yet): ICMP said so at once
                time.sleep(RESEND)
                continue
            if answer is None:  # not the driver's, or not for this request
                continue
            kind, text = answer
            if kind == SECRET:
                return text.decode("utf-8")
            raise ClaimRefused(f"hvdlite: the driver refused this worker's launch token: {text.decode('utf-8', 'replace')}")
    raise ClaimRefused(f"hvdlite: no answer from the driver at {addr}:{port} to this worker's launch token "
                       f"within {timeout:g} s")
