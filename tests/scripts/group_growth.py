"""Prints how many bytes of malloc'd memory each torch gloo group made through
hvdlite.torch.gloo.connect (with one allreduce, then dropped) leaves in use, over 120 groups
after 30 to warm up. Run in a fresh interpreter: torch sizes its flight recorder once."""
import ctypes

import torch

from hvdlite.driver.kv.server import KVServer
from hvdlite.torch import gloo
from hvdlite.worker.kvclient import KVClient


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def in_use() -> int:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    return libc.mallinfo2().uordblks


server = KVServer("s3cret")
server.start()


class Session:
    """What gloo.connect reads of a worker's session."""
    client, environ = KVClient(*server.address, "s3cret", timeout=5.0), {}

    def local_address(self, rank):
        return "127.0.0.1"


gloo.session = Session
one = torch.ones(1)
for n in range(150):
    if n == 30:
        start = in_use()
    group = gloo.connect(f"group.{n}", 0, 1)
    group.allreduce([one]).wait()
    del group
    server.delete_scope(f"group.{n}")
print((in_use() - start) // 120)
server.stop()
