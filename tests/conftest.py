import os
import shutil
import tempfile

import pytest

import kepttemplates

# Modules that must not run at once in parallel workers (`-n N --dist loadgroup`): each starts a
# Ray cluster of ~2 GB whose raylets need the CPU to register in time on a 2-core machine.
# Modules sharing the one etcd test cluster (the `etcd_cluster` fixture) share a worker too.
GROUPS = {"test_ray": "ray", "test_ray_api": "ray", "test_gpu_launch": "ray",
          "test_store": "etcd", "test_standby": "etcd"}


# The suite is CPU-bound, and most of a local job's CPU is its workers' `import torch`: the
# session keeps its templates warm in a folder of its own (`--keep-warm`, docs/internals.md; the
# xdist workers inherit the controller's), so that a job forks its local workers from the last
# one's template. A test whose proof hangs
# on how a plain job starts its workers is marked `plain_start`.
KEEP_WARM = "600"


def pytest_configure(config):
    config.addinivalue_line("markers", "plain_start(reason): this test's jobs start as plain jobs "
                                       "do, without a kept template")
    if "HVDLITE_KEEP_WARM" not in os.environ:
        # Short: a unix socket's path has 107 bytes at most.
        os.environ["XDG_RUNTIME_DIR"] = config._warm_dir = tempfile.mkdtemp(prefix="hvw-")
        os.environ["HVDLITE_KEEP_WARM"] = KEEP_WARM


def pytest_unconfigure(config):
    folder = getattr(config, "_warm_dir", None)
    if folder:
        kepttemplates.end(os.path.join(folder, "*", "warm-*.log"))
        shutil.rmtree(folder, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A plain_start test (or module) runs without HVDLITE_KEEP_WARM, its module's fixtures too."""
    plain = item.get_closest_marker("plain_start") is not None
    warm = os.environ.pop("HVDLITE_KEEP_WARM", None) if plain else None
    try:
        yield
    finally:
        if warm is not None:
            os.environ["HVDLITE_KEEP_WARM"] = warm


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks
def pytest_collection_modifyitems(config, items):
    """Under `--dist loadgroup` a module stays on one worker (its module-scoped clusters and
    servers start once), as with loadfile; modules of one GROUPS entry share a worker."""
    if not getattr(config.option, "loadgroup", False):  # set by xdist, on its workers too
        return
    for item in items:
        if not any(item.iter_markers("xdist_group")):
            module = _module(item)
            item.add_marker(pytest.mark.xdist_group(GROUPS.get(module, module)))


def _module(item):
    return item.nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")


@pytest.fixture(autouse=True)
def _worker_settings_stay_in_workers():
    """hvdlite.torch.gloo.connect turns torch's flight recorder off in the process that calls
    it, a worker's: called here, it would reach every process a later test starts, and
    torchrun's own ranks then abort now and then at exit (torch 2.13, test_torchrun)."""
    import sys
    before = dict(os.environ)
    yield
    gloo = sys.modules.get("hvdlite.torch.gloo")
    changed = {name: os.environ.get(name) for name in (gloo.FLIGHT_RECORDER if gloo else ())
               if os.environ.get(name) != before.get(name)}
    assert not changed, f"this test set {changed} in the test process's environment"


@pytest.fixture(scope="module")
def server(request):
    """A KV server shared by a module (each test uses its own scopes; stopping one takes
    ~0.1 s), with the module's SECRET."""
    from hvdlite.driver.kv.server import KVServer
    srv = KVServer(request.module.SECRET)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def ssh_hosts():
    """Factory of real sshd test hosts (tests/sshhosts.py): `hosts = ssh_hosts(3)`.

    Each call starts a new group host-1..host-N (own namespaces, bridge, keys, ssh_config);
    every group is torn down at the end of the session, or earlier by `hosts.close()`.
    Skips when sshd is not installed. HVDLITE_TEST_SSH_LOOPBACK=1 forces the 127.x fallback."""
    from sshhosts import TestHosts, missing_tools
    reason = missing_tools()
    if reason:
        pytest.skip(reason)
    groups = []

    def make(count: int = 2, **options):
        options.setdefault("force_loopback", os.environ.get("HVDLITE_TEST_SSH_LOOPBACK") == "1")
        group = TestHosts(count, **options)
        groups.append(group)
        return group

    yield make
    for group in groups:
        group.close()


@pytest.fixture(scope="session")
def etcd_cluster(ssh_hosts):
    """A three-member etcd cluster (tests/etcdcluster.py) on host-1..host-3 of five namespace
    test hosts, shared by every test of the session; host-4 and host-5 are free for drivers.
    Skips without root, etcd or network namespaces."""
    from etcdcluster import EtcdCluster, missing
    reason = missing()
    if reason:
        pytest.skip(reason)
    hosts = ssh_hosts(5)
    if hosts.mode != "netns":
        pytest.skip(f"the etcd test cluster needs namespace hosts: {hosts.fallback_reason}")
    cluster = EtcdCluster(hosts)
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def ray_cluster(request):
    """A real Ray cluster (tests/raycluster.py) shared by a module: a head and
    `RAY_NODES` (module attribute, default 3) one-CPU nodes in namespaces, torn down by pid when
    the module ends, also when a test failed. Skips without root or without ray."""
    from raycluster import RayCluster, missing
    reason = missing()
    if reason:
        pytest.skip(reason)
    cluster = RayCluster(getattr(request.module, "RAY_NODES", 3))
    try:
        yield cluster
    finally:
        cluster.close()
