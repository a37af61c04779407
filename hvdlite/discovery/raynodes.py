"""Hosts from a Ray cluster: the alive nodes of `ray.nodes()`, each keyed by its NodeID.

Several Ray nodes may share one IP (containers, `ray.cluster_utils.Cluster`), so the NodeID,
not the address, names a host. A node's slots come from its CPUs and GPUs (`--cpus-per-slot`,
`--gpus-per-slot`) or from a named resource. Ray says how a node left: a drain (autoscaler idle
or preemption, or an operator's `ray stop`) is no failure, an unexpected death is one; the
elastic core hears both (HostsFound.drained / .failed). `ray` is imported only here and in the
Ray launcher, so that hvdlite runs without it.
"""
import json
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from typing import Optional

from hvdlite.discovery.script import DiscoveryError
from hvdlite.errors import first_line

# NodeDeathInfo.Reason in Ray's protocol: 1 EXPECTED_TERMINATION, 3 AUTOSCALER_DRAIN_PREEMPTED,
# 4 AUTOSCALER_DRAIN_IDLE are a node taken away on purpose; 2 UNEXPECTED_TERMINATION and 0
# (unspecified) are failures.
GRACEFUL = {1, 3, 4}
GCS_CHECK = 5.0  # seconds to connect to the cluster's GCS before ray.init is tried
AUTOSCALE_POLL = 1.0  # seconds between reads of the nodes while a static job waits for its slots


@dataclass(frozen=True)
class SlotShape:
    """What one slot takes of a node: CPUs and GPUs, or one unit of a named resource."""
    cpus: float = 1.0
    gpus: float = 0.0
    resource: Optional[str] = None

    def slots(self, resources: dict) -> int:
        if self.resource:
            return int(resources.get(self.resource, 0))
        counts = [resources.get("CPU", 0) / self.cpus] if self.cpus else []
        if self.gpus:
            counts.append(resources.get("GPU", 0) / self.gpus)
        return int(min(counts)) if counts else 0

    def bundle(self) -> dict:
        """The resources one slot's actor asks Ray for."""
        if self.resource:
            return {self.resource: 1}
        return {k: v for k, v in (("CPU", self.cpus), ("GPU", self.gpus)) if v}


class Hosts(list):
    """[(NodeID, slots)], with the NodeIDs of nodes that left: `drained`, `failed`."""
    drained = ()
    failed = ()


def listing(nodes, shape: SlotShape, draining=frozenset()) -> Hosts:
    """The hosts of a `ray.nodes()` answer: alive nodes with slots, in address order; nodes
    being drained (`draining`: NodeIDs) are no longer offered."""
    alive = sorted((n for n in nodes if n.get("Alive")),
                   key=lambda n: (n.get("NodeManagerAddress", ""), n["NodeID"]))
    hosts = Hosts((n["NodeID"], shape.slots(n.get("Resources", {}))) for n in alive
                  if n["NodeID"] not in draining)
    hosts[:] = [(h, s) for h, s in hosts if s > 0]
    dead = [n for n in nodes if not n.get("Alive")]
    hosts.drained = tuple(sorted({n["NodeID"] for n in dead if n.get("DeathReason") in GRACEFUL}
                                 | set(draining)))
    hosts.failed = tuple(sorted(n["NodeID"] for n in dead if n.get("DeathReason") not in GRACEFUL))
    return hosts


def import_ray():
    try:
        import ray
    except ImportError:
        raise DiscoveryError("--ray needs the ray package: pip install 'hvdlite[ray]'") from None
    return ray


def connect(address: Optional[str]):
    """The ray module, this process connected to the cluster at `address` ("auto", HOST:PORT,
    or None: $RAY_ADDRESS, else the cluster started on this machine)."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # else a stale token file may turn auth on
    where = address or os.environ.get("RAY_ADDRESS") or "auto"
    gcs = gcs_address(where)
    # ray.init puts Ray's native handlers on SIGTERM and SIGINT (a stack dump, then death by
    # the signal): the job's own handlers, which stop the workers and exit 143/130, come back.
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        ray.init(address=gcs, logging_level="ERROR", log_to_driver=False, namespace="hvdlite")
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise DiscoveryError(f"no Ray cluster at {where}: {first_line(e)}") from None
    finally:
        if threading.current_thread() is threading.main_thread():
            for sig, handler in handlers.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    return ray


def gcs_address(where: str) -> str:
    """HOST:PORT of the cluster's GCS, checked to accept connections: ray.init would retry an
    address where nothing listens for minutes."""
    from ray._private.services import canonicalize_bootstrap_address
    try:
        gcs = canonicalize_bootstrap_address(where)
    except (ConnectionError, ValueError) as e:
        raise DiscoveryError(f"no Ray cluster at {where}: {first_line(e)}") from None
    if gcs is None:
        raise DiscoveryError(f"no Ray cluster at {where}: none runs on this machine "
                             f"(start one with `ray start --head`, or give --ray-address HOST:PORT)")
    host, port = gcs.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=GCS_CHECK).close()
    except OSError as e:
        raise DiscoveryError(f"no Ray cluster at {where}: cannot connect to {gcs}: "
                             f"{e.strerror or type(e).__name__}") from None
    return gcs


def draining_nodes(ray) -> frozenset:
    """NodeIDs Ray is draining: alive, but going away once idle or at their deadline."""
    try:
        return frozenset(ray._private.state.state.get_draining_nodes())
    except Exception:  # noqa: BLE001 - an internal of Ray 2.60: else a drain shows on death
        return frozenset()


class RayNodes:
    """The host source of `hvdlite run --ray`; polled, since nodes come and go."""
    changes = True

    def __init__(self, address, shape: SlotShape, need: int = 1, request: Optional[int] = None,
                 wait: float = 0.0):
        """`need` slots at least; `request`: the slots asked of an autoscaler (--max-np, or a
        static job's -np); `wait`: seconds a static job waits for an autoscaler to add `need`."""
        self.address, self.shape, self.need, self.request, self.wait = address, shape, need, request, wait
        self.ray = None
        self.known = set()  # NodeIDs this job saw offered: only their departures are news

    def read(self) -> Hosts:
        first = self.ray is None
        if first:
            self.ray = connect(self.address)
            if self.request:  # an autoscaler grows the cluster toward the job; none ignores it
                from ray.autoscaler.sdk import request_resources
                request_resources(bundles=[self.shape.bundle()] * self.request)
        hosts = self._hosts()
        if first and _slots(hosts) < self.need:
            if not autoscaler(self.ray):
                raise DiscoveryError(f"{self._short(hosts)}, and no autoscaler to add nodes")
            # A static job runs exactly its ranks: it waits for the autoscaler's nodes.
            deadline = time.monotonic() + self.wait
            while _slots(hosts) < self.need and self.wait:
                if time.monotonic() > deadline:
                    raise DiscoveryError(f"{self._short(hosts)}, {self.wait:g} s (--start-timeout) "
                                         f"after asking its autoscaler for them")
                time.sleep(AUTOSCALE_POLL)
                hosts = self._hosts()
        return hosts

    def _hosts(self) -> Hosts:
        hosts = listing(self.ray.nodes(), self.shape, draining_nodes(self.ray))
        hosts.drained = tuple(h for h in hosts.drained if h in self.known)
        hosts.failed = tuple(h for h in hosts.failed if h in self.known)
        self.known.update(h for h, _ in hosts)
        return hosts

    def _short(self, hosts) -> str:
        return (f"the Ray cluster has {_slots(hosts)} slots of {self.describe_shape()}, "
                f"fewer than the {self.need} the job needs")

    def describe_shape(self) -> str:
        return " + ".join(f"{v:g} {k}" for k, v in self.shape.bundle().items())

    def describe(self) -> str:
        return f"hosts: the nodes of the Ray cluster at {self.address or 'auto'}, one slot per " \
               f"{self.describe_shape()}"


def _slots(hosts) -> int:
    return sum(n for _, n in hosts)


def autoscaler(ray) -> bool:
    """Whether an autoscaler that can add nodes watches the cluster."""
    try:
        from ray.experimental.internal_kv import _internal_kv_get
        config = ray._private.state.state.get_cluster_config()
        status = json.loads(_internal_kv_get("__autoscaling_status") or b"{}")
    except Exception:  # noqa: BLE001 - no readable status: no autoscaler
        return False
    return can_add_nodes(config, status)


def can_add_nodes(cluster_config, status: dict) -> bool:
    """An autoscaler with a cluster config (v2, KubeRay), or a v1 one whose node types are its
    own: `ray start` alone runs a read-only monitor that names each node's type `node_<NodeID>`."""
    if cluster_config is not None:
        return True
    types = (status.get("autoscaler_report") or {}).get("node_type_mapping") or {}
    return any(kind != f"node_{node}" for node, kind in types.items())
