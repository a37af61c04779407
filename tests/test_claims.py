"""The one-time claim of the job's secret by workers launched over a network others read (srun,
Ray): the driver's end alone (tokens used once, expiring, answers only their sender opens), a
real exchange over the KV server's port, a worker on the pygloo venv's Python claiming it, and
what the srun and Ray launchers are handed. The captures on real clusters are in test_slurm.py
and test_ray.py."""
import hashlib
import os
import queue
import subprocess
import sys

import pytest

from hvdlite.driver.claims import KEEP, MAX_REFUSALS, Claims
from hvdlite.driver.executor import Executor
from hvdlite.driver.kv.server import KVServer
from hvdlite.driver.launchers import Launchers
from hvdlite.driver.settings import Settings
from hvdlite.worker import claim, env
from hvdlite.worker.claim import ClaimRefused, job_secret

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYGLOO = os.path.join(ROOT, ".venv-pygloo", "bin", "python")
SECRET = "claims-test-secret-0123456789abcdefghijklmnopq"


class Said(list):
    def __call__(self, event, **fields):
        self.append((event, fields))


def raw(key) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def request_for(sealed_env):
    """What a worker sends for its claim: (request, the key only it and the driver derive)."""
    driver_key, token = claim.parse_ticket(sealed_env[env.CLAIM])
    mine = X25519PrivateKey.generate()
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey
    key = claim.session_key(mine.exchange(X25519PublicKey.from_public_bytes(driver_key)),
                            driver_key, raw(mine), token)
    return claim.REQUEST + token + raw(mine), key


def opened(key, request, answer):
    return claim.opened(key, request[len(claim.REQUEST):], answer)


def test_a_sealed_launch_carries_a_claim_and_no_secret():
    claims = Claims(SECRET, 30.0)
    sealed = claims.sealed({env.SECRET: SECRET, "OTHER": "x"}, "n1/0#1", 0.0)
    assert env.SECRET not in sealed and sealed["OTHER"] == "x"
    assert SECRET not in repr(sealed)
    driver_key, token = claim.parse_ticket(sealed[env.CLAIM])
    assert driver_key == claims.public and len(token) == claim.TOKEN
    assert env.CLAIM in env.IDENTITY  # never inherited by a job started from a worker


def test_a_token_opens_once_and_a_second_use_is_refused_and_said():
    said = Said()
    claims = Claims(SECRET, 30.0, said)
    sealed = claims.sealed({}, "n1/0#1", 0.0)
    request, key = request_for(sealed)
    answer = claims.answer(request, ("10.0.0.11", 4000), 1.0)
    assert opened(key, request, answer) == (claim.SECRET, SECRET.encode())
    assert SECRET.encode() not in answer
    # The same request again (its answer was lost) gets the same answer, said nowhere.
    assert claims.answer(request, ("10.0.0.11", 4000), 2.0) == answer and not said
    # Anyone else with the token (read off the wire) is refused, and the driver says it once.
    thief, thief_key = request_for(sealed)
    assert opened(thief_key, thief, claims.answer(thief, ("10.0.0.99", 5000), 3.0)) == \
        (claim.REFUSED, b"it was used already")
    again, again_key = request_for(sealed)
    assert opened(again_key, again, claims.answer(again, ("10.0.0.99", 5001), 3.0))[0] == claim.REFUSED
    # Both addresses: the first claim's (which got the secret) and the second's.
    assert said == [("launch_token_reused", {"worker": "n1/0#1", "first": "10.0.0.11", "sender": "10.0.0.99"})]
    # Misuses past the cap go unanswered: a flood with a read token costs no key exchange
    # (before: one per datagram, ~160 us each on the server's thread).
    exchanges = []
    real_key = claims._key
    claims._key = lambda *args: exchanges.append(1) or real_key(*args)
    flood = [request_for(sealed)[0] for _ in range(MAX_REFUSALS + 200)]
    for i, datagram in enumerate(flood):
        claims.answer(datagram, ("10.0.0.99", 6000 + i), 4.0)
    assert claims.answer(flood[-1], ("10.0.0.99", 7000), 4.0) is None
    assert len(exchanges) <= MAX_REFUSALS


def test_an_answer_opens_only_with_the_drivers_key():
    claims = Claims(SECRET, 30.0)
    sealed = claims.sealed({}, "n1/0#1", 0.0)
    # A worker told another public key (a forged launch, or a forged answer's key) opens nothing.
    forged = dict(sealed, **{env.CLAIM: claim.ticket(raw(X25519PrivateKey.generate()),
                                                      claim.parse_ticket(sealed[env.CLAIM])[1])})
    request, wrong_key = request_for(forged)
    answer = claims.answer(request, ("10.0.0.11", 4000), 1.0)
    assert answer is not None and opened(wrong_key, request, answer) is None
    # An answer for another request does not open either.
    other, other_key = request_for(claims.sealed({}, "n2/0#1", 0.0))
    assert opened(other_key, other, answer) is None


def test_tokens_expire_and_unknown_ones_get_no_answer():
    claims = Claims(SECRET, 30.0)
    sealed = claims.sealed({}, "n1/0#1", 0.0)
    request, key = request_for(sealed)
    assert opened(key, request, claims.answer(request, ("h", 1), 30.5)) == (claim.REFUSED, b"it expired")
    stranger = claim.REQUEST + os.urandom(claim.TOKEN) + raw(X25519PrivateKey.generate())
    assert claims.answer(stranger, ("h", 1), 31.0) is None
    assert claims.answer(request[:-1], ("h", 1), 31.0) is None  # not a claim's size
    assert claims.answer(claim.REQUEST[:3] + b"x" + request[4:], ("h", 1), 31.0) is None
    assert claims.answer(request[:-32] + bytes(32), ("h", 1), 31.0) is None  # a low-order key
    claims.sealed({}, "n1/0#2", 31.0 + KEEP)  # long after: forgotten
    assert len(claims) == 1 and claims.answer(request, ("h", 1), 31.0 + KEEP) is None


@pytest.fixture
def driver():
    said = Said()
    claims = Claims(SECRET, 30.0, said)
    server = KVServer(SECRET)
    server.set_claims(claims)
    server.start()
    yield server, claims, said
    server.stop()


def worker_environ(server, sealed):
    return {**sealed, env.RENDEZVOUS_ADDR: server.address[0], env.RENDEZVOUS_PORT: str(server.address[1])}


def test_a_worker_claims_the_secret_over_the_port_and_keeps_it(driver):
    import time
    server, claims, said = driver
    environ = worker_environ(server, claims.sealed({}, "n1/0#1", time.monotonic()))
    assert job_secret(environ) == SECRET
    assert environ[env.SECRET] == SECRET and env.CLAIM not in environ  # its children inherit it
    assert job_secret(environ) == SECRET and not said  # kept: not claimed twice


def test_a_replayed_token_is_refused_in_one_line_at_the_worker(driver):
    import time
    server, claims, said = driver
    sealed = claims.sealed({}, "n1/0#1", time.monotonic())
    assert job_secret(worker_environ(server, sealed)) == SECRET
    with pytest.raises(ClaimRefused) as refused:
        job_secret(worker_environ(server, sealed))
    assert str(refused.value) == "hvdlite: the driver refused this worker's launch token: it was used already"
    assert [(event, fields["worker"]) for event, fields in said] == [("launch_token_reused", "n1/0#1")]


def test_no_answer_is_one_line_within_the_start_timeout(driver):
    server, claims, _ = driver
    unknown = claim.ticket(claims.public, os.urandom(claim.TOKEN))
    environ = worker_environ(server, {env.CLAIM: unknown, env.START_TIMEOUT: "1"})
    with pytest.raises(ClaimRefused, match=r"^hvdlite: no answer from the driver at .* within 1 s$"):
        job_secret(environ)
    with pytest.raises(ClaimRefused, match="HVDLITE_CLAIM is malformed"):
        job_secret(dict(environ, **{env.CLAIM: "zz:zz"}))
    with pytest.raises(ClaimRefused, match="HVDLITE_CLAIM holds no usable key"):
        job_secret(dict(environ, **{env.CLAIM: claim.ticket(bytes(32), os.urandom(claim.TOKEN))}))
    with pytest.raises(RuntimeError, match="HVDLITE_SECRET is not set"):
        job_secret({})


def test_a_claim_from_elsewhere_than_the_workers_host_is_refused_naming_both(driver):
    """Before: any address that held the token got the secret."""
    import time
    server, claims, said = driver
    elsewhere = claims.sealed({}, "n1/0#1", time.monotonic(), frozenset({"192.0.2.7"}))
    with pytest.raises(ClaimRefused) as refused:  # a real claim, from 127.0.0.1
        job_secret(worker_environ(server, elsewhere))
    assert str(refused.value) == ("hvdlite: the driver refused this worker's launch token: "
                                  "it came from 127.0.0.1, not from the worker's host (192.0.2.7)")
    assert said == [("launch_token_elsewhere", {"worker": "n1/0#1", "sender": "127.0.0.1", "host": "192.0.2.7"})]
    # The token is still the worker's: its own claim, from its host, gets the secret.
    request, key = request_for(elsewhere)
    assert opened(key, request, claims.answer(request, ("::ffff:192.0.2.7", 4000), time.monotonic())) == \
        (claim.SECRET, SECRET.encode())  # (as a dual-stack socket sees an IPv4 worker)
    # Where the launcher names the host's address, its worker's claim is answered as before.
    assert job_secret(worker_environ(server, claims.sealed({}, "n2/0#1", time.monotonic(),
                                                           frozenset({"127.0.0.1"})))) == SECRET
    assert len(said) == 1


@pytest.mark.skipif(not os.path.exists(PYGLOO), reason=f"no pygloo venv at {PYGLOO} (.ci/setup.sh)")
def test_a_numpy_backend_worker_claims_on_the_pygloo_venvs_python(driver):
    """The numpy backend's workers run on the venv's Python 3.10: what the claim imports is there."""
    import time
    server, claims, _ = driver
    environ = {**os.environ, **worker_environ(server, claims.sealed({}, "n1/0#1", time.monotonic())),
               "PYTHONPATH": ROOT}
    environ.pop(env.SECRET, None)
    code = ("import hashlib, os, sys; from hvdlite.worker.objects import _job_key; _job_key(); "
            "print(sys.version_info[:2], hashlib.sha256(os.environ['HVDLITE_SECRET'].encode()).hexdigest())")
    out = subprocess.run([PYGLOO, "-c", code], env=environ, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split(None, 2)[-1].strip() == hashlib.sha256(SECRET.encode()).hexdigest()


class _Launched(Exception):
    pass


@pytest.mark.parametrize("kind, private", [("local", True), ("ssh", True), ("srun", False), ("ray", False)])
def test_only_launches_over_a_readable_network_are_sealed(kind, private, monkeypatch):
    """The executor hands srun and Ray a claim, local and SSH launches the secret as before."""
    from hvdlite.driver.decisions.messages import Launch, LaunchFailed
    from hvdlite.driver.launchers import _load
    assert _load(kind).private is private
    settings = Settings(command=[sys.executable, "-c", "pass"], launcher=kind)
    launchers = Launchers(settings)
    launcher = type("Stub", (), {"private": private, "is_local": lambda self, h: False,
                                 "route_to": lambda self, h: "10.0.0.1",
                                 "claims_from": lambda self, h: frozenset({"10.0.0.5"})})()
    monkeypatch.setattr(launchers, "for_host", lambda host: launcher)
    handed = []

    def launch(host, env_, *rest):
        handed.append(env_)
        raise _Launched
    monkeypatch.setattr(launchers, "launch", launch)
    assert launchers.private("n1") is private
    server = type("Server", (), {"address": ("10.0.0.1", 4000)})()
    posted = queue.Queue()
    claims = Claims(SECRET, 30.0)
    executor = Executor(settings, None, launchers, server, None, SECRET, posted.put, claims=claims)
    executor.apply([Launch(worker="n1/0#1", slot="n1/0", host="n1", world=None, slots_on_host=1)])
    assert isinstance(posted.get(timeout=10), LaunchFailed)  # the stub's launch, once it was handed
    (got,) = handed
    assert (got.get(env.SECRET) == SECRET) is private and (env.CLAIM in got) is not private
    # A sealed launch's token answers only claims from where the launcher says its host is.
    assert [held.where for held in claims._tokens.values()] == ([] if private else [frozenset({"10.0.0.5"})])


def test_a_claim_that_fails_on_the_server_costs_no_heartbeat():
    """The claims share the heartbeats' socket and thread: a bug in one answers nothing, and
    the heartbeats go on."""
    from hvdlite.worker.kvclient import Heartbeats, KVClient

    class Broken:
        def answer(self, *args):
            raise RuntimeError("planted")
    server = KVServer(SECRET)
    server.set_claims(Broken())
    server.set_heartbeat(lambda beats: b"heard")
    server.start()
    try:
        environ = worker_environ(server, {env.CLAIM: claim.ticket(raw(X25519PrivateKey.generate()),
                                                                  os.urandom(claim.TOKEN)),
                                          env.START_TIMEOUT: "0.3"})
        with pytest.raises(ClaimRefused, match="no answer"):
            job_secret(environ)
        beats = Heartbeats(KVClient(*server.address, SECRET), timeout=2.0)
        assert beats.beat("n1/0#1") == b"heard"
        beats.close()
    finally:
        server.stop()



BOOT = os.path.join(ROOT, "hvdlite", "torch", "boot")  # first on every worker's path (torchrunenv.py)
# A worker that never imports hvdlite: it waits for the secret the claim puts in its environment;
# a child it forks at once, while the claim is under way, neither hangs on it nor claims again.
WAITS = f"""import os, sys, time
child = os.fork()
if child == 0:
    import signal
    signal.alarm(10)
    from hvdlite.worker.claim import job_secret
    try:
        job_secret()
    except RuntimeError:
        pass
    os._exit(0)
deadline = time.monotonic() + 10
while not os.environ.get('HVDLITE_SECRET') and time.monotonic() < deadline:
    time.sleep(0.01)
print(os.environ.get('HVDLITE_SECRET') == {SECRET!r}, 'HVDLITE_CLAIM' in os.environ, os.waitpid(child, 0)[1])
"""


def launched(server, claims, worker):
    """The environment a worker launched over a readable network starts with."""
    import time
    environ = {**os.environ, **worker_environ(server, claims.sealed({}, worker, time.monotonic())),
               "PYTHONPATH": os.pathsep.join([BOOT, ROOT])}
    environ.pop(env.SECRET, None)
    return environ


def test_a_worker_claims_as_its_process_starts_not_at_init(driver, tmp_path):
    """Before: the claim waited for hvd.init(), seconds after the process started: the window
    in which a token read off the wire could be used first."""
    server, claims, said = driver
    done = subprocess.run([sys.executable, "-c", WAITS], capture_output=True, text=True, timeout=60,
                          env=launched(server, claims, "n1/0#1"))
    assert done.stdout.split() == ["True", "False", "0"], done.stdout + done.stderr[-2000:]
    (token,) = claims._tokens.values()
    assert token.request is not None and not said


def test_a_worker_forked_from_its_nodes_template_claims_its_own_token(driver, tmp_path):
    """As on a Ray node: a spawn client, started with the worker's environment, has the node's
    template fork the worker. Before (the claim at `import hvdlite`), the spawn client claimed
    the token and its worker was refused: 'it was used already'. A template whose environment
    holds a claim refuses to serve, in one line."""
    from hvdlite.driver.launchers.hosttemplates import template_argv
    from hvdlite.driver.launchers.raytemplate import NodeTemplate
    from hvdlite.driver.launchers.start import spawn_argv
    from hvdlite.driver.launchers.template import template_env
    server, claims, said = driver
    environ = launched(server, claims, "n1/0#1")
    keepers = [NodeTemplate(), NodeTemplate()]
    try:
        ready = keepers[0].start(template_argv([sys.executable], []), template_env(environ), str(tmp_path), 60)
        assert ready["op"] == "ready", ready
        (tmp_path / "waits.py").write_text(WAITS)
        done = subprocess.run(spawn_argv([sys.executable, str(tmp_path / "waits.py")], ready["socket"]),
                              env=environ, cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
        lines = done.stdout.splitlines()
        assert lines[0].endswith(" template"), done.stdout + done.stderr[-2000:]  # forked, not plain
        assert lines[1].split() == ["True", "False", "0"], done.stdout + done.stderr[-2000:]
        assert not said
        wrong = keepers[1].start(template_argv([sys.executable], []), environ, str(tmp_path), 60)
        assert wrong == {"op": "unusable", "reason": "the template's environment holds a launch's HVDLITE_CLAIM"}
    finally:
        for keeper in keepers:
            if keeper.proc is not None and keeper.proc.poll() is None:
                keeper.proc.kill()
