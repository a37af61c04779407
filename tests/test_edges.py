"""The driver's edges: discovery runs, its polling thread, where the rendezvous binds, and the
Python versions the code must run on."""
import ast
import os
import time

import pytest

from hvdlite.discovery.script import DiscoveryError, discover
from hvdlite.driver.decisions.messages import DiscoveryFailed, HostsFound
from hvdlite.driver.network import ANY, LOOPBACK, advertised_address, bind_address

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "hvdlite")


def test_a_child_the_script_leaves_behind_does_not_hold_discovery():
    start = time.monotonic()
    assert discover("echo a:1; sleep 30 &", timeout=10) == [("a", 1)]
    assert time.monotonic() - start < 5


def test_a_script_that_hangs_is_killed_and_reported():
    with pytest.raises(DiscoveryError, match="timed out after 0.5 s"):
        discover("sleep 30", timeout=0.5)


class BrokenSource:
    """A host source whose read fails in a way nobody planned for, then recovers."""
    changes = True

    def __init__(self):
        self.calls = 0

    def read(self):
        self.calls += 1
        if self.calls == 1:
            raise KeyError("surprise")
        return [("a", 1)]


def test_the_discovery_thread_survives_an_unexpected_error():
    from hvdlite.driver.job import Job
    from hvdlite.driver.settings import Settings
    from hvdlite.driver.eventlog import EventLog
    job = Job(Settings(command=["true"], discovery_interval=0.05), EventLog(on_console=False))
    import threading
    thread = threading.Thread(target=job._poll_hosts, args=(BrokenSource(),), daemon=True)
    thread.start()
    try:
        first = job.events.get(timeout=5)
        second = job.events.get(timeout=5)
    finally:
        job.stopping.set()
        thread.join(5)
    assert isinstance(first, DiscoveryFailed) and "KeyError" in first.error
    assert second == HostsFound((("a", 1),))


def test_rendezvous_binds_where_later_hosts_can_reach_it():
    assert bind_address(None, None, remote_possible=False) == LOOPBACK
    assert bind_address(None, None, remote_possible=True) == ANY  # a discovery job
    assert bind_address("10.1.2.3", None, True) == "10.1.2.3"
    assert bind_address(None, ["nonexistent0", "lo"], True) == "127.0.0.1"
    assert advertised_address(ANY, True, lambda: "10.0.0.1") == LOOPBACK
    assert advertised_address(ANY, False, lambda: "10.0.0.1") == "10.0.0.1"
    assert advertised_address("10.1.2.3", True, lambda: "x") == "10.1.2.3"


def _calls_to(tree, names):
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in names]


def test_no_python_3_9_only_calls():
    # pyproject says Python >= 3.8 (the numpy backend's pygloo wheels start there).
    found = []
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path) as f:
                    tree = ast.parse(f.read())
                found += [f"{path}:{line}" for line in _calls_to(tree, {"removeprefix", "removesuffix"})]
    assert not found


def _import_statements(path):
    """(module, names) of every import in the file: names None for `import module`."""
    with open(path) as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((a.name, None) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module, [a.name for a in node.names]


def _imports(path):
    return {module for module, _ in _import_statements(path) if module.startswith("hvdlite")}


FORBIDDEN = {  # package -> what it must never import: data flows cli -> driver -> launchers
    "worker": ("hvdlite.driver", "hvdlite.cli", "hvdlite.discovery", "hvdlite.torch", "hvdlite.numpy"),
    "torch": ("hvdlite.driver", "hvdlite.cli", "hvdlite.numpy"),
    "numpy": ("hvdlite.driver", "hvdlite.cli", "hvdlite.torch"),
    "discovery": ("hvdlite.driver", "hvdlite.cli"),
    "slurm": ("hvdlite.driver", "hvdlite.cli", "hvdlite.torch", "hvdlite.numpy"),
    "template": ("hvdlite.driver", "hvdlite.cli", "hvdlite.discovery"),  # runs as the worker's python
    "driver": ("hvdlite.cli", "hvdlite.torch", "hvdlite.numpy"),
    "driver/decisions": ("hvdlite.driver.executor", "hvdlite.driver.job", "hvdlite.driver.launchers",
                         "hvdlite.driver.rendezvous", "hvdlite.driver.kv"),  # the KV server's folder
    "driver/launchers": ("hvdlite.driver.decisions", "hvdlite.driver.executor", "hvdlite.driver.job"),
    "ray": ("hvdlite.cli", "hvdlite.torch", "hvdlite.numpy"),  # RayExecutor drives a job: driver -> ray
}
# Code that runs inside Ray's processes or the workers on the nodes: no driver, and no ray.
NODE_SIDE = {"driver/launchers/rayslot.py": ("hvdlite.template.spawn", "hvdlite.procstat", "hvdlite.worker.gpus"),
             "driver/launchers/raytemplate.py": ("hvdlite.template", "hvdlite.driver.launchers.rayslot"),
             "ray/worker.py": ("hvdlite.worker",)}


@pytest.mark.parametrize("path", sorted(NODE_SIDE))
def test_what_runs_on_ray_nodes_imports_little(path):
    found = _imports(os.path.join(ROOT, path))
    assert all(m.startswith(NODE_SIDE[path]) for m in found), found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_flow_one_way(package):
    bad = []
    for folder, _, files in os.walk(os.path.join(ROOT, package)):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                bad += [f"{path}: {m}" for m in _imports(path) if m.startswith(FORBIDDEN[package])]
    assert not bad


def _module_graph():
    """Every hvdlite module -> the hvdlite modules it imports, anywhere in it (a late import
    inside a function too)."""
    modules = {}
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                modules[dotted[:-len(".__init__")] if dotted.endswith(".__init__") else dotted] = path

    def module_of(name):  # `from package import module` names a module, `from module import f` not
        while name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for module, path in modules.items():
        names = {f"{imported}.{name}" if names else imported
                 for imported, names in _import_statements(path) for name in names or [None]}
        graph[module] = {module_of(name) for name in names if name.startswith("hvdlite.")} - {module}
    return graph


def _reachable(graph, start):
    seen, todo = set(), list(graph[start])
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += graph[module]
    return seen


def test_no_module_imports_itself_through_others():
    # worker/durable and worker/session, numpy/basics and numpy/ops imported each other, each
    # pair with one import hidden in a function
    graph = _module_graph()
    assert not sorted(module for module in graph if module in _reachable(graph, module))


def test_the_kv_server_knows_nothing_of_jobs():
    """driver/kv/ serves signed keys, long-polls and heartbeats; the job's routes are added
    from outside (rendezvous.py)."""
    allowed = ("hvdlite.driver.kv.", "hvdlite.driver.descriptors", "hvdlite.worker.kvproto",
               "hvdlite.worker.claim")
    parts = {module: imported for module, imported in _module_graph().items()
             if module.startswith("hvdlite.driver.kv.")}
    assert "hvdlite.driver.kv.server" in parts
    assert {module: sorted(imported) for module, imported in parts.items()
            if not all(name.startswith(allowed) for name in imported)} == {}
