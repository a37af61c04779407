"""The launcher interface: every kind is picked by name or by host, and every handle has the
same face (base.Handle)."""
import inspect
import signal
import sys

from hvdlite.driver.launchers import KINDS, Launchers, _load
from hvdlite.driver.launchers.base import Handle, Launcher
from hvdlite.driver.launchers.process import LocalWorker
from hvdlite.driver.launchers.ssh.remote import RemoteWorker
from hvdlite.driver.launchers.template import TemplateWorker
from hvdlite.driver.output import RankOutput
from hvdlite.driver.settings import Settings

UNREACHABLE = "192.0.2.1"  # TEST-NET-1: never this machine


def _faces(protocol):
    return {name for name, _ in inspect.getmembers(protocol) if not name.startswith("_")} | \
        set(protocol.__annotations__)


def test_every_handle_and_launcher_has_the_whole_face():
    for cls in (LocalWorker, TemplateWorker, RemoteWorker):
        missing = {name for name in _faces(Handle) if not hasattr(cls, name)}
        assert not missing, f"{cls.__name__} lacks {missing}"
    for kind in KINDS:
        missing = {name for name in _faces(Launcher) if not hasattr(_load(kind), name)}
        assert not missing, f"{kind} lacks {missing}"


def test_hosts_pick_their_launcher_unless_one_is_named():
    auto = Launchers(Settings(command=["true"]))
    assert type(auto.for_host("localhost")).__name__ == "LocalLauncher"
    assert type(auto.for_host(UNREACHABLE)).__name__ == "SSHLauncher"
    forced = Launchers(Settings(command=["true"], launcher="local"))
    assert type(forced.for_host(UNREACHABLE)).__name__ == "LocalLauncher"
    auto.close(), forced.close()


def test_a_local_launch_is_a_handle_that_stops_its_group():
    launchers = Launchers(Settings(command=[sys.executable, "-c", "import time; time.sleep(60)"]))
    try:
        handle = launchers.launch("localhost", {}, RankOutput("0"), joining=False)
        assert handle.poll() is None and handle.started == "process"
        handle.signal(signal.SIGKILL)
        assert handle.wait(10) == -signal.SIGKILL
        handle.stop(0.1)
    finally:
        launchers.close()
