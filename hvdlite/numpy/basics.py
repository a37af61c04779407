"""init / shutdown and the rank queries of the numpy face, on a pygloo context."""
import atexit
import os

import numpy as np
import pygloo

from hvdlite import defaults
from hvdlite.numpy import ops
from hvdlite.numpy.context import runtime
from hvdlite.numpy.store import GlooStore
from hvdlite.worker import elastic, env, sockets, trace, vouch
from hvdlite.worker.links import EXIT_WAIT, Links
from hvdlite.worker.scopestore import ScopeStore
from hvdlite.worker.session import session
from hvdlite.worker.world import WorldInfo

_links = Links(broken_how=sockets.PYGLOO_BROKEN_CUT)  # the current context's gloo connections
_voucher = None  # the helper that stands in for this worker while a collective holds the GIL


def init() -> None:
    """Join the world this worker is assigned to at launch (recording the collectives when
    the job was started with --timeline-filename)."""
    if os.environ.get(env.TIMELINE) and trace.recorder() is None:
        trace.start_timeline(os.environ[env.TIMELINE])
    if not runtime.is_initialized():
        join()


def start_timeline(file_path, mark_cycles=False) -> None:
    """Record the collectives (named by their name= where given) in a Chrome trace that
    stop_timeline() writes at rank 0's `file_path`, as hvdlite.torch's."""
    runtime.info()  # raises before init()
    trace.start_timeline(file_path)


def stop_timeline() -> None:
    trace.stop_timeline(runtime.info().rank)


def join(after_round=None, commit=0) -> None:
    """Join the next world the driver assigns this worker (see Links.join)."""
    global _voucher
    s = session()
    if _voucher is None:
        _voucher = vouch.Voucher(s.environ, lambda: s.client.offset)
    # pygloo holds the GIL while it connects, so no thread here can give up on a round that
    # breaks meanwhile: the voucher, a process of its own, can (see _context).
    info, context = _links.join(s, _context, after_round, commit)
    _voucher.watch(*_links.current())
    runtime.activate(context, info, elastic.entry_check(_count, info.size) if s.elastic else None)


def _count(flag: int) -> int:
    return int(ops.allreduce(np.array([flag], dtype=np.int32), op=ops.Sum)[0])


def _context(info: WorldInfo, abandoned, seen):
    s = session()
    kv = ScopeStore(s.client, info.store_scope, abandoned, peers=info.size, seen=seen)
    # Once gloo published this rank's addresses, its pairs listen there: the voucher learns
    # which sockets those are, to knock on them should the round break before they connect.
    store = GlooStore(kv, float(s.environ.get(env.START_TIMEOUT, defaults.START_TIMEOUT)),
                      published=lambda: _voucher.listening(info.round, sockets.published_listeners(seen)))
    context = pygloo.rendezvous.Context(info.rank, info.size)
    device = pygloo.transport.tcp.CreateDevice(pygloo.transport.tcp.attr(s.local_address(info.rank)))
    context.connectFullMesh(pygloo.rendezvous.CustomStore(store), device)
    return context


abort = _links.cut  # fail every pending and future collective of the context, here and on peers


def shutdown() -> None:
    """Leave the current world (after a failure, call abort() first). pygloo collectives are
    synchronous, so nothing is pending and the context can simply be dropped."""
    _links.forget()
    if _voucher is not None:
        _voucher.release()
    runtime.deactivate()


def _at_exit() -> None:
    # Close the connections before the interpreter tears down, and wait for connects given
    # up that gloo still runs: such a thread returning into pygloo while the interpreter
    # finalizes crashed the process (SIGSEGV), so a finished worker would look failed.
    shutdown()
    _links.finish_given_up(EXIT_WAIT)


atexit.register(_at_exit)


is_initialized = runtime.is_initialized
rank, size, local_rank, local_size, cross_rank, cross_size = (runtime.query(field) for field in (
    "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size"))
