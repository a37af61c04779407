"""A worker's rendezvous wait and reports, end to end: a real KV server with the driver's
rendezvous endpoints, a real worker session; the test plays the decision thread."""
import queue
import signal
import threading

import pytest

from hvdlite.driver.decisions.messages import LoadFailed, Ready, WriteFailed
from hvdlite.driver.kv.server import KVServer
from hvdlite.driver.rendezvous import Rendezvous
from hvdlite.worker import env
from hvdlite.worker.session import Session
from hvdlite.worker.world import WorldInfo

SECRET = "rendezvous-wait-test-secret"
WORLD = WorldInfo(0, 1, 0, 1, 0, 1, "localhost", round=1)


@pytest.fixture
def driver():
    """(events the endpoints posted, the Rendezvous, a Session of worker w#1), with the
    server's long-poll cap at 0.5 s so that a wait spans many requests."""
    events = queue.Queue()
    rendezvous = Rendezvous(events.put)
    server = KVServer(SECRET, max_wait=0.5)
    server.add_route("/rdzv/", rendezvous.route)
    server.set_heartbeat(rendezvous.heartbeat)
    server.start()
    host, port = server.address
    # The session's heartbeat thread outlives the test: a liveness timeout it never reaches, or
    # it would end this pytest process (os._exit) once the server is gone. It also handles
    # SIGTERM and SIGUSR1 as a worker does: pytest's own handlers come back after the test.
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    session = Session({env.RENDEZVOUS_ADDR: host, env.RENDEZVOUS_PORT: str(port), env.SECRET: SECRET,
                       env.WORKER: "w#1", env.ELASTIC: "1", env.LIVENESS_TIMEOUT: "1e9",
                       # what workers once gave up after, of their own accord: no longer read
                       "HVDLITE_ELASTIC_TIMEOUT": "1"})
    try:
        yield events, rendezvous, session
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        rendezvous.close()
        server.stop()


def test_a_wait_past_the_elastic_timeout_and_many_long_polls_goes_on_until_the_driver_answers(driver):
    events, rendezvous, session = driver
    outcome = {}

    def wait():
        try:
            outcome["world"] = session.assignment(after_round=None, commit=3)
        except BaseException as e:  # noqa: BLE001 - the test reports it
            outcome["error"] = e
    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    assert events.get(timeout=10) == Ready("w#1", -1, 3)
    waiter.join(4.0)  # 4 x the old limit, 8 long-polls
    assert waiter.is_alive(), f"the worker gave up waiting by itself: {outcome}"
    rendezvous.answer("w#1", 200, {"world": WORLD.to_dict(), "hosts": ["localhost"]})
    waiter.join(10)
    assert outcome == {"world": WORLD}


@pytest.mark.parametrize("endpoint, said, event", [
    ("load_failed", b"ckpt/commit-7.pt: no class\nNet", LoadFailed("w#1", "ckpt/commit-7.pt: no class Net")),
    ("write_failed", b"could not write checkpoint 1\nto /ckpt",
     WriteFailed("w#1", "could not write checkpoint 1 to /ckpt")),
])
def test_a_checkpoint_that_does_not_load_or_could_not_be_written_is_reported_on_one_line(driver, endpoint, said, event):
    events, _, session = driver
    status, _ = session.client.request("PUT", f"/rdzv/{endpoint}", said, query={"worker": "w#1"})
    assert status == 200
    assert events.get(timeout=10) == event
